"""``--recovery in-place`` on ``local:3`` and ``local:2`` (real torchrun or python-launcher
groups, torchft over gloo, a real Lighthouse child): a SIGKILLed rank costs its group
only."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from .conftest import REPO, run_corral, wait_no_job_processes

pytestmark = pytest.mark.torch

SCRIPT = str(REPO / "tests" / "integration" / "scripts" / "ft_steps.py")
NO_FT = str(REPO / "tests" / "integration" / "scripts" / "steps.py")  # never makes a Manager
TORCHFT_WAY = str(REPO / "tests" / "integration" / "scripts" / "torchft_env.py")
# steps 0.2 s apart: while a group is away the others wait in sleep, not in steps;
# 30 of them (about 1-2 ms of CPU each, one thread): a group that starts seconds after
# the others still joins before they end, so its failure comes with steps left
SLOW = ("--sleep", "0.2")
STEPS = "30"
# one intra-op thread per rank: between a tiny model's steps torch's idle OpenMP
# workers spin, most of a step's CPU on a shared machine (torchrun's own default
# for more than one rank per node)
ONE_THREAD = ("--env", "OMP_NUM_THREADS=1")


def _in_place(
    tmp_path: Path,
    job: str,
    *script: str,
    options: tuple[str, ...] = (),
    script_path: str = SCRIPT,
    hosts: str = "local:3",
) -> str:
    """Run ft_steps.py (or ``script_path``) in place on ``hosts``, one intra-op
    thread per rank; corral's output (exit 0 asserted)."""
    result = run_corral(
        "run",
        "--hosts",
        hosts,
        "--recovery",
        "in-place",
        "--no-preflight",
        "--master-port",
        "0",
        "--run-dir",
        str(tmp_path / "runs"),
        "--job-id",
        job,
        "--grace",
        "3",
        *ONE_THREAD,
        *options,
        "--",
        script_path,
        *script,
        cwd=tmp_path,
        timeout=400,
    )
    err = result.stderr + result.stdout
    assert result.returncode == 0, err[-4000:]
    return err


def test_a_script_written_for_torchft_reads_its_own_group(tmp_path: Path) -> None:
    # torchft's examples read REPLICA_GROUP_ID / NUM_REPLICA_GROUPS / TORCHFT_LIGHTHOUSE;
    # with only corral's own names every group read "group 0 of 2" and trained on
    # the same shard (issue 33 item 8)
    err = _in_place(
        tmp_path, "inplaceenv", options=("--launcher", "python"), script_path=TORCHFT_WAY
    )
    for group, shard in ((0, "[0, 3, 6, 9]"), (1, "[1, 4, 7, 10]"), (2, "[2, 5, 8, 11]")):
        assert f"[local-{group}:0] torchft env: group {group} of 3, lighthouse http" in err
        assert f"shard {shard}" in err
    assert wait_no_job_processes("inplaceenv", within=15) == []


def test_the_preflight_names_timeouts_that_would_turn_a_lost_node_into_a_hang(
    tmp_path: Path,
) -> None:
    # issue 33 item 2: --hang-timeout 30 is below the survivors' stall torchft bounds
    # itself (process group 30 s + quorum 60 s): a warning naming the value needed
    result = run_corral(
        *("run", "--hosts", "local:2", "--recovery", "in-place", "--launcher", "python"),
        *("--hang-timeout", "30", "--master-port", "0", "--run-dir", str(tmp_path / "runs")),
        *("--job-id", "inplacetimeouts", "--", TORCHFT_WAY),
        cwd=tmp_path,
        timeout=300,
    )
    err = result.stderr + result.stdout
    assert result.returncode == 0, err[-4000:]  # a warning never blocks the launch
    assert "! timeouts: --hang-timeout (30 s) is not above the process-group timeout" in err
    assert "fix: raise --hang-timeout to >= 91" in err


