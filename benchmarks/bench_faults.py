"""Fault tolerance on a 3-host netns testbed: detection latency, recovery, work lost.

Brings up its own 3-host testbed (network namespaces + real sshd; needs root,
exit 77 otherwise; waits while tests hold the testbed) and runs the training
example ``examples/train_ddp.py`` (gloo, one rank per host, ``--launcher
python``: rank r on tb(r+1); ``--steps 40 --checkpoint-every 10 --log-every 1
--sleep-per-step 0.1``, checkpoints in each host's private ``/srv/corral``).
Every output line of ``corral run`` is timestamped as it arrives (monotonic
clock in this parent). Faults, ``--runs`` each (3: median of 3), injected
before step 23, 26 and 29 in turn so that the work lost samples the whole
checkpoint interval:

* **rank SIGKILL**: ``--fail-mode kill`` on rank 1 (tb2), ``--max-restarts 1``.
  Injection = arrival of the rank's own "killing itself" line; detection =
  corral's ``[corral] rank 1 on tb2 killed by SIGKILL`` line.
* **host lost**: tb1 (rank 0, the only host holding the checkpoints) loses its
  sshd and then every process (SIGKILL), ``--max-restarts 1 --min-nodes 2
  --replicate-checkpoints``. Injection = the SIGKILLs; detection = ``lost host
  tb1``. Also the time to the first training step on the survivors (the first
  ``step k/`` line of the new attempt), with its phases: detection, the failed
  attempt's summary, checkpoint placement (the coordinator's replica copied to
  the new rank-0 host tb2), relaunch, resume. Target <= 20 s + checkpoint load;
  the load is timed separately (``torch.load`` here of the newest replica, the
  same size as the resumed checkpoint).
* **hang**: ``--fail-mode hang`` on rank 1, ``--hang-timeout 10``. Injection =
  the "hanging at step" line; detection = ``hang detected``; the overhead is
  detection minus the timeout.
* **link cut**: tb3's link goes down at step 20 (default ``--host-timeout 20``,
  no restarts). Detection = ``lost host tb3`` (target <= host timeout + 5 s);
  measured until the surviving ranks (tb1, tb2) have exited (psutil, the ranks
  found by their ``CORRAL_JOB_ID``), and until tb3's own agent has taken its rank
  down while still cut off.

Work lost per failure = the last step printed before the restart minus the step
resumed from (``resumed from step S``); target <= the checkpoint interval (10).
With ``--replicate-checkpoints`` rank 0's save returns once the coordinator's
replica holds the checkpoint; what that wait adds to a step is reported against
the same save without a replica (the rank-kill and hang runs), from the gaps
between consecutive ``step k/`` lines.

Baseline for the link cut: plain ``torchrun`` (c10d rendezvous on tb1, default
timeouts) started by hand on each host through its own ``ssh``, same script and
arguments, no corral; same cut at step 20; measured until the ranks on tb1 and
tb2 have exited, capped at ``--cap`` (120) s, reported as ">= cap" and the ratio
corral / torchrun as an upper bound. Then everything of the run is killed.

After each run the testbed is repaired (links up, sshd started) and every
process of the run is gone. Total wall time about 10 minutes.

    python benchmarks/bench_faults.py [--runs 3] [--torchrun-runs 1] [--cap 120]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import psutil
from benchlib import (
    PYTHON,
    ROOT,
    Runs,
    alive,
    bench_env,
    corral_cli,
    exit_on_sigterm,
    finish,
    job_processes,
    kill_popen,
    log,
    median,
    metric,
    ratio,
    shared_tmpdir,
    write_result,
)

NAME = "faults"
HOSTS = ("tb1", "tb2", "tb3")
EXAMPLE = str(ROOT / "examples" / "train_ddp.py")
STEPS = 40
EVERY = 10  # checkpoint interval (steps)
SLEEP = 0.1  # seconds per step
FAULT_STEPS = (23, 26, 29)  # the fault hits before this step (run i uses [i % 3])
CUT_STEP = 20  # the link is cut once rank 0 printed this step
HOST_TIMEOUT_S = 20.0  # corral's default --host-timeout (not passed)
HANG_TIMEOUT_S = 10.0
BACKOFF_S = 1.0  # corral's default --restart-backoff (not passed)
FIRST_STEP_TARGET_S = 20.0
TORCHRUN_PORT = 29566
START_TIMEOUT = 150.0  # to the step a fault is injected at
RUN_TIMEOUT = 240.0  # a whole corral run
POLL = 0.02
#: pyenv's rehash lock (root's .bashrc runs `pyenv init -` in every login shell)
PYENV_LOCK = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "shims" / ".pyenv-shim"
#: --keep-logs: where every run's timestamped output is saved (None: not kept)
KEEP_LOGS: list[Path] = []

STEP_RE = re.compile(r"\bstep (\d+)/(\d+) loss")
RESUMED_RE = re.compile(r"resumed from step (\d+) \(world size (\d+)\)")
KEY_RE = re.compile(
    r"\[corral\] (rank \d+ on \S+ killed|lost host|no heartbeat|hang detected|attempt \d+ failed"
    r"|checkpoint \S+ \(step \d+\):|no complete checkpoint"
    r"|job \S+ \(attempt \d+\)|resuming from)"
    r"|resumed from step"
)


def _skip(reason: str) -> int:
    print(f"skipped: {reason}")
    write_result(NAME, {"status": "skipped", "reason": reason})
    return 77


# -- timestamped output -----------------------------------------------------------------


class Lines:
    """Output lines of one or more processes, each kept with its arrival time."""

    def __init__(self) -> None:
        self.items: list[tuple[float, str, str]] = []  # (monotonic, stream, text)
        self.wall_offset = time.time() - time.monotonic()
        self._threads: list[threading.Thread] = []

    def follow(self, name: str, stream: IO[str]) -> None:
        def read() -> None:
            with contextlib.suppress(ValueError, OSError):
                for line in stream:
                    self.items.append((time.monotonic(), name, line.rstrip("\n")))

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        self._threads.append(thread)

    def reading(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def find(
        self, pattern: str | re.Pattern[str], stream: str | None = None, after: float = 0.0
    ) -> tuple[float, str] | None:
        """The first line matching ``pattern`` that arrived after ``after``."""
        for when, name, text in list(self.items):
            if when >= after and (stream is None or name == stream) and re.search(pattern, text):
                return when, text
        return None

    def wait_for(
        self,
        pattern: str | re.Pattern[str],
        stream: str | None = None,
        *,
        timeout: float,
        after: float = 0.0,
    ) -> tuple[float, str] | None:
        """Wait for such a line (None on timeout, or when every stream has ended)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = self.find(pattern, stream, after)
            if hit is not None:
                return hit
            if not self.reading():
                return self.find(pattern, stream, after)
            time.sleep(POLL)
        return None

    def join(self, timeout: float = 10.0) -> None:
        for thread in self._threads:
            thread.join(timeout)

    def save(self, path: Path, origin: float) -> None:
        """Every line with its arrival time relative to ``origin`` (for --keep-logs)."""
        with open(path, "w") as fh:
            for when, name, text in list(self.items):
                fh.write(f"{when - origin:+9.3f} {name:>3} {text}\n")

    def tail(self, stream: str | None = None, n: int = 25) -> list[str]:
        return [t for _, s, t in self.items if stream is None or s == stream][-n:]


