"""Semi-synchronous training through corral (issue 33 item 4): ``sdk.fault_tolerant(...,
sync="diloco"|"localsgd", every=H)`` on ``local:2 --recovery in-place`` (one rank per
group, ``--launcher python``, torchft over gloo, a real Lighthouse): the groups sync
every H steps, H chosen by corral when not given, and a SIGKILLed group heals from
its peer at a sync like in the per-step mode."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import REPO, run_corral, wait_no_job_processes

pytestmark = pytest.mark.torch  # the ranks import torch (checked before each test)

SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "ft_diloco.py")
SYNC = re.compile(r"\[local-(\d):0\] group \d sync (\d+) at step (\d+) every (\d+) participants")
FINAL = re.compile(r"\[local-(\d):0\] group \d (final .*)")


def _run(tmp_path: Path, job: str, *script: str) -> str:
    result = run_corral(
        *("run", "--hosts", "local:2", "--recovery", "in-place", "--launcher", "python"),
        *("--no-preflight", "--master-port", "0", "--run-dir", str(tmp_path / "runs")),
        *("--job-id", job, "--grace", "3"),
        *("--env", "OMP_NUM_THREADS=1"),  # no idle OpenMP workers spinning between steps
        *("--", SCRIPT, *script),
        cwd=tmp_path,
        timeout=400,
    )
    err = result.stderr + result.stdout
    assert result.returncode == 0, err[-4000:]
    assert wait_no_job_processes(job, within=15) == []
    return err


def _syncs(err: str, host: str) -> list[tuple[int, int, int]]:
    """``(sync, step, every)`` of each committed sync that host printed."""
    return [(int(k), int(s), int(e)) for h, k, s, e in SYNC.findall(err) if h == host]


def test_diloco_chooses_h_syncs_every_h_steps_and_a_killed_group_heals(tmp_path: Path) -> None:
    err = _run(tmp_path, "diloco1", "--syncs", "6", "--kill-group", "1", "--kill-at", "4")
    chosen = re.findall(r"\[local-0:0\] corral: diloco syncs every (\d+) steps", err)
    assert len(chosen) == 1, err[-4000:]
    h = int(chosen[0])
    syncs = _syncs(err, "0")
    assert len(syncs) >= 6
    # every committed sync covers the interval in force (``every`` is the next one's):
    # 4 steps while measuring, H after
    previous_sync, previous_step, interval = 0, 0, 4
    for sync, step, every in syncs:
        assert every in (4, h)
        assert step - previous_step == interval * (sync - previous_sync), syncs
        previous_sync, previous_step, interval = sync, step, every
    assert syncs[-1][2] == h
    # the lost group: torn down alone, restarted, healed from the survivor at a sync
    assert "rank 0 on local-1 killed by SIGKILL: in-place recovery tears down only group 1" in err
    assert re.search(r"\[local-1:0\] \[torchft\].*healing required.*max_step=\d+", err)
    assert re.search(r"group 1 \(local-1\) rejoined at step \d+", err)
    attempts = json.loads((tmp_path / "runs" / "diloco1" / "attempts.json").read_text())
    assert [a["state"] for a in attempts] == ["succeeded"]
    # after the last sync both hold the same weights, schedule, H and LR scheduler
    final = dict(FINAL.findall(err))
    assert set(final) == {"0", "1"} and final["0"] == final["1"], final
    assert f"every {h} " in final["0"]
    assert "StateMismatch" not in err


def test_localsgd_with_a_given_h_averages_every_h_steps(tmp_path: Path) -> None:
    err = _run(tmp_path, "localsgd1", "--sync", "localsgd", "--every", "3", "--syncs", "4")
    assert "syncs every" not in err  # H was given: nothing measured
    syncs = {host: _syncs(err, host) for host in ("0", "1")}
    # a group that starts late joins (heals) at a sync of the other's: as many steps
    assert max(len(s) for s in syncs.values()) >= 4 and all(syncs.values()), syncs
    for sync, step, every in syncs["0"] + syncs["1"]:
        assert step == 3 * sync and every == 3, syncs
    final = dict(FINAL.findall(err))
    assert set(final) == {"0", "1"} and final["0"] == final["1"], final