def test_a_killed_rank_costs_its_group_only_and_it_heals_back(tmp_path: Path) -> None:
    # torchrun groups here (the in-place case under torchrun), on 2 nodes (a torchrun
    # per group imports torch again); the hung and twice-killed cases below keep 3
    # groups, 2 of them training on together, under the python launcher
    err = _in_place(
        tmp_path,
        "inplace1",
        *("--steps", STEPS, "--kill-group", "1", "--kill-at", "5"),
        *SLOW,
        hosts="local:2",
    )
    assert "rank 0 on local-1 killed by SIGKILL: in-place recovery tears down only group 1" in err
    assert "group 1: restarting its group on local-1" in err
    # the restarted group healed from the live peer (torchft's own line, shown at its
    # default warning level) and trained on
    assert re.search(r"\[local-1:0\] \[torchft\].*healing required.*max_step=\d+", err)
    assert re.search(r"group 1 \(local-1\) rejoined at step \d+, healed from local-0", err)
    assert re.search(
        r"in place: node local-1 lost at step \d+, rejoined at step \d+ healed from "
        r"local-0; 0 steps redone",
        err,
    )
    # the survivor never stopped: one attempt, its group never restarted
    job = tmp_path / "runs" / "inplace1"
    attempts = json.loads((job / "attempts.json").read_text())
    assert [a["state"] for a in attempts] == ["succeeded"]
    saved = json.loads((job / "result.json").read_text())
    assert [n["host"] for n in saved["nodes"]] == ["local-0", "local-1", "local-1"]
    assert saved["groups"][0]["steps_redone"] == 0
    for group in (0, 1):
        assert f"group {group} done at step" in err
    assert wait_no_job_processes("inplace1", within=15) == []


def test_a_script_without_a_torchft_manager_is_named_after_the_join_timeout(
    tmp_path: Path,
) -> None:
    # steps.py prints forever and never creates a torchft Manager: without the join
    # timeout this job would hang until killed
    result = run_corral(
        "run",
        "--hosts",
        "local:2",
        "--recovery",
        "in-place",
        "--no-preflight",
        "--master-port",
        "0",
        "--run-dir",
        str(tmp_path / "runs"),
        "--job-id",
        "inplacejoin",
        "--grace",
        "2",
        "--rdzv-timeout",
        "8",
        "--max-restarts",
        "2",
        "--launcher",  # steps.py imports no torch; torchrun would import it per node
        "python",
        "--",
        NO_FT,
        cwd=tmp_path,
        timeout=300,
    )
    err = result.stderr + result.stdout
    assert result.returncode == 3, err[-4000:]  # could not start: no restart would help
    assert (
        "group 0 (local-0), group 1 (local-1) never joined torchft's quorum within 8 s "
        "(--rdzv-timeout)" in err
    )
    assert "call sdk.fault_tolerant(...) (or create a torchft Manager) in the script" in err
    assert "Traceback" not in err
    attempts = json.loads((tmp_path / "runs" / "inplacejoin" / "attempts.json").read_text())
    assert len(attempts) == 1  # --max-restarts 2, but a restart would fail the same way
    assert wait_no_job_processes("inplacejoin", within=15) == []


def test_the_lighthouse_lists_the_managers_that_heartbeat() -> None:
    import asyncio
    import sys
    from datetime import timedelta

    from corral.recovery.lighthouse import Lighthouse

    async def main() -> tuple[set[str] | None, set[str] | None]:
        lighthouse = await Lighthouse.start(sys.executable, "127.0.0.1", 1)
        try:
            before = await lighthouse.members()
            from torchft.coordination import LighthouseClient

            client = LighthouseClient(lighthouse.url, connect_timeout=timedelta(seconds=10))
            client.heartbeat("corral_1:5c1d")
            return before, await lighthouse.members()
        finally:
            await lighthouse.close()

    before, after = asyncio.run(main())
    assert before == set() and after == {"corral_1:5c1d"}


def test_a_hung_group_is_torn_down_alone_and_heals_back(tmp_path: Path) -> None:
    err = _in_place(
        tmp_path,
        "inplacehang",
        *("--steps", STEPS, "--hang-group", "1", "--hang-at", "5"),
        *SLOW,
        # above the Lighthouse's 10 s join timeout: the others wait that long for the
        # hung group (its Manager still heartbeats), then train on without it
        options=("--hang-timeout", "14", "--launcher", "python"),
    )
    assert re.search(r"hang detected: rank 0 on local-1 made no progress for \d+ s", err)
    assert "rank 0 on local-1 is stuck in hang_forever" in err
    assert re.search(r"in-place recovery tears down only group 1 \(local-1\); 2 group", err)
    assert "group 1: restarting its group on local-1" in err
    # the others trained on while group 1 hung, past its last step, then healed it
    mine = [int(s) for s in re.findall(r"\[local-1:0\] group 1 step (\d+) participants", err)]
    # its steps in order: 1, 2, ... up to the hang, then the healed group's (a jump)
    hung = next(a for a, b in itertools.pairwise(mine) if b != a + 1)
    for group in (0, 2):
        assert re.search(rf"group {group} step (\d+) participants 2", err)
    later = [int(s) for s in re.findall(r"group [02] step (\d+) participants 2", err)]
    assert max(later) > hung
    assert re.search(r"group 1 \(local-1\) rejoined at step \d+, healed from local-[02]", err)
    assert re.search(r"in place: node local-1 lost at step \d+, rejoined at step \d+", err)
    job = tmp_path / "runs" / "inplacehang"
    attempts = json.loads((job / "attempts.json").read_text())
    assert [a["state"] for a in attempts] == ["succeeded"]
    saved = json.loads((job / "result.json").read_text())
    assert [n["host"] for n in saved["nodes"]] == ["local-0", "local-1", "local-2", "local-1"]
    assert saved["groups"][0]["steps_redone"] == 0
    final = {int(s) for s in re.findall(r"group \d done at step (\d+)", err)}
    assert len(final) == 1 and err.count("done at step") == 3
    assert wait_no_job_processes("inplacehang", within=15) == []


