"""The fault matrix of issue 5 on the netns testbed (real sshd, real torch.distributed).

Each test injects one fault into a real training job (examples/train_ddp.py)
and asserts: the fault is detected within a generous bound, the summary names
the host / rank / cause, no process of the job is left on any host, and (where
a restart is allowed) the job finishes, resumed from the last complete
checkpoint. Checkpoints live in each host's private /srv/corral unless a test
says otherwise, so nothing relies on a shared filesystem.

Each test runs the smallest world that shows its fault: two hosts (``PAIR``), one
rank each, with ``--launcher python`` unless torchrun's own handling is the subject;
one host where one agent or rank 0's own checkpoints show it; the three hosts of the
testbed only where the job must go on without the master's host (two survivors: the
new world is still distributed, with a new master).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import psutil
import pytest

from corral.testbed import Testbed

from ..conftest import REPO, corral_argv, job_processes, wait_no_job_processes

pytestmark = [pytest.mark.netns, pytest.mark.torch]

EXAMPLE = str(REPO / "examples" / "train_ddp.py")
HOSTS = ("tb1", "tb2", "tb3")
PAIR = ("tb1", "tb2")  # the world of a fault that needs no survivor host
STEPS = 40
EVERY = 10  # checkpoint interval (steps)
SLOW = "0.1"  # seconds per step: the job runs long enough to be hit mid-way
DETECT_MARGIN = 20.0  # seconds allowed past a detection deadline on a loaded box


class Watched:
    """``corral run`` in the background; every output line is kept with its arrival time."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        env = dict(os.environ, COLUMNS="200")
        self.proc = subprocess.Popen(
            corral_argv(*args),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: dict[str, list[tuple[float, str]]] = {"out": [], "err": []}
        self._threads = [
            threading.Thread(target=self._read, args=(name, stream), daemon=True)
            for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr))
        ]
        for thread in self._threads:
            thread.start()

    def _read(self, name: str, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines[name].append((time.monotonic(), line))

    def text(self, name: str) -> str:
        return "".join(line for _, line in self.lines[name])

    def wait_for(self, pattern: str, name: str = "out", timeout: float = 180) -> float:
        """When a line matching ``pattern`` arrived (waits for it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for when, line in list(self.lines[name]):
                if re.search(pattern, line):
                    return when
            if self.proc.poll() is not None and all(not t.is_alive() for t in self._threads):
                break
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not seen on std{name}:\n{self.text(name)[-4000:]}")

    def finish(self, timeout: float = 300) -> int:
        code = self.proc.wait(timeout=timeout)
        for thread in self._threads:
            thread.join(timeout=10)
        return code


def hostfile(tmp_path: Path, names: tuple[str, ...] = HOSTS) -> str:
    path = tmp_path / "hosts"
    path.write_text("".join(f"{n} slots=1\n" for n in names))
    return str(path)


def run_args(
    tb: Testbed, tmp_path: Path, job: str, *extra: str, hosts: tuple[str, ...] = PAIR
) -> list[str]:
    return [
        "run",
        "--hosts",
        hostfile(tmp_path, hosts),
        "--ssh-config",
        str(tb.ssh_config),
        "--run-dir",
        str(tmp_path / "runs"),
        "--job-id",
        job,
        "--grace",
        "5",
        "--master-port",
        "0",
        "--no-preflight",
        "--restart-backoff",
        "0.5",
        *extra,
    ]


def train(*extra: str, steps: int = STEPS) -> list[str]:
    return [
        "--",
        EXAMPLE,
        "--steps",
        str(steps),
        "--checkpoint-every",
        str(EVERY),
        "--log-every",
        "5",
        "--sleep-per-step",
        SLOW,
        *extra,
    ]


def host_ckpt(job: str) -> str:
    """A checkpoint dir private to each host (no shared filesystem)."""
    return f"/srv/corral/{job}/ckpt"


def on_host(tb: Testbed, host: str, path: str) -> Path:
    """``path`` as seen inside ``host``'s mount namespace, from here."""
    pid = tb._holder_pid(tb._require().host(host))
    return Path(f"/proc/{pid}/root{path}")


def steps_in(directory: Path) -> list[int]:
    return sorted(int(p.name[5:13]) for p in directory.glob("ckpt-*.pt"))


def resumed_step(text: str) -> int:
    m = re.search(r"resumed from step (\d+)", text)
    assert m, text[-3000:]
    return int(m.group(1))


def assert_trained(w: Watched) -> None:
    out = w.text("out")
    m = re.search(r"final loss ([\d.]+) \(initial ([\d.]+)\)", out)
    assert m, out[-3000:]
    assert float(m.group(1)) < float(m.group(2)) / 2
    assert re.search(rf"step {STEPS}/{STEPS} loss", out), out[-3000:]


def assert_nothing_left(tb: Testbed, job: str) -> None:
    assert not wait_no_job_processes(job, within=40)
    for host in HOSTS:
        left = [p for p in tb.pids_on(host) if _job_of(p) == job]
        assert not left, f"{host}: {left}"


def _job_of(pid: int) -> str | None:
    try:
        return psutil.Process(pid).environ().get("CORRAL_JOB_ID")
    except psutil.Error:
        return None


def rank_pid(job: str, rank: int) -> int:
    """The pid of a training rank of the job (the script's process)."""
    for proc in job_processes(job):
        try:
            env, cmdline = proc.environ(), " ".join(proc.cmdline())
            script = "train_ddp.py" in cmdline and "torch.distributed.run" not in cmdline
            if env.get("RANK") == str(rank) and script:
                return int(proc.pid)
        except psutil.Error:
            continue
    raise AssertionError(f"rank {rank} of {job} not found")


def attempts_rows(err: str) -> list[str]:
    return [line for line in err.splitlines() if re.match(r"\s*│?\s*\d+\s*│\s*tb", line)]


# -- the matrix ------------------------------------------------------------------------


@pytest.mark.slow  # torchrun's own teardown and restart of a killed rank
def test_rank_sigkill_restarts_and_finishes(healthy_testbed: Testbed, tmp_path: Path) -> None:
    tb, job = healthy_testbed, "ft-kill"
    w = Watched(
        run_args(tb, tmp_path, job, "--max-restarts", "1", "--checkpoint-dir", host_ckpt(job))
        + train("--fail-at-step", "25", "--fail-rank", "1", "--fail-mode", "kill"),
        tmp_path,
    )
    code = w.finish()
    err = w.text("err")
    assert code == 0, err[-4000:]
    # under torchrun the rank is torchrun's child: its status comes from torchrun's own
    # report, which can be cut short by the teardown
    cause = r"attempt 0 failed: rank 1 on tb\d (killed by SIGKILL|exited without reporting)"
    assert re.search(cause, err), err[-4000:]
    assert "restart 1 of 1" in err
    assert resumed_step(w.text("out")) == 20  # the last checkpoint before step 25
    assert_trained(w)
    assert "attempts" in err and len(attempts_rows(err)) == 2
    assert_nothing_left(tb, job)


def test_lost_host_continues_on_the_others(healthy_testbed: Testbed, tmp_path: Path) -> None:
    # tb1 runs rank 0 and is the only host with the checkpoints: with it gone, the
    # coordinator's replica (--replicate-checkpoints) is what the new rank 0 resumes from
    tb, job = healthy_testbed, "ft-host"
    w = Watched(
        run_args(
            tb,
            tmp_path,
            job,
            "--launcher",
            "python",
            "--max-restarts",
            "1",
            "--min-nodes",
            "2",
            "--replicate-checkpoints",
            "--checkpoint-dir",
            host_ckpt(job),
            hosts=HOSTS,
        )
        + train(),
        tmp_path,
    )
    w.wait_for(r"step 25/")
    killed_at = time.monotonic()
    tb.kill_sshd("tb1")
    for pid in host_processes(tb, "tb1", job):
        with_suppress_kill(pid)
    detected = w.wait_for(r"lost host tb1", "err")
    assert detected - killed_at < 15 + DETECT_MARGIN
    code = w.finish()
    err = w.text("err")
    assert code == 0, err[-4000:]
    assert "restarting on 2 host(s) without tb1" in err
    replica = tmp_path / "runs" / job / "checkpoints"
    assert steps_in(replica), "no replica was kept"
    # rank 0's saves wait for the replica, so the newest checkpoint rank 0 had
    # finished before the host died is the one resumed from: one interval lost at most
    step = resumed_step(w.text("out"))
    before = last_logged_step(w.text("out"))
    assert before >= 25
    assert step >= (before - 1) // EVERY * EVERY, (before, step)
    assert "(world size 2)" in w.text("out")
    assert_trained(w)
    assert_nothing_left(tb, job)


def last_logged_step(out: str) -> int:
    """The last ``step N/`` line rank 0 printed before the job resumed."""
    last = 0
    for line in out.splitlines():
        if "resumed from step" in line:
            break
        found = re.search(r"\bstep (\d+)/", line)
        if found:
            last = int(found.group(1))
    return last


def host_processes(tb: Testbed, host: str, job: str) -> list[int]:
    """What dies with the host: its sshd sessions and every process of the job. Login
    shells are spared: the hosts share /root, and a shell killed inside `pyenv rehash`
    would leave a lock that stalls every later login on every host."""
    pids = []
    for pid in tb.pids_on(host):
        try:
            proc = psutil.Process(pid)
            if proc.name() == "sshd" or proc.environ().get("CORRAL_JOB_ID") == job:
                pids.append(pid)
        except psutil.Error:
            continue
    return pids


def with_suppress_kill(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


REPLICA_CHECK = """
import os, sys, torch
from pathlib import Path
from corral import sdk
replica = Path(sys.argv[1])
for step in (10, 20, 30):
    saved = sdk.save_checkpoint({"step": step, "w": torch.zeros(2_000_000)},
                                os.environ["CORRAL_CHECKPOINT_DIR"], step)
    if saved is not None:
        held = replica / saved.name
        print(f"saved {saved.name}; in the replica: {held.is_file()}", flush=True)
"""


def ckpt_helpers_on(tb: Testbed) -> dict[str, list[int]]:
    """Checkpoint helper processes (senders, listings) still running, per host."""
    left: dict[str, list[int]] = {}
    for host in HOSTS:
        for pid in tb.pids_on(host):
            with contextlib.suppress(OSError):
                if b"checkpoints.hostside" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    left.setdefault(host, []).append(pid)
    return left


@pytest.mark.parametrize("replica_ok", [True, False], ids=["replicated", "replica-unwritable"])
def test_a_save_returns_once_the_replica_holds_it(
    healthy_testbed: Testbed, tmp_path: Path, replica_ok: bool
) -> None:
    tb, job = healthy_testbed, f"ft-sync-{replica_ok}"
    replica = tmp_path / "runs" / job / "checkpoints"
    if not replica_ok:  # the coordinator cannot keep a replica: rank 0 is told, and goes on
        replica.parent.mkdir(parents=True)
        replica.write_text("a file where the replica directory should be")
    script = tmp_path / "saves.py"
    script.write_text(REPLICA_CHECK)
    w = Watched(
        run_args(
            tb,
            tmp_path,
            job,
            "--launcher",
            "python",
            "--replicate-checkpoints",
            "--checkpoint-dir",
            host_ckpt(job),
            "--",
            str(script),
            str(replica),
            hosts=("tb1",),  # rank 0 saves and the coordinator replicates: one host shows it
        ),
        tmp_path,
    )
    code = w.finish()
    out, err = w.text("out"), w.text("err")
    assert code == 0, err[-4000:]
    saves = re.findall(r"saved (ckpt-\d+\.pt); in the replica: (\w+)", out)
    names = ["ckpt-00000010.pt", "ckpt-00000020.pt", "ckpt-00000030.pt"]
    if replica_ok:
        assert saves == [(n, "True") for n in names], out
        assert sorted(p.name for p in replica.iterdir()) == names[1:]  # keeps 2
    else:
        assert saves == [(n, "False") for n in names], out
        warned = re.findall(
            r"\[tb1:0\] corral: warning: (ckpt-\d+\.pt) is not in the "
            r"coordinator's replica \(cannot write \1 into (\S+) here: "
            r"File exists\); it exists on this host only",
            out + err,
        )
        assert warned == [(n, str(replica)) for n in names], out + err
    assert not ckpt_helpers_on(tb)
    assert_nothing_left(tb, job)


def test_cut_link_is_lost_within_the_host_timeout(healthy_testbed: Testbed, tmp_path: Path) -> None:
    tb, job = healthy_testbed, "ft-link"
    timeout = 6.0
    w = Watched(
        run_args(
            tb,
            tmp_path,
            job,
            "--launcher",
            "python",
            "--max-restarts",
            "1",
            "--min-nodes",
            "1",
            "--host-timeout",
            f"{timeout:g}",
            "--checkpoint-dir",
            host_ckpt(job),
        )
        + train(),
        tmp_path,
    )
    w.wait_for(r"step 25/")
    # the host that is not the master's: tb1 goes on alone (the lost-host test shows a
    # world of several survivors, and a new master)
    cut_at = time.monotonic()
    tb.cut_link("tb2")
    try:
        detected = w.wait_for(r"lost host tb2", "err")
        assert detected - cut_at < timeout + DETECT_MARGIN
        code = w.finish()
    finally:
        tb.restore_link("tb2")
    err = w.text("err")
    assert code == 0, err[-4000:]
    assert re.search(r"lost host tb2: no (heartbeat|keepalive)", err), err[-4000:]
    assert "restarting on 1 host(s) without tb2" in err
    assert resumed_step(w.text("out")) >= 20
    assert "(world size 1)" in w.text("out")
    assert_trained(w)
    # tb2's agent tore its ranks down on its own once our heartbeats stopped
    assert_nothing_left(tb, job)


def test_hung_rank_is_named_dumped_and_restarted(healthy_testbed: Testbed, tmp_path: Path) -> None:
    tb, job = healthy_testbed, "ft-hang"
    w = Watched(
        run_args(
            tb,
            tmp_path,
            job,
            "--launcher",
            "python",
            "--max-restarts",
            "1",
            "--hang-timeout",
            "8",
            "--checkpoint-dir",
            host_ckpt(job),
        )
        + train("--fail-at-step", "25", "--fail-rank", "1", "--fail-mode", "hang"),
        tmp_path,
    )
    code = w.finish()
    err = w.text("err")
    assert code == 0, err[-4000:]
    assert "hang detected" in err
    assert re.search(r"rank 1 on tb2\b.*hang_forever", err, re.S), err[-4000:]
    dump = tmp_path / "runs" / job / "hang" / "tb2.1.txt"
    assert "hang_forever" in dump.read_text()
    assert (tmp_path / "runs" / job / "hang" / "tb1.0.txt").exists()
    assert resumed_step(w.text("out")) == 20
    assert_trained(w)
    assert_nothing_left(tb, job)


def test_corral_killed_then_rerun_resumes(healthy_testbed: Testbed, tmp_path: Path) -> None:
    tb, job = healthy_testbed, "ft-corral"
    # one host: its agent sees the coordinator gone as any host's would (resuming a
    # world from rank 0's private checkpoints is the hung-rank test's)
    args = (
        run_args(
            tb,
            tmp_path,
            job,
            *("--launcher", "python", "--checkpoint-dir", host_ckpt(job)),
            hosts=("tb1",),
        )
        + train()
    )
    w = Watched(args, tmp_path)
    w.wait_for(r"step 35/")
    w.proc.send_signal(signal.SIGKILL)
    assert w.finish() == -signal.SIGKILL  # killed, not a clean exit it raced to
    # the agents notice the coordinator is gone and take everything down
    assert_nothing_left(tb, job)
    saved = steps_in(on_host(tb, "tb1", host_ckpt(job)))
    assert saved and max(saved) >= 30
    again = Watched(args, tmp_path)
    code = again.finish()
    err = again.text("err")
    assert code == 0, err[-4000:]
    assert "1 earlier attempt(s) on record; this is attempt 1" in err
    assert resumed_step(again.text("out")) == max(saved)
    assert_trained(again)
    assert "interrupted" in err  # attempt 0, in the attempts table
    assert_nothing_left(tb, job)


def test_kill_during_checkpoint_write_uses_the_previous_one(
    healthy_testbed: Testbed, tmp_path: Path
) -> None:
    tb, job = healthy_testbed, "ft-write"
    ckpt = on_host(tb, "tb1", host_ckpt(job))
    w = Watched(
        run_args(
            tb,
            tmp_path,
            job,
            "--launcher",
            "python",
            "--max-restarts",
            "1",
            "--checkpoint-dir",
            host_ckpt(job),
            hosts=("tb1",),  # rank 0 writes the checkpoints and is killed: one host shows it
        )
        + train("--ballast-mb", "80"),
        tmp_path,
    )
    w.wait_for(r"step 15/")
    deadline = time.monotonic() + 120
    partial: list[Path] = []
    while time.monotonic() < deadline and not partial:
        partial = [p for p in ckpt.glob(".ckpt-*.tmp-*")] if ckpt.exists() else []
        if not partial:
            time.sleep(0.005)
    assert partial, "never saw a checkpoint being written"
    os.kill(rank_pid(job, 0), signal.SIGKILL)
    complete = [s for s in steps_in(ckpt)]
    code = w.finish()
    err = w.text("err")
    assert code == 0, err[-4000:]
    assert "rank 0 on tb1 killed by SIGKILL" in err
    step = resumed_step(w.text("out"))
    assert complete and step == max(complete)  # the one written before, never the partial
    assert_trained(w)
    assert_nothing_left(tb, job)


def test_full_checkpoint_disk_names_host_and_path(healthy_testbed: Testbed, tmp_path: Path) -> None:
    tb, job = healthy_testbed, "ft-full"
    directory = f"/srv/corral/{job}-full"
    tb.run_on("tb1", ["mkdir", "-p", directory], check=True)
    tb.run_on("tb1", ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", directory], check=True)
    try:
        w = Watched(
            run_args(
                tb,
                tmp_path,
                job,
                *("--launcher", "python", "--checkpoint-dir", directory),
                hosts=("tb1",),  # rank 0 writes the checkpoints: one host shows it
            )
            + train("--ballast-mb", "1.6", steps=30),
            tmp_path,
        )
        code = w.finish()
        err = w.text("err")
        assert code == 1, err[-4000:]
        assert "root cause: rank 0 on tb1" in err
        assert re.search(rf"tb1.*{re.escape(directory)}.*no space left", err, re.S | re.I), err[
            -4000:
        ]
        ckpt = on_host(tb, "tb1", directory)
        assert steps_in(ckpt) == [EVERY]
        assert not list(ckpt.glob(".ckpt-*"))  # the partial file was removed
        with zipfile.ZipFile(ckpt / f"ckpt-{EVERY:08d}.pt") as archive:
            assert archive.testzip() is None  # the previous checkpoint is intact
        assert_nothing_left(tb, job)
    finally:
        tb.run_on("tb1", ["umount", directory])
