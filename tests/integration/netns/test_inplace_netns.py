"""``--recovery in-place`` (torchft) on the netns testbed: real sshd, one replica group
per host (torchrun over SSH, or ``--launcher python`` where torchrun is not the
subject), a real Lighthouse child on the coordinator.

Each test runs examples/train_ft.py on the fewest hosts that show its fault (tb1..tb3
where survivors must train on together, tb1 and tb2 where one survivor shows it),
injects one fault once every group trains together, and asserts on what the job
printed and kept (never on how long anything took): a lost host costs its group
only and the survivors train on in the same attempt; a lost Lighthouse falls back to
the restart path from the disk checkpoint. No process of the job is left on any host.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from corral.testbed import Testbed
from tests.conftest import require

from ..conftest import REPO, job_processes, run_corral
from .test_faults import (
    Watched,
    assert_nothing_left,
    host_processes,
    hostfile,
    run_args,
    with_suppress_kill,
)

pytestmark = [pytest.mark.netns, pytest.mark.torch]

EXAMPLE = str(REPO / "examples" / "train_ft.py")
#: a step costs ~40 ms of CPU per group: 40 leave a late group 8 s to join and the
#: survivors of a fault at step 10 or later ~30 steps (a longer sleep while fewer groups
#: take part would cost less, but quorums of one out of phase then failed to merge)
STEPS = 40
SLEEP = "0.2"  # seconds per step: the job is still training when the fault lands
FAULT_AT = 10  # the fault follows the first step every group took at or past this
STEP = re.compile(r"\[(?P<host>tb\d):0\] step (?P<step>\d+)/\d+ participants (?P<p>\d+)")
#: Where torchrun is not the subject (a lost host, the Lighthouse, a cut link): one torch
#: import per group and attempt instead of two (issue 30); the hang test keeps torchrun.
PYTHON = ("--launcher", "python")
#: one intra-op thread per torch rank (train_ft and ft_steps leave torch's default):
#: between the small model's steps torch's idle OpenMP workers spin, much of a step's
#: CPU on a shared machine (issue 30; train_ddp sets one thread itself)
ONE_THREAD = ("--env", "OMP_NUM_THREADS=1")
HOSTS3 = ("tb1", "tb2", "tb3")
PAIR = ("tb1", "tb2")  # one group survives the other's fault


def inplace_args(
    tb: Testbed, tmp_path: Path, job: str, *extra: str, hosts: tuple[str, ...] = HOSTS3
) -> list[str]:
    """``corral run``'s arguments for the fault tests (test_faults.run_args) on ``hosts``
    (tb1..tb3 by default): one replica group each, one intra-op thread per rank."""
    args = run_args(tb, tmp_path, job, *ONE_THREAD, *extra)
    args[args.index("--hosts") + 1] = hostfile(tmp_path, hosts)
    return args


def start_inplace(
    tb: Testbed,
    tmp_path: Path,
    job: str,
    *extra: str,
    script: tuple[str, ...] = (),
    hosts: tuple[str, ...] = HOSTS3,
) -> Watched:
    """``corral run --recovery in-place`` of the example on ``hosts``; returns once every
    group has committed a step with all of them taking part (at FAULT_AT or later), so
    a fault injected next hits a full quorum mid-run."""
    require("torchft", "install the [ft] extra: make setup")
    w = Watched(
        [
            *inplace_args(tb, tmp_path, job, "--recovery", "in-place", *extra, hosts=hosts),
            *("--", EXAMPLE, "--steps", str(STEPS), "--step-sleep", SLEEP, *script),
        ],
        tmp_path,
    )
    everyone = len(hosts)
    for host in hosts:
        w.wait_for(rf"\[{host}:0\] step (1\d|[2-9]\d)/{STEPS} participants {everyone}", timeout=300)
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
    w = start_inplace(tb, tmp_path, job, *PYTHON)
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


def _lighthouse(job: str) -> psutil.Process:
    """The Lighthouse: the coordinator's child, marked as the job's own process."""
    (lighthouse,) = [
        p for p in job_processes(job) if "corral.recovery.lighthouse" in " ".join(p.cmdline())
    ]
    return lighthouse


def test_lost_lighthouse_is_restarted_and_the_groups_reconnect(
    healthy_testbed: Testbed, tmp_path: Path
) -> None:
    # torchft's Managers retry a failed quorum (TORCHFT_QUORUM_RETRIES, set by corral):
    # they reconnect to the Lighthouse corral starts again at the same address, and
    # the job goes on in the same attempt, nothing restarted from disk
    tb, job = healthy_testbed, "ip-lighthouse-back"
    w = start_inplace(tb, tmp_path, job, *PYTHON, hosts=PAIR)
    old = _lighthouse(job)
    old.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    code = w.finish()
    out, err = w.text("out"), w.text("err")
    assert code == 0, (out + err)[-4000:]
    assert re.search(
        r"torchft's Lighthouse exited \(code -9\): corral restarted it at http://\S+ "
        r"\(restart 1 of \d+\); the groups reconnect to it, no restart from disk",
        err,
    ), err[-4000:]
    assert "falling back" not in err
    assert attempts(tmp_path, job) == ["succeeded"]
    later = steps_of(w, killed_at)
    for host in PAIR:  # every group trained on with both
        assert any(h == host and p == 2 for h, _, p in later), out[-4000:]
        assert f"[{host}:0] done at step {STEPS}" in out
    assert_nothing_left(tb, job)


def test_lost_lighthouse_falls_back_to_a_restart_from_disk_saying_why(
    healthy_testbed: Testbed, tmp_path: Path
) -> None:
    # with TORCHFT_QUORUM_RETRIES=0 the groups fail on the first quorum without a
    # Lighthouse: corral does not restart it and says why it falls back
    tb, job = healthy_testbed, "ip-lighthouse"
    ckpt = tmp_path / "ckpt"  # seen by every host at this path
    w = start_inplace(
        tb,
        tmp_path,
        job,
        *("--max-restarts", "1", "--checkpoint-dir", str(ckpt)),
        *("--env", "TORCHFT_QUORUM_RETRIES=0"),
        *PYTHON,
        script=("--checkpoint-every", "5"),
        hosts=PAIR,
    )
    _lighthouse(job).send_signal(signal.SIGKILL)
    code = w.finish()
    out, err = w.text("out"), w.text("err")
    assert code == 0, (out + err)[-4000:]
    assert re.search(
        r"torchft's Lighthouse exited \(code -9\) and the groups cannot reconnect to a new "
        r"one: the job's env sets TORCHFT_QUORUM_RETRIES=0 .*: falling back to a restart of "
        r"every node from the disk checkpoint",
        err,
    ), err[-4000:]
    assert attempts(tmp_path, job) == ["failed", "succeeded"]
    resumed = [int(s) for s in re.findall(r"\[tb\d:0\] resumed at step (\d+)", out)]
    assert resumed and all(s > 0 and s % 5 == 0 for s in resumed), out[-4000:]
    for host in PAIR:
        assert f"[{host}:0] done at step {STEPS}" in out
    assert sorted(int(p.name[5:13]) for p in ckpt.glob("ckpt-*.pt"))[-1] == STEPS
    assert_nothing_left(tb, job)


def test_cut_link_costs_its_group_only(healthy_testbed: Testbed, tmp_path: Path) -> None:
    # tb2 stays up but unreachable: the coordinator declares it lost on missed
    # heartbeats, cannot reach it to restart its group, and the survivor goes on (the
    # lost-host test shows several survivors training on together); tb2's agent tears
    # its own ranks down once the coordinator's heartbeats stop
    tb, job = healthy_testbed, "ip-link"
    w = start_inplace(tb, tmp_path, job, "--host-timeout", "6", *PYTHON, hosts=PAIR)
    at_fault = max(s for h, s, _ in steps_of(w) if h == "tb1")
    tb.cut_link("tb2")
    cut_at = time.monotonic()
    try:
        # the survivor may finish before corral gives up on reaching tb2 again (then
        # there is no "go on without it" line): keep the link cut until the job ends
        code = w.finish()
    finally:
        tb.restore_link("tb2")
    out, err = w.text("out"), w.text("err")
    assert code == 0, (out + err)[-4000:]
    assert re.search(r"lost host tb2: no (heartbeat|keepalive)", err), err[-4000:]
    # 0 go on when the survivor finished its steps before tb2's host timeout ran out
    # (it goes on alone 0.5 s after the cut, once tb2's heartbeat is stale)
    assert re.search(r"tears down only group 1 \(tb2\); [01] group\(s\) go on", err)
    later = steps_of(w, cut_at)
    mine = [(s, p) for h, s, p in later if h == "tb1"]
    assert any(p == 1 and s > at_fault for s, p in mine), out[-4000:]
    assert f"[tb1:0] done at step {STEPS}" in out
    assert attempts(tmp_path, job) == ["succeeded"]
    assert_nothing_left(tb, job)


FT_STEPS = str(REPO / "tests" / "integration" / "scripts" / "ft_steps.py")


def test_hang_then_heal_and_a_second_failure_while_healing(
    healthy_testbed: Testbed, tmp_path: Path
) -> None:
    # over SSH: group 2 (tb3) hangs at step 8 (its rank sleeps forever outside any
    # collective): corral's hang detection tears down that group only and restarts it
    # on tb3, where it heals from a live peer; once it is out of the quorum (hung, torn
    # down or healing), group 0 (tb1) is SIGKILLed too (a second group failure): it is
    # torn down alone and heals back as well, all in one attempt
    tb, job = healthy_testbed, "ip-hang-twice"
    require("torchft", "install the [ft] extra: make setup")
    w = Watched(
        [
            # above the Lighthouse's 10 s join timeout: the others wait that long for
            # the hung group (its Manager still heartbeats), then train on without it
            *inplace_args(tb, tmp_path, job, "--recovery", "in-place", "--hang-timeout", "14"),
            *("--", FT_STEPS, "--steps", "25", "--sleep", "0.2"),
            *("--hang-group", "2", "--hang-at", "8", "--kill-while-away", "0"),
        ],
        tmp_path,
    )
    try:
        code = w.finish(timeout=600)
    except subprocess.TimeoutExpired:  # what it printed says where it stuck
        w.proc.send_signal(signal.SIGINT)
        w.finish(timeout=60)
        raise AssertionError((w.text("out")[-3000:], w.text("err")[-6000:])) from None
    out, err = w.text("out"), w.text("err")
    text = out + err
    assert code == 0, text[-4000:]
    # named as the one behind (the others at later steps, or stalled waiting for it)
    hang = r"hang detected: (rank 0 on tb3 made no progress|no rank made .*behind: rank 0 on tb3)"
    assert re.search(hang, err), err[-4000:]
    assert "rank 0 on tb3 is stuck in hang_forever" in err
    assert re.search(r"in-place recovery tears down only group 2 \(tb3\); 2 group", err)
    assert "group 0 is about to be killed while another group is away" in text
    assert re.search(r"in-place recovery tears down only group 0 \(tb1\)", err), err[-4000:]
    for group, host in ((2, "tb3"), (0, "tb1")):
        assert re.search(rf"group {group} \({host}\) rejoined at step \d+, healed from tb\d", err)
    assert attempts(tmp_path, job) == ["succeeded"]
    saved = json.loads((tmp_path / "runs" / job / "result.json").read_text())
    hosts = [n["host"] for n in saved["nodes"]]
    assert hosts.count("tb2") == 1  # the group never touched ran throughout
    assert hosts.count("tb1") == 2 and hosts.count("tb3") == 2
    assert all(g["steps_redone"] in (0, None) for g in saved["groups"])
    final = {int(s) for s in re.findall(r"group \d done at step (\d+)", out)}
    assert len(final) == 1 and out.count("done at step") == 3, out[-4000:]
    assert_nothing_left(tb, job)


def test_a_spare_that_fails_the_preflight_is_named_and_not_used(
    healthy_testbed: Testbed, tmp_path: Path
) -> None:
    # tb3 is the spare; its copy of the code differs from this machine's (a file changed
    # there, as on a host a sync missed): the pre-flight names it with the check and the
    # file, and the job launches on tb1 and tb2 without it
    tb, job = healthy_testbed, "ip-spare"
    require("torchft", "install the [ft] extra: make setup")
    src = tmp_path / "proj"
    src.mkdir()
    (src / "hello.py").write_text(
        "import os\nprint('trained on', os.environ['CORRAL_HOST'], flush=True)\n"
    )
    (src / "model.py").write_text("LAYERS = 4\n")
    dest = f"/srv/corral/code-{tmp_path.name}"
    for host in HOSTS3:
        copied = tb.run_on(host, ["sh", "-c", f"rm -rf {dest} && cp -a {src} {dest}"])
        assert copied.returncode == 0, copied.stderr
    changed = tb.run_on("tb3", ["sh", "-c", f"echo 'LAYERS = 5' > {dest}/model.py"])
    assert changed.returncode == 0, changed.stderr
    try:
        args = inplace_args(tb, tmp_path, job, "--recovery", "in-place", "--spares", "1")
        args.remove("--no-preflight")  # the pre-flight is what this is about
        ran = run_corral(
            *args,
            *("--workdir", dest, "--code-dir", str(src)),
            *("--launcher", "python", "--", "hello.py"),
            cwd=tmp_path,
            timeout=400,
        )
    finally:
        for host in HOSTS3:
            tb.run_on(host, ["rm", "-rf", dest])
    assert ran.returncode == 0, (ran.stdout + ran.stderr)[-4000:]
    err = ran.stderr
    assert re.search(r"spare tb3 not used: code: .*model\.py", err), err[-4000:]
    assert "spare host(s) tb3 failed the pre-flight" in err and "spares left: none" in err
    assert "trained on tb1" in ran.stdout and "trained on tb2" in ran.stdout
    assert "trained on tb3" not in ran.stdout
    assert_nothing_left(tb, job)
