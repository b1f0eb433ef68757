"""A throwaway two-node Slurm cluster on this machine, from Debian's slurm-wlm and munge.

``slurm_cluster()`` starts, in a temp dir, a private ``munged`` (its own key and
socket), ``slurmctld`` and two ``slurmd`` (nodes ``n1`` and ``n2``, both this
machine at 127.0.0.1, each on its own free port), all as root, with no cgroups
(``proctrack/linuxproc``, ``task/none``) so it runs in containers too. It yields the
environment for the Slurm commands (``SLURM_CONF``), and at the end cancels every
job and stops the daemons it started (by their pid files). Requeued jobs become
eligible after ``cred_expire`` (10 s here; Slurm's default is 120 s) and the
scheduler looks at pending jobs every 2 s.

Without root or the binaries the test is skipped (failed under ``CI=true``, see
:func:`tests.conftest.missing_dependency`): ``scripts/system-deps.sh`` installs
``slurmctld slurmd slurm-client munge``.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

from corral.testbed._system import alive
from tests.conftest import missing_dependency

NODES = ("n1", "n2")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel")
START_TIMEOUT = 60.0


class SlurmUnavailable(Exception):
    """Slurm cannot be run here (not root, binaries missing, a daemon did not come up)."""


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _binary(name: str) -> str:
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.exists()), None
    )
    if found is None:
        raise SlurmUnavailable(
            f"{name} is not installed: apt-get install slurmctld slurmd slurm-client munge"
        )
    return found


def _first_job_id() -> int:
    """A first job id whose ``--master-port 0`` port (20000 + id, as the script derives
    it) is free now: clusters started at once (xdist workers, other sessions on this
    machine) all numbering from 1 would rendezvous their jobs at one port, the ranks of
    one job joining the other's store and the jobs failing (SIGTERM, exit 143)."""
    for _ in range(200):
        port = random.randrange(20001, 32000)  # below Linux's ephemeral range
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port - 20000
    raise SlurmUnavailable("no free port in 20001-31999 for the jobs' master port")


def _config(root: Path, socket_path: Path) -> str:
    ctld, *node_ports = _free_ports(1 + len(NODES))
    cpus = max(1, os.cpu_count() or 1)
    host = socket.gethostname()
    nodes = [
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
        "State=UNKNOWN"
        for name, port in zip(NODES, node_ports, strict=True)
    ]
    return "\n".join(
        [
            "ClusterName=corraltest",
            f"FirstJobId={_first_job_id()}",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={ctld}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={socket_path},cred_expire=10",
            f"StateSaveLocation={root}/state",
            f"SlurmdSpoolDir={root}/spool/%n",
            f"SlurmctldPidFile={root}/slurmctld.pid",
            f"SlurmdPidFile={root}/slurmd-%n.pid",
            f"SlurmctldLogFile={root}/log/slurmctld.log",
            f"SlurmdLogFile={root}/log/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=2",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MpiDefault=none",
            "SlurmdTimeout=30",
            *nodes,
            f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]
    )


def _stop(*pid_files: Path) -> None:
    """Stop the daemons whose pids are in ``pid_files``, all at once (SIGTERM, then
    SIGKILL to those still there after 3 s: the cluster and its state are throwaway)."""
    pids = []
    for pid_file in pid_files:
        try:
            pids.append(int(pid_file.read_text().strip()))
        except (OSError, ValueError):
            continue
    for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            pids = [pid for pid in pids if alive(pid)]
            if not pids:
                return
            time.sleep(0.1)


def _cancel_all(env: dict[str, str]) -> None:
    """Cancel every job and wait (up to 30 s) until none is left."""
    subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True)
        if done.returncode != 0 or not done.stdout.strip():
            return
        time.sleep(0.5)


def _logs(root: Path) -> str:
    tails = []
    for log in sorted((root / "log").glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-15:]
        tails.append(f"--- {log.name}\n" + "\n".join(lines))
    return "\n".join(tails)


def _wait_idle(env: dict[str, str], root: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    states = ""
    while time.monotonic() < deadline:
        done = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True
        )
        states = done.stdout.strip()
        if done.returncode == 0 and states.count("idle") == len(NODES):
            return
        time.sleep(0.5)
    raise SlurmUnavailable(f"the Slurm nodes did not become idle: {states!r}\n{_logs(root)}")


def _start(root: Path, stack: ExitStack) -> dict[str, str]:
    if os.geteuid() != 0:
        raise SlurmUnavailable("the test Slurm cluster runs its daemons as root")
    binaries = {name: _binary(name) for name in BINARIES}
    for sub in ("munge", "state", "log", *(f"spool/{n}" for n in NODES)):
        (root / sub).mkdir(parents=True, exist_ok=True)
    munge = root / "munge"
    munge.chmod(0o700)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o400)
    sock = munge / "socket"
    subprocess.run(
        [binaries["munged"], "--force", f"--socket={sock}", f"--key-file={key}",
         f"--log-file={munge / 'munged.log'}", f"--pid-file={munge / 'munged.pid'}",
         f"--seed-file={munge / 'seed'}"],
        check=True, capture_output=True,
    )  # fmt: skip
    stack.callback(_stop, munge / "munged.pid")
    conf = root / "slurm.conf"
    conf.write_text(_config(root, sock))
    env = dict(os.environ, SLURM_CONF=str(conf))
    daemons = [
        ([binaries["slurmctld"], "-f", str(conf), "-i"], root / "slurmctld.pid"),
        *(
            ([binaries["slurmd"], "-f", str(conf), "-N", n], root / f"slurmd-{n}.pid")
            for n in NODES
        ),
    ]
    stack.callback(_stop, *(pid_file for _, pid_file in daemons))
    for argv, _pid_file in daemons:
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SlurmUnavailable(f"{argv[0]} failed: {done.stderr.strip()}\n{_logs(root)}")
    # jobs first, then the daemons (callbacks run last in, first out)
    stack.callback(_cancel_all, env)
    _wait_idle(env, root)
    return env


@contextmanager
def slurm_cluster() -> Iterator[dict[str, str]]:
    """A running two-node Slurm cluster; yields the env for its commands (``SLURM_CONF``)."""
    __tracebackhide__ = True
    root = Path(tempfile.mkdtemp(prefix="corral-slurm-"))
    root.chmod(0o755)  # munged checks the socket dir's parents
    try:
        with ExitStack() as stack:
            try:
                env = _start(root, stack)
            except (SlurmUnavailable, subprocess.CalledProcessError) as exc:
                stack.close()
                missing_dependency(f"no Slurm cluster: {exc}")
            yield env
    finally:
        shutil.rmtree(root, ignore_errors=True)


def job_state(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """``scontrol show job -o`` as a dict (JobState, ExitCode, Restarts, ...)."""
    done = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True
    )
    fields = {}
    for word in done.stdout.split():
        key, sep, value = word.partition("=")
        if sep:
            fields[key] = value
    return fields