class Corral:
    """``corral run`` in the background with timestamped stdout/stderr."""

    def __init__(self, args: Sequence[str], cwd: Path) -> None:
        cli, _ = corral_cli()
        env = bench_env()
        env["COLUMNS"] = "400"  # one [corral] message per line
        self.argv = [*cli, *args]
        self.proc = subprocess.Popen(
            self.argv,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        self.lines = Lines()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.lines.follow("out", self.proc.stdout)
        self.lines.follow("err", self.proc.stderr)

    def finish(self, timeout: float) -> int | None:
        try:
            code: int | None = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        kill_popen(self.proc)
        self.lines.join()
        return code


# -- the testbed --------------------------------------------------------------------------


def _hostfile(work: Path) -> Path:
    path = work / "hosts"
    path.write_text("".join(f"{h} slots=1\n" for h in HOSTS))
    return path


def _ckpt_dir(tag: str) -> str:
    """A checkpoint dir private to each host (no shared filesystem)."""
    return f"/srv/corral/{tag}/ckpt"


def _train_args(ckpt: str | None, *extra: str) -> list[str]:
    args = [
        EXAMPLE,
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(EVERY),
        "--log-every",
        "1",
        "--sleep-per-step",
        f"{SLEEP:g}",
    ]
    if ckpt is not None:
        args += ["--checkpoint-dir", ckpt]
    return [*args, *extra]


def _corral_args(tb: Any, work: Path, job: str, *extra: str) -> list[str]:
    return [
        "run",
        "--hosts",
        str(_hostfile(work)),
        "--ssh-config",
        str(tb.ssh_config),
        "--launcher",
        "python",
        "--master-port",
        "0",
        "--no-preflight",
        "--run-dir",
        str(work / "runs"),
        "--job-id",
        job,
        "--checkpoint-dir",
        _ckpt_dir(job),
        *extra,
    ]


def _rank_procs(tb: Any, belongs: Callable[[psutil.Process], bool]) -> dict[str, list[Any]]:
    """The training rank processes (the script itself, not torchrun) per host."""
    found: dict[str, list[Any]] = {h: [] for h in HOSTS}
    for host in HOSTS:
        for pid in tb.pids_on(host):
            try:
                proc = psutil.Process(pid)
                cmd = " ".join(proc.cmdline())
                if EXAMPLE in cmd and "torch.distributed.run" not in cmd and belongs(proc):
                    found[host].append(proc)
            except psutil.Error:
                continue
    return found


def _of_job(job: str) -> Callable[[psutil.Process], bool]:
    def belongs(proc: psutil.Process) -> bool:
        return proc.environ().get("CORRAL_JOB_ID") == job

    return belongs


def _cleanup(tb: Any, marker: str) -> tuple[int, int]:
    """Kill whatever of the run is left on any host and repair the testbed (links up,
    sshd running). Returns (processes killed, processes still there afterwards)."""
    left = job_processes(marker)
    for info in left:
        with contextlib.suppress(OSError):
            os.kill(info["pid"], signal.SIGKILL)
    _clear_killed_locks()
    with contextlib.suppress(Exception):
        tb.repair()
    remaining = _wait_job_gone(marker, 10)
    return len(left), len(remaining)


def _clear_killed_locks() -> bool:
    """Remove a lock file a killed host left in the home directory it shares with us.

    The testbed hosts share this machine's filesystem except ``/srv``, ``/tmp`` and
    ``/root`` (their own). A
    login shell on tb1 SIGKILLed in the middle of ``pyenv rehash`` leaves pyenv's
    lock file behind, and every later login on *any* host (corral's agents, pings,
    checkpoint copies) then waits 60 s for it. On real machines that file would
    have gone down with tb1's own disk: remove it while no rehash is running."""
    if not PYENV_LOCK.exists():
        return False
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any("pyenv-rehash" in part for part in proc.info.get("cmdline") or []):
                return False
    with contextlib.suppress(OSError):
        PYENV_LOCK.unlink()
        log(f"removed {PYENV_LOCK} left by a login shell killed on the lost host")
        return True
    return False


def _wait_job_gone(job: str, within: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + within
    left = job_processes(job)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = job_processes(job)
    return left


def _key_lines(lines: Lines, origin: float) -> list[str]:
    """corral's fault-handling messages, with their time relative to ``origin``."""
    return [
        f"{when - origin:+.2f} s {text.strip()[:240]}"
        for when, _, text in list(lines.items)
        if KEY_RE.search(text)
    ]


def _keep(lines: Lines, name: str, origin: float | None) -> None:
    if KEEP_LOGS:
        KEEP_LOGS[0].mkdir(parents=True, exist_ok=True)
        lines.save(KEEP_LOGS[0] / f"{name}.log", origin if origin is not None else 0.0)


def _since(hit: tuple[float, str] | None, origin: float | None) -> float | None:
    return hit[0] - origin if hit is not None and origin is not None else None


# -- restart faults: rank kill, host lost, hang ---------------------------------------------


def _steps_in(paths: Iterable[Path]) -> list[int]:
    """Steps of the complete rank-0 checkpoint names (``ckpt-NNNNNNNN.pt``) given."""
    return sorted(
        int(m.group(1)) for p in paths for m in [re.fullmatch(r"ckpt-(\d{8})\.pt", p.name)] if m
    )


def _replica_lag(lines: Lines, replica: Path) -> list[float]:
    """For each checkpoint in the replica: seconds from rank 0's ``step N/`` line (printed
    just before the save) to the replica file's modification time."""
    lags = []
    for step in _steps_in(replica.glob("ckpt-*.pt")):
        written = (replica / f"ckpt-{step:08d}.pt").stat().st_mtime - lines.wall_offset
        pattern = re.compile(rf"\bstep {step}/{STEPS} loss")
        printed = [
            when
            for when, name, text in list(lines.items)
            if name == "out" and when <= written and pattern.search(text)
        ]
        if printed:  # the save that produced this file (a step may run in two attempts)
            lags.append(written - printed[-1])
    return lags


def _save_extra(lines: Lines, until: float | None, every: int = EVERY) -> list[float]:
    """What each rank-0 save added to its step (attempt 0, before ``until``): the gap
    from ``step k/`` to ``step k+1/`` after a save, minus the median gap elsewhere."""
    seen: dict[int, float] = {}
    for when, name, text in list(lines.items):
        m = STEP_RE.search(text) if name == "out" else None
        if m and (until is None or when < until):
            seen.setdefault(int(m.group(1)), when)
    gaps = {k: seen[k + 1] - seen[k] for k in seen if k + 1 in seen}
    plain = median(g for k, g in gaps.items() if k % every)
    if plain is None:
        return []
    return [g - plain for k, g in gaps.items() if k % every == 0]


def _load_seconds(path: Path) -> float | None:
    """``torch.load`` of a checkpoint file in a fresh interpreter (import excluded)."""
    code = (
        "import sys, time, torch\n"
        "t = time.perf_counter()\n"
        "torch.load(sys.argv[1], map_location='cpu', weights_only=True)\n"
        "print(time.perf_counter() - t)\n"
    )
    try:
        done = subprocess.run(
            [PYTHON, "-c", code, str(path)], capture_output=True, text=True, timeout=120
        )
        return float(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as exc:
        log(f"timing the checkpoint load failed: {exc!r}")
        return None


def restart_run(tb: Any, top: Path, kind: str, run_no: int) -> dict[str, Any]:
    """One run of a fault that corral restarts from (``kill``, ``host`` or ``hang``)."""
    fault_step = FAULT_STEPS[run_no % len(FAULT_STEPS)]
    work = top / f"{kind}-{run_no}"
    work.mkdir(parents=True)
    job = f"bench-faults-{kind}-{run_no}-{os.getpid()}"
    extra = ["--max-restarts", "1"]
    train: list[str] = []
    if kind == "host":
        extra += ["--min-nodes", "2", "--replicate-checkpoints"]
    else:
        mode = "kill" if kind == "kill" else "hang"
        train = ["--fail-at-step", str(fault_step), "--fail-rank", "1", "--fail-mode", mode]
    if kind == "hang":
        extra += ["--hang-timeout", f"{HANG_TIMEOUT_S:g}"]
    args = [*_corral_args(tb, work, job, *extra), "--", *_train_args(None, *train)]
    result: dict[str, Any] = {"job_id": job, "fault_step": fault_step}
    run = Corral(args, work)
    result["argv"] = run.argv
    injected: float | None = None
    try:
        if kind == "host":
            hit = run.lines.wait_for(rf"step {fault_step - 1}/", "out", timeout=START_TIMEOUT)
            if hit is None:
                raise RuntimeError(
                    f"step {fault_step - 1} never printed: {run.lines.tail('err', 15)}"
                )
            tb.kill_sshd("tb1")  # no new sessions: the host is gone for good
            replica_dir = work / "runs" / job / "checkpoints"
            injected = time.monotonic()
            for pid in tb.pids_on("tb1"):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            result["removed_stale_lock"] = _clear_killed_locks()
            # what the replica held at the kill, against what tb1 itself had written
            result["replica_at_kill"] = _steps_in(replica_dir.glob("ckpt-*.pt"))
            listing = tb.run_on("tb1", ["ls", _ckpt_dir(job)], timeout=10).stdout.split()
            result["tb1_at_kill"] = _steps_in(Path(n) for n in listing)
            detect_re = r"\[corral\] lost host tb1"
        else:
            pattern = r"rank 1: killing itself" if kind == "kill" else r"rank 1: hanging at step"
            hit = run.lines.wait_for(pattern, "out", timeout=START_TIMEOUT)
            if hit is None:
                raise RuntimeError(f"{pattern!r} never printed: {run.lines.tail('err', 15)}")
            injected = hit[0]
            detect_re = (
                r"\[corral\] rank 1 on tb2 killed by SIGKILL"
                if kind == "kill"
                else r"\[corral\] hang detected"
            )
        detected = run.lines.wait_for(detect_re, "err", timeout=120, after=injected - 1)
        code = run.finish(RUN_TIMEOUT)
    finally:
        if run.proc.poll() is None:
            kill_popen(run.proc)
        if injected is None:
            _keep(run.lines, f"{kind}-{run_no}", None)
    lines = run.lines
    _keep(lines, f"{kind}-{run_no}", injected)
    failed = lines.find(r"\[corral\] attempt 0 failed", "err")
    placed = lines.find(
        r"\[corral\] (checkpoint \S+ \(step \d+\):|no complete checkpoint)",
        "err",
        after=failed[0] if failed else 0.0,
    )
    relaunched = lines.find(r"\[corral\] job \S+ \(attempt 1\)", "err")
    resumed = lines.find(RESUMED_RE, "out")
    first_step = lines.find(STEP_RE, "out", after=resumed[0]) if resumed else None
    before = [
        int(m.group(1))
        for when, name, text in list(lines.items)
        if name == "out" and (resumed is None or when < resumed[0])
        for m in [STEP_RE.search(text)]
        if m
    ]
    resumed_m = RESUMED_RE.search(resumed[1]) if resumed else None
    resumed_step = int(resumed_m.group(1)) if resumed_m else None
    last_step = max(before) if before else None
    result.update(
        {
            "exit_code": code,
            "finished": lines.find(r"final loss", "out") is not None,
            "detect_s": _since(detected, injected),
            "detect_line": detected[1].strip()[:240] if detected else None,
            "failed_line_s": _since(failed, injected),
            "placed_s": _since(placed, injected),
            "relaunch_s": _since(relaunched, injected),
            "resumed_s": _since(resumed, injected),
            "first_step_s": _since(first_step, injected),
            "last_step_before": last_step,
            "resumed_step": resumed_step,
            "world_size_after": int(resumed_m.group(2)) if resumed_m else None,
            "work_lost_steps": (
                last_step - resumed_step
                if last_step is not None and resumed_step is not None
                else None
            ),
            "key_lines": _key_lines(lines, injected) if injected is not None else [],
        }
    )
    if kind == "hang" and result["detect_s"] is not None:
        result["hang_overhead_s"] = result["detect_s"] - HANG_TIMEOUT_S
    if placed is not None:
        # "checkpoint NAME (step N): already on A; copied from SRC to B, C (X MB, Y s)"
        m = re.search(r"copied from (.+?) to .*? \(([\d.]+) MB, ([\d.]+) s\)", placed[1])
        if m:
            result["placement_copy_s"] = float(m.group(3))
            result["checkpoint_mb"] = float(m.group(2))
            result["placement_source"] = m.group(1)
    result["save_extra_s"] = _save_extra(lines, injected)
    if kind == "host":
        replica_dir = work / "runs" / job / "checkpoints"
        result["replica_lag_s"] = _replica_lag(lines, replica_dir)
        # the resumed file may be pruned by now: every checkpoint of the job has its size
        kept = _steps_in(replica_dir.glob("ckpt-*.pt"))
        if kept:
            replica = replica_dir / f"ckpt-{kept[-1]:08d}.pt"
            result["checkpoint_bytes"] = replica.stat().st_size
            result["checkpoint_load_s"] = _load_seconds(replica)
    if code != 0 or detected is None or first_step is None:
        result["stderr_tail"] = lines.tail("err")
        result["stdout_tail"] = lines.tail("out", 10)
    result["left_after_exit"] = len(_wait_job_gone(job, 30))
    return result


# -- link cut: corral vs plain torchrun ------------------------------------------------------


def _wait_gone(
    procs: Sequence[Any], origin: float, cap: float, also: Callable[[], bool] | None = None
) -> float | None:
    """Seconds from ``origin`` until ``procs`` are all gone (None: still alive at
    ``origin + cap``); keeps polling while ``also()`` is false."""
    gone: float | None = None
    while time.monotonic() < origin + cap:
        if gone is None and not alive(procs):
            gone = time.monotonic() - origin
        if gone is not None and (also is None or also()):
            break
        time.sleep(POLL)
    if gone is None and not alive(procs):
        gone = time.monotonic() - origin
    return gone


def cut_corral(tb: Any, top: Path, run_no: int, cap: float) -> dict[str, Any]:
    """corral run (no restarts, default --host-timeout); tb3's link cut at step 20."""
    work = top / f"cut-corral-{run_no}"
    work.mkdir(parents=True)
    job = f"bench-faults-cut-{run_no}-{os.getpid()}"
    args = [*_corral_args(tb, work, job), "--", *_train_args(None)]
    result: dict[str, Any] = {"job_id": job}
    run = Corral(args, work)
    result["argv"] = run.argv
    cut: float | None = None
    try:
        hit = run.lines.wait_for(rf"step {CUT_STEP}/", "out", timeout=START_TIMEOUT)
        if hit is None:
            raise RuntimeError(f"step {CUT_STEP} never printed: {run.lines.tail('err', 15)}")
        ranks = _rank_procs(tb, _of_job(job))
        survivors = ranks["tb1"] + ranks["tb2"]
        result["ranks_seen"] = {h: len(p) for h, p in ranks.items()}
        cut = time.monotonic()
        tb.cut_link("tb3")
        survivors_s = _wait_gone(survivors, cut, cap, also=lambda: run.proc.poll() is not None)
        exited = time.monotonic() - cut if run.proc.poll() is not None else None
        # tb3's agent takes its rank down on its own once the coordinator is silent
        cut_host_s = _wait_gone(ranks["tb3"], cut, cap)
        detected = run.lines.find(r"\[corral\] lost host tb3", "err", after=cut)
        warned = run.lines.find(r"\[corral\] no heartbeat from tb3", "err", after=cut)
        result.update(
            {
                "detect_s": _since(detected, cut),
                "detect_line": detected[1].strip()[:240] if detected else None,
                "heartbeat_warning_s": _since(warned, cut),
                "survivors_exit_s": survivors_s,
                "corral_exit_s": exited,
                "cut_host_rank_exit_s": cut_host_s,
            }
        )
    finally:
        with contextlib.suppress(Exception):
            tb.restore_link("tb3")
        code = run.finish(60)
    _keep(run.lines, f"cut-corral-{run_no}", cut)
    result["exit_code"] = code
    if cut is not None:
        result["key_lines"] = _key_lines(run.lines, cut)
    if result.get("detect_s") is None:
        result["stderr_tail"] = run.lines.tail("err")
    result["left_after_exit"] = len(_wait_job_gone(job, 20))
    return result


def cut_torchrun(tb: Any, top: Path, run_no: int, cap: float) -> dict[str, Any]:
    """Plain torchrun on each host over its own ssh; tb3's link cut at step 20."""
    work = top / f"cut-torchrun-{run_no}"
    work.mkdir(parents=True)
    rdzv = f"bench-faults-torchrun-{run_no}-{os.getpid()}"
    script = " ".join(_train_args(_ckpt_dir(rdzv)))
    lines = Lines()
    procs: list[subprocess.Popen[str]] = []
    result: dict[str, Any] = {"rdzv_id": rdzv}
    cut: float | None = None
    try:
        for node_rank, host in enumerate(HOSTS):
            remote = (
                f"cd {work} && exec {PYTHON} -m torch.distributed.run --nnodes 3 "
                f"--nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint tb1:{TORCHRUN_PORT} "
                f"--rdzv-id {rdzv} --rdzv-conf is_host={1 if node_rank == 0 else 0} "
                f"--local-addr {tb.host(host).address} {script}"
            )
            proc = subprocess.Popen(
                tb.ssh_argv(host, remote),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
            procs.append(proc)
            assert proc.stdout is not None
            lines.follow(host, proc.stdout)
        hit = lines.wait_for(rf"step {CUT_STEP}/", "tb1", timeout=START_TIMEOUT)
        if hit is None:
            raise RuntimeError(f"step {CUT_STEP} never printed: {lines.tail(n=15)}")

        def belongs(proc: psutil.Process) -> bool:
            return rdzv in " ".join(proc.cmdline())

        ranks = _rank_procs(tb, belongs)
        survivors = ranks["tb1"] + ranks["tb2"]
        result["ranks_seen"] = {h: len(p) for h, p in ranks.items()}
        cut = time.monotonic()
        tb.cut_link("tb3")
        survivors_s = _wait_gone(survivors, cut, cap)
        result.update(
            {
                "survivors_exit_s": survivors_s,
                "capped": survivors_s is None,
                "survivors_alive_at_cap": len(alive(survivors)),
                "ssh_clients_exited": [p.poll() is not None for p in procs],
                "output_after_cut": [
                    f"{host}: {text[:200]}"
                    for when, host, text in list(lines.items)
                    if when >= cut and not STEP_RE.search(text)
                ][-12:],
            }
        )
    finally:
        for proc in procs:
            kill_popen(proc)
        killed, remaining = _cleanup(tb, rdzv)
        result["killed_at_cleanup"] = killed
        result["left_after_cleanup"] = remaining
        lines.join(5)
        _keep(lines, f"cut-torchrun-{run_no}", cut)
    return result


# -- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Bring up a testbed, inject the faults, take it down, write ``results/faults.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per fault (median)")
    parser.add_argument("--torchrun-runs", type=int, default=1, help="plain torchrun link cuts")
    parser.add_argument("--cap", type=float, default=120.0, help="seconds a link cut is watched")
    parser.add_argument(
        "--only", default="", help="comma-separated subset of kill,host,hang,cut,torchrun"
    )
    parser.add_argument("--keep-logs", default="", help="save every run's timestamped output here")
    args = parser.parse_args(argv)
    if args.keep_logs:
        KEEP_LOGS.append(Path(args.keep_logs).resolve())
    exit_on_sigterm()
    from corral.testbed import exclusive, missing_requirements

    problems = missing_requirements()
    if problems:
        return _skip("; ".join(problems))
    with exclusive():  # waits while tests (or another benchmark) use the testbed
        return _measure(args)


def _median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    return median(r.get(key) for r in rows)


def _measure(args: argparse.Namespace) -> int:
    from corral.testbed import Testbed

    only = {x for x in args.only.split(",") if x}
    leftover = Testbed.running()
    if leftover is not None:
        leftover.down()
    top = shared_tmpdir("corral-bench-faults-")
    tb = Testbed(top / "testbed")
    tb.up(len(HOSTS))
    samples: dict[str, list[dict[str, Any]]] = {
        "kill": [],
        "host": [],
        "hang": [],
        "cut_corral": [],
        "cut_torchrun": [],
    }
    started = time.monotonic()

    def one(kind: str, fn: Callable[[], dict[str, Any]], marker: str) -> None:
        t0 = time.monotonic()
        try:
            res = fn()
        except Exception as exc:  # a broken run is recorded, the others still run
            res = {"error": f"{type(exc).__name__}: {exc}"}
        res["wall_s"] = time.monotonic() - t0
        res["cleanup_killed"], res["cleanup_left"] = _cleanup(tb, marker)
        samples[kind].append(res)
        shown = {
            k: v
            for k, v in res.items()
            if k not in ("key_lines", "stderr_tail", "stdout_tail", "output_tail")
        }
        log(f"{kind} run {len(samples[kind])}: {shown}")
        for line in res.get("key_lines", []):
            log(f"    {line}")
        for line in res.get("stderr_tail", [])[-12:]:
            log(f"    err| {line}")
        time.sleep(1.0)

    pid = os.getpid()
    try:
        for run_no in range(args.runs):
            for kind in ("kill", "host", "hang"):
                if only and kind not in only:
                    continue
                one(
                    kind,
                    functools.partial(restart_run, tb, top, kind, run_no),
                    f"bench-faults-{kind}-{run_no}-{pid}",
                )
            if not only or "cut" in only:
                one(
                    "cut_corral",
                    functools.partial(cut_corral, tb, top, run_no, args.cap),
                    f"bench-faults-cut-{run_no}-{pid}",
                )
        for run_no in range(args.torchrun_runs):
            if only and "torchrun" not in only:
                continue
            one(
                "cut_torchrun",
                functools.partial(cut_torchrun, tb, top, run_no, args.cap),
                f"bench-faults-torchrun-{run_no}-{pid}",
            )
    finally:
        tb.down()
        shutil.rmtree(top, ignore_errors=True)
    wall = time.monotonic() - started
    return _report(args, samples, wall)


def _report(args: argparse.Namespace, samples: dict[str, list[dict[str, Any]]], wall: float) -> int:
    kill, host, hang = samples["kill"], samples["host"], samples["hang"]
    cuts, trs = samples["cut_corral"], samples["cut_torchrun"]
    det = {
        "rank_kill": _median_of(kill, "detect_s"),
        "host_lost": _median_of(host, "detect_s"),
        "link_cut": _median_of(cuts, "detect_s"),
        "hang": _median_of(hang, "detect_s"),
    }
    hang_overhead = _median_of(hang, "hang_overhead_s")
    first_step = _median_of(host, "first_step_s")
    load_s = _median_of(host, "checkpoint_load_s")
    copy_s = _median_of(host, "placement_copy_s")
    lost_local = [
        r["work_lost_steps"] for r in kill + hang if isinstance(r.get("work_lost_steps"), int)
    ]
    lost_host = [r["work_lost_steps"] for r in host if isinstance(r.get("work_lost_steps"), int)]
    lost = lost_local + lost_host
    save_local = median(x for r in kill + hang for x in r.get("save_extra_s") or [])
    save_replicated = median(x for r in host for x in r.get("save_extra_s") or [])
    corral_exit = _median_of(cuts, "survivors_exit_s")
    capped = any(r.get("capped") for r in trs) or not trs
    tr_values = [r.get("survivors_exit_s") for r in trs]
    torchrun_s = args.cap if capped else median(tr_values)
    cut_ratio = ratio(corral_exit, torchrun_s)
    link_target = HOST_TIMEOUT_S + 5.0
    first_target = FIRST_STEP_TARGET_S + (load_s or 0.0)
    runs = Runs()
    for kind, rows in (("kill", kill), ("host", host), ("hang", hang), ("cut", cuts)):
        for n, r in enumerate(rows, 1):
            cut_run = kind == "cut"
            runs.check(
                f"{kind} run {n}",
                r.get("argv") or ["(command not recorded: the run raised before it)"],
                r.get("exit_code", 0 if r.get("error") else None),
                # a recovered run ends 0 and trains to the end; a cut is judged by its detection
                expect_code=None if cut_run or r.get("error") else 0,
                output=r.get("stderr_tail"),
                timings={"detection": r.get("detect_s")} if cut_run else None,
                problems=[
                    r.get("error") or "",
                    "" if cut_run or r.get("finished") else "training never printed its final loss",
                ],
            )
    bad_runs = runs.failures
    left = sum(int(r.get("left_after_exit") or 0) for r in kill + host + hang + cuts)
    left += sum(int(r.get("left_after_cleanup") or 0) for r in trs)
    left += sum(int(r.get("cleanup_left") or 0) for rows in samples.values() for r in rows)
    link_met = det["link_cut"] is not None and det["link_cut"] <= link_target
    first_met = first_step is not None and first_step <= first_target
    local_met = len(lost_local) == len(kill) + len(hang) > 0 and max(lost_local) <= EVERY
    host_lost_met = len(lost_host) == len(host) > 0 and max(lost_host) <= EVERY
    lost_met = local_met and host_lost_met
    metrics = [
        metric(
            "detection, rank SIGKILL (its last line -> corral's 'killed by SIGKILL')",
            det["rank_kill"],
            "s",
            "-",
            None,
        ),
        metric(
            "detection, host lost (sshd + processes SIGKILLed -> 'lost host')",
            det["host_lost"],
            "s",
            "-",
            None,
        ),
        metric(
            f"detection, link cut, default --host-timeout {HOST_TIMEOUT_S:g} -> 'lost host'",
            det["link_cut"],
            "s",
            f"<= {link_target:g} s (host timeout + 5 s)",
            link_met,
        ),
        metric(
            f"detection, hang, --hang-timeout {HANG_TIMEOUT_S:g}"
            " ('hanging' line -> 'hang detected')",
            det["hang"],
            "s",
            "-",
            None,
        ),
        metric("hang detection overhead beyond the timeout (info)", hang_overhead, "s", "-", None),
        metric(
            "host lost -> first training step on the 2 survivors (incl. 1 s backoff)",
            first_step,
            "s",
            f"<= {FIRST_STEP_TARGET_S:g} s + checkpoint load ({(load_s or 0.0):.3f} s)",
            first_met,
        ),
        metric(
            "of which checkpoint placement: replica -> every host of the new world (info)",
            copy_s,
            "s",
            "-",
            None,
        ),
        metric(
            f"work lost per failure (steps redone), rank kill + hang, max of {len(lost_local)}",
            max(lost_local) if lost_local else None,
            "steps",
            f"<= {EVERY} steps (checkpoint interval)",
            local_met,
        ),
        metric(
            f"work lost per failure (steps redone), rank 0's host lost (resumes from the "
            f"coordinator's replica), max of {len(lost_host)}",
            max(lost_host) if lost_host else None,
            "steps",
            f"<= {EVERY} steps (checkpoint interval)",
            host_lost_met,
        ),
        metric(
            "rank-0 save that waits for the coordinator's replica, time added to its step "
            "(info; baseline: the same save without a replica)",
            save_replicated,
            "s",
            "-",
            None,
            baseline=save_local,
            baseline_desc="rank kill + hang runs: host-local save only",
            ratio_value=ratio(save_replicated, save_local),
        ),
        metric(
            "link cut -> surviving ranks exited, corral vs plain torchrun"
            + (f" (torchrun capped at {args.cap:g} s: ratio is an upper bound)" if capped else ""),
            corral_exit,
            "s",
            "report",
            None,
            baseline=torchrun_s,
            baseline_desc=(
                f">= {args.cap:g} s: torchrun's surviving ranks still running at the cap"
                if capped
                else "plain torchrun (c10d, default timeouts) by hand over ssh"
            ),
            ratio_value=cut_ratio,
        ),
        metric(
            "job processes left on any host / failed runs",
            left + len(bad_runs),
            "count",
            "0",
            left + len(bad_runs) == 0,
        ),
    ]
    status_code = finish(
        NAME,
        {
            "title": "Fault detection, recovery and work lost (3-host netns testbed)",
            "status": "ok",
            "config": {
                "hosts": list(HOSTS),
                "launcher": "python",
                "runs": args.runs,
                "torchrun_runs": args.torchrun_runs,
                "cap_s": args.cap,
                "steps": STEPS,
                "checkpoint_every": EVERY,
                "sleep_per_step_s": SLEEP,
                "fault_steps": list(FAULT_STEPS),
                "cut_step": CUT_STEP,
                "host_timeout_s": HOST_TIMEOUT_S,
                "hang_timeout_s": HANG_TIMEOUT_S,
                "restart_backoff_s": BACKOFF_S,
                "wall_s": wall,
            },
            "samples": samples,
            "medians": {
                "detect_rank_kill_s": det["rank_kill"],
                "detect_host_lost_s": det["host_lost"],
                "detect_link_cut_s": det["link_cut"],
                "detect_hang_s": det["hang"],
                "hang_overhead_s": hang_overhead,
                "host_lost_first_step_s": first_step,
                "host_lost_placed_s": _median_of(host, "placed_s"),
                "host_lost_relaunch_s": _median_of(host, "relaunch_s"),
                "host_lost_resumed_s": _median_of(host, "resumed_s"),
                "placement_copy_s": copy_s,
                "checkpoint_load_s": load_s,
                "recovery_first_step_kill_s": _median_of(kill, "first_step_s"),
                "recovery_first_step_hang_s": _median_of(hang, "first_step_s"),
                "work_lost_steps": median(lost),
                "work_lost_steps_max": max(lost) if lost else None,
                "work_lost_steps_max_rank_kill_hang": max(lost_local) if lost_local else None,
                "work_lost_steps_max_host_lost": max(lost_host) if lost_host else None,
                "replica_lag_s": median(x for r in host for x in r.get("replica_lag_s") or []),
                "save_extra_replicated_s": save_replicated,
                "save_extra_local_s": save_local,
                "link_cut_survivors_exit_corral_s": corral_exit,
                "link_cut_corral_exit_s": _median_of(cuts, "corral_exit_s"),
                "link_cut_cut_host_rank_exit_s": _median_of(cuts, "cut_host_rank_exit_s"),
                "link_cut_survivors_exit_torchrun_s": torchrun_s,
                "link_cut_torchrun_capped": capped,
            },
            "metrics": metrics,
            "ratio": cut_ratio,
            "target": (
                f"link-cut detection <= {link_target:g} s; host lost -> first step <= "
                f"{FIRST_STEP_TARGET_S:g} s + load; work lost <= {EVERY} steps"
            ),
            "met": link_met and first_met and lost_met,
        },
        runs,
    )
    print(
        "detection (median): "
        + ", ".join(f"{k} {v:.2f} s" if v is not None else f"{k} -" for k, v in det.items())
    )
    print(f"host lost -> first step on survivors: {first_step} s (checkpoint load {load_s} s)")
    print(f"work lost per failure: {lost} steps (interval {EVERY})")
    bound = "<= " if capped else ""
    print(
        f"link cut -> survivors exited: corral {corral_exit} s vs torchrun "
        f"{'>= ' if capped else ''}{torchrun_s} s -> ratio {bound}{cut_ratio}"
    )
    print(f"processes left {left}, failed runs {len(bad_runs)}, wall {wall:.0f} s")
    return status_code


if __name__ == "__main__":
    sys.exit(main())
