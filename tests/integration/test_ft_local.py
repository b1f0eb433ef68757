"""In-place recovery with torchft, by hand: a Lighthouse and two replica groups
(one plain ``python`` rank each, whose SDK hosts the group's store: a torchrun per
group would import torch once more) running examples/train_ft.py over gloo. One
group is SIGKILLed mid-run: the survivor goes on alone; started again, the lost
group heals from the live peer and both finish at the same step. (Two groups, the
fewest that show it: each is a process importing torch.)"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from corral.contract import LIGHTHOUSE_ENV, REPLICA_GROUP_ENV, REPLICA_GROUPS_ENV
from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ft.py"
STEPS = 60
GROUPS = 2
STEP_LINE = re.compile(r"^step (\d+)/\d+ participants (\d+)", re.M)

pytestmark = [pytest.mark.torch, pytest.mark.slow]


class Group:
    """One replica group: one rank in its own session, output to a file."""

    def __init__(self, group: int, lighthouse: str, log: Path) -> None:
        env = dict(
            os.environ,
            PYTHONPATH=str(REPO / "src"),
            PYTHONUNBUFFERED="1",
            RUST_LOG="warn",  # torchft's per-step INFO lines
            # one intra-op thread: between a small model's steps torch's idle OpenMP
            # workers spin, most of a step's CPU on a shared machine
            OMP_NUM_THREADS="1",
            MASTER_ADDR="127.0.0.1",  # what the other groups dial to heal from this one
            **{
                LIGHTHOUSE_ENV: lighthouse,
                REPLICA_GROUP_ENV: str(group),
                REPLICA_GROUPS_ENV: str(GROUPS),
            },
        )
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
            env.pop(name, None)  # a group of one rank, not this process's launcher's
        argv = [
            sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--step-sleep", "0.05",
            "--degraded-step-sleep", "0.5", "--batch-size", "48", "--examples", "512",
        ]  # fmt: skip
        self.log = log
        self._fh = open(log, "w")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self._fh, stderr=subprocess.STDOUT, start_new_session=True
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def steps(self) -> list[tuple[int, int]]:
        return [(int(s), int(p)) for s, p in STEP_LINE.findall(self.text())]

    def kill(self) -> None:
        """SIGKILL the rank and anything it started."""
        try:
            tree = [psutil.Process(self.proc.pid)]
            tree += tree[0].children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(tree, timeout=30)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill()
        self._fh.close()


def _wait(what: str, check: object, groups: list[Group], within: float = 180) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        if any(g.proc.poll() not in (None, 0) for g in groups):
            break
        time.sleep(0.2)
    logs = "\n".join(f"--- {g.log.name}\n{g.text()[-3000:]}" for g in groups)
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def test_survivors_go_on_and_the_lost_group_heals_from_a_peer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUST_LOG", "warn")  # the in-process Lighthouse's per-quorum lines
    require("torchft", "install the [ft] extra: make setup")
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(
        bind="[::]:0", min_replicas=1, join_timeout_ms=2000, heartbeat_timeout_ms=1000
    )
    groups = [Group(g, lighthouse.address(), tmp_path / f"group{g}.log") for g in range(GROUPS)]
    everyone = list(groups)
    survivor, victim = groups
    try:
        _wait("both in a quorum", lambda: any(p == 2 for _, p in victim.steps()), everyone)
        _wait("step 5 on group 1", lambda: victim.steps()[-1][0] >= 5, everyone)
        victim.kill()
        killed_at = victim.steps()[-1][0]
        _wait(
            "the survivor's steps alone",
            lambda: any(p == 1 and s > killed_at for s, p in survivor.steps()),
            everyone,
        )
        back = Group(1, lighthouse.address(), tmp_path / "group1-again.log")
        everyone.append(back)
        for g in (survivor, back):
            assert g.proc.wait(timeout=240) == 0, g.text()[-3000:]
        # the survivor went on past the kill alone, then trained with both again
        steps = survivor.steps()
        degraded = [s for s, p in steps if p == 1 and s > killed_at]
        assert degraded, survivor.text()[-3000:]
        assert any(p == 2 for s, p in steps if s > degraded[-1])
        assert f"done at step {STEPS}" in survivor.text()
        # the restarted group healed from the live peer at a step past the kill
        heal = re.search(r"healing required.*max_step=(\d+)", back.text())
        assert heal is not None and int(heal.group(1)) > killed_at, back.text()[-3000:]
        assert "peers need recovery from us" in survivor.text()
        assert any(p == 2 for _, p in back.steps())
        assert max(p for g in everyone for _, p in g.steps()) == 2  # the killed group is gone
        assert f"done at step {STEPS}" in back.text()
    finally:
        for g in everyone:
            g.stop()
        lighthouse.shutdown()
