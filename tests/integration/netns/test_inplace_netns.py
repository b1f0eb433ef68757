"""``--recovery in-place`` (torchft) on the netns testbed: real sshd, one replica group
per host (torchrun over SSH), a real Lighthouse child on the coordinator.

Each test runs examples/train_ft.py on tb1..tb3, injects one fault once the three
groups train together, and asserts on what the job printed and kept (never on how
long anything took): a lost host costs its group only and the survivors train on
in the same attempt; a lost Lighthouse falls back to the restart path from the
disk checkpoint. No process of the job is left on any host.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest

from corral.testbed import Testbed
from tests.conftest import require, require_torch

from ..conftest import REPO, job_processes
from .test_faults import (
    Watched,
    assert_nothing_left,
    host_processes,
    run_args,
    with_suppress_kill,
)

pytestmark = pytest.mark.netns
require_torch()

EXAMPLE = str(REPO / "examples" / "train_ft.py")
STEPS = 60
SLEEP = "0.2"  # seconds per step: the job is still training when the fault lands
FAULT_AT = 10  # the fault follows the first step all three groups took at or past this
STEP = re.compile(r"\[(?P<host>tb\d):0\] step (?P<step>\d+)/\d+ participants (?P<p>\d+)")


def start_inplace(
    tb: Testbed, tmp_path: Path, job: str, *extra: str, script: tuple[str, ...] = ()
) -> Watched:
    """``corral run --recovery in-place`` of the example on the three hosts; returns
    once every group has committed a step with all three taking part (at FAULT_AT or
    later), so a fault injected next hits a full quorum mid-run."""
    require("torchft", "install the [ft] extra: make setup")
    w = Watched(
        [
            *run_args(tb, tmp_path, job, "--recovery", "in-place", *extra),
            *("--", EXAMPLE, "--steps", str(STEPS), "--step-sleep", SLEEP, *script),
        ],
        tmp_path,
    )
    for host in ("tb1", "tb2", "tb3"):
        w.wait_for(rf"\[{host}:0\] step (1\d|[2-9]\d)/{STEPS} participants 3", timeout=300)
    return w


def steps_of(w: Watched, after: float = 0.0) -> list[tuple[str, int, int]]:
    """``(host, step, participants)`` of every committed step line that arrived after
    ``after`` (the monotonic time a fault was injected)."""
    found = []
    for when, line in list(w.lines["out"]):
        m = STEP.search(line)
        if m and when > after:
            found.append((m["host"], int(m["step"]), int(m["p"])))
    return found


def attempts(tmp_path: Path, job: str) -> list[str]:
    saved = json.loads((tmp_path / "runs" / job / "attempts.json").read_text())
    return [a["state"] for a in saved]


def test_lost_host_costs_its_group_only(healthy_testbed: Testbed, tmp_path: Path) -> None:
    tb, job = healthy_testbed, "ip-host"
    w = start_inplace(tb, tmp_path, job)
    at_fault = max(s for h, s, _ in steps_of(w) if h == "tb1")
    tb.kill_sshd("tb3")
    killed_at = time.monotonic()
    for pid in host_processes(tb, "tb3", job):
        with_suppress_kill(pid)
    code = w.finish()
    out, err = w.text("out"), w.text("err")
    assert code == 0, (out + err)[-4000:]
    assert re.search(r"in-place recovery tears down only group 2 \(tb3\); 2 group\(s\) go on", err)
    assert "tb3 does not answer and no spare host is left: 2 group(s) go on without it" in err
    # the survivors trained on past the fault, two of them in the quorum, to the end
    later = steps_of(w, killed_at)
    for host in ("tb1", "tb2"):
        mine = [(s, p) for h, s, p in later if h == host]
        assert any(p == 2 and s > at_fault for s, p in mine), out[-4000:]
        assert mine[-1][0] == STEPS, out[-4000:]
        assert f"[{host}:0] done at step {STEPS}" in out
    assert not [h for h, _, _ in later if h == "tb3"]
    assert attempts(tmp_path, job) == ["succeeded"]  # the survivors were never restarted
    assert_nothing_left(tb, job)


def test_lost_lighthouse_falls_back_to_a_restart_from_disk(
    healthy_testbed: Testbed, tmp_path: Path
) -> None:
    tb, job = healthy_testbed, "ip-lighthouse"
    ckpt = tmp_path / "ckpt"  # seen by every host at this path
    w = start_inplace(
        tb,
        tmp_path,
        job,
        *("--max-restarts", "1", "--checkpoint-dir", str(ckpt)),
        script=("--checkpoint-every", "5"),
    )
    # the Lighthouse is the coordinator's child, marked as the job's own process
    (lighthouse,) = [
        p for p in job_processes(job) if "corral.recovery.lighthouse" in " ".join(p.cmdline())
    ]
    lighthouse.send_signal(signal.SIGKILL)
    code = w.finish()
    out, err = w.text("out"), w.text("err")
    assert code == 0, (out + err)[-4000:]
    assert re.search(
        r"torchft's Lighthouse exited \(code -9\): falling back to a restart of every node "
        r"from the disk checkpoint",
        err,
    ), err[-4000:]
    assert attempts(tmp_path, job) == ["failed", "succeeded"]
    resumed = [int(s) for s in re.findall(r"\[tb\d:0\] resumed at step (\d+)", out)]
    assert resumed and all(s > 0 and s % 5 == 0 for s in resumed), out[-4000:]
    for host in ("tb1", "tb2", "tb3"):
        assert f"[{host}:0] done at step {STEPS}" in out
    assert sorted(int(p.name[5:13]) for p in ckpt.glob("ckpt-*.pt"))[-1] == STEPS
    assert_nothing_left(tb, job)


def test_cut_link_costs_its_group_only(healthy_testbed: Testbed, tmp_path: Path) -> None:
    # tb3 stays up but unreachable: the coordinator declares it lost on missed
    # heartbeats, cannot reach it to restart its group, and the survivors go on; tb3's
    # agent tears its own ranks down once the coordinator's heartbeats stop
    tb, job = healthy_testbed, "ip-link"
    w = start_inplace(tb, tmp_path, job, "--host-timeout", "6")
    at_fault = max(s for h, s, _ in steps_of(w) if h == "tb1")
    tb.cut_link("tb3")
    cut_at = time.monotonic()
    try:
        # the survivors may finish before corral gives up on reaching tb3 again (then
        # there is no "go on without it" line): keep the link cut until the job ends
        code = w.finish()
    finally:
        tb.restore_link("tb3")
    out, err = w.text("out"), w.text("err")
    assert code == 0, (out + err)[-4000:]
    assert re.search(r"lost host tb3: no (heartbeat|keepalive)", err), err[-4000:]
    assert re.search(r"tears down only group 2 \(tb3\); 2 group\(s\) go on", err)
    later = steps_of(w, cut_at)
    for host in ("tb1", "tb2"):
        mine = [(s, p) for h, s, p in later if h == host]
        assert any(p == 2 and s > at_fault for s, p in mine), out[-4000:]
        assert f"[{host}:0] done at step {STEPS}" in out
    assert attempts(tmp_path, job) == ["succeeded"]
    assert_nothing_left(tb, job)