def test_second_failures_while_a_group_heals_still_end_in_one_attempt(tmp_path: Path) -> None:
    # group 2 is killed at step 8; group 0 is killed while group 2 is away; group 2's
    # restart is killed again in the middle of healing (in its load_state_dict)
    err = _in_place(
        tmp_path,
        "inplacetwice",
        *("--steps", STEPS, "--kill-group", "2", "--kill-at", "5"),
        *("--kill-healing", "--kill-while-away", "0"),
        *SLOW,
        options=("--launcher", "python"),
    )
    assert "group 0 is about to be killed while another group is away" in err
    assert "group 2 is about to be killed while healing" in err
    assert err.count("in-place recovery tears down only group 2 (local-2)") == 2
    assert err.count("in-place recovery tears down only group 0 (local-0)") == 1
    for group, host in ((0, "local-0"), (2, "local-2")):
        assert re.search(rf"group {group} \({host}\) rejoined at step \d+, healed from", err)
    assert "node local-2 lost at step" in err and "lost again before it rejoined" in err
    job = tmp_path / "runs" / "inplacetwice"
    attempts = json.loads((job / "attempts.json").read_text())
    assert [a["state"] for a in attempts] == ["succeeded"]
    saved = json.loads((job / "result.json").read_text())
    hosts = [n["host"] for n in saved["nodes"]]
    assert hosts.count("local-1") == 1  # the one group never touched ran throughout
    assert hosts.count("local-0") == 2 and hosts.count("local-2") == 3
    assert all(g["steps_redone"] in (0, None) for g in saved["groups"])
    final = {int(s) for s in re.findall(r"group \d done at step (\d+)", err)}
    assert len(final) == 1 and err.count("done at step") == 3
    assert wait_no_job_processes("inplacetwice", within=15) == []


def test_a_killed_lighthouse_is_restarted_and_the_groups_train_on(tmp_path: Path) -> None:
    # issue 33 item 3: the groups reconnect to the Lighthouse corral starts again at the
    # same address (torchft's quorum retries): same attempt, nothing from disk; the
    # python launcher: torchrun is not the subject (the killed-rank case covers it);
    # 2 groups: every group waits for the new Lighthouse alike. The new Lighthouse
    # numbers its quorums from 1 again: with sdk.fault_tolerant's quorum ids
    # (--corral-quorum-ids, corral.sdk._ftids) no group keeps a process group the
    # others left, nor reads a torn-down one's gloo addresses. With torchft's own ids
    # every one of six runs waited out a process-group timeout: a collective on a
    # process group a peer had left (10 s) or "Gloo connectFullMesh failed" (40 s)
    err = _in_place(
        tmp_path,
        "inplacelh",
        *("--steps", STEPS, "--kill-lighthouse-at", "6", "--corral-quorum-ids"),
        *SLOW,
        options=("--launcher", "python", "--ft-join-timeout", "12.5"),
        hosts="local:2",
    )
    assert "group 0 kills the Lighthouse" in err
    assert re.search(
        r"torchft's Lighthouse exited \(code -9\): corral restarted it at http://127\.0\.0\.1:"
        r"\d+ \(restart 1 of \d+\); the groups reconnect to it, no restart from disk",
        err,
    ), err[-4000:]
    assert "falling back" not in err and "tears down" not in err
    job = tmp_path / "runs" / "inplacelh"
    attempts = json.loads((job / "attempts.json").read_text())
    assert [a["state"] for a in attempts] == ["succeeded"]
    final = {int(s) for s in re.findall(r"group \d done at step (\d+)", err)}
    assert len(final) == 1 and err.count("done at step") == 2
    logs = "".join(p.read_text() for p in sorted((job / "logs").glob("local-*.log")))
    # --ft-join-timeout reached the Lighthouse corral started (the one it restarts gets
    # the same: test_lighthouse_quorum.py)
    assert "group 0 kills the Lighthouse (join timeout 12500 ms)" in err
    for stall in ("connectFullMesh failed", "Timed out waiting"):
        assert stall not in logs, logs[-4000:]
    assert wait_no_job_processes("inplacelh", within=15) == []
