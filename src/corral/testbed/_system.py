"""System helpers for the testbed: requirements, processes by identity, links, namespaces."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from corral.errors import LaunchError
from corral.testbed._model import ProcessRecord

SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUN_DIR = Path("/run/corral")
"""Where the registry of the live testbed and the lock live (tmpfs: gone on reboot)."""
NETNS_DIR = Path("/run/netns")
PROC_SYS = Path("/proc/sys")

# Children we spawned and must reap once they die (a zombie still has a /proc entry).
_children: dict[int, subprocess.Popen[bytes]] = {}


def which(name: str) -> str | None:
    """Absolute path of ``name``, looking in the sbin directories too."""
    return shutil.which(name, path=os.environ.get("PATH", "") + ":" + SBIN_PATH)


def missing_requirements() -> list[str]:
    """What keeps the testbed from running here, one line each with the fix; empty when fine."""
    if not sys.platform.startswith("linux"):
        return [f"the testbed needs Linux (network namespaces); this is {sys.platform}"]
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append(
            "the testbed needs root (namespaces, bridge, mounts): run it as root, e.g. "
            '`sudo "$(command -v corral)" testbed up 3`'
        )
    tools = [
        ("sshd", "openssh-server"),
        ("ssh-keygen", "openssh-client"),
        ("ip", "iproute2"),
        ("unshare", "util-linux"),
        ("nsenter", "util-linux"),
        ("mount", "mount"),
    ]
    for tool, package in tools:
        if which(tool) is None:
            problems.append(f"`{tool}` is not installed: apt-get install -y {package}")
    return problems


def check_requirements() -> None:
    """Raise LaunchError listing everything missing (root, Linux, sshd, iproute2, ...)."""
    problems = missing_requirements()
    if problems:
        raise LaunchError("testbed unavailable: " + "; ".join(problems))


def tool(name: str) -> str:
    """Absolute path of a required tool (LaunchError if absent)."""
    path = which(name)
    if path is None:
        check_requirements()
        raise LaunchError(f"`{name}` is not installed")
    return path


def run(argv: Sequence[str], *, input: str | None = None, check: bool = True) -> str:
    """Run a short system command; LaunchError with its stderr when it fails."""
    proc = subprocess.run(
        list(argv),
        input=input,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": SBIN_PATH, "LC_ALL": "C"},
    )
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        why = " / ".join(detail[-5:]) or f"exit status {proc.returncode}"
        raise LaunchError(f"`{' '.join(argv)}` failed: {why}")
    return proc.stdout


def spawn(argv: Sequence[str], *, stdout: int | None, log: Path) -> subprocess.Popen[bytes]:
    """Start a long-lived daemon in its own session, stderr appended to ``log``."""
    with log.open("ab") as err:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=stdout if stdout is not None else subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            close_fds=True,
            env={"PATH": SBIN_PATH, "LANG": "C.UTF-8"},
        )
    _children[proc.pid] = proc
    return proc


# --------------------------------------------------------------------------- processes


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in ticks) from /proc/PID/stat, or None if gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def reap() -> None:
    """Collect exit statuses of our dead children so they do not linger as zombies."""
    for pid, proc in list(_children.items()):
        if proc.poll() is not None:
            del _children[pid]


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    reap()
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def record(pid: int) -> ProcessRecord:
    """Identity of a live process (PID, start time, executable)."""
    st = _stat(pid)
    if st is None:
        raise LaunchError(f"process {pid} exited right after it was started")
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    return ProcessRecord(pid=pid, start_time=st[1], exe=exe)


def is_ours(rec: ProcessRecord | None) -> bool:
    """Whether the recorded process is still alive and still the one we started."""
    if rec is None or not alive(rec.pid):
        return False
    st = _stat(rec.pid)
    if st is None or st[1] != rec.start_time:
        return False
    try:
        return os.readlink(f"/proc/{rec.pid}/exe") == rec.exe
    except OSError:
        return False


def netns_inode_of_pid(pid: int) -> int | None:
    """Inode of the network namespace ``pid`` lives in."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def netns_inode(name: str) -> int | None:
    """Inode of the named network namespace (``/run/netns/NAME``), None if absent."""
    try:
        return os.stat(NETNS_DIR / name).st_ino
    except OSError:
        return None


def pids_in_netns(inodes: Iterable[int]) -> list[int]:
    """Every live process whose network namespace is one of ``inodes``.

    The root namespace is never matched, so this can only find processes on
    testbed hosts.
    """
    targets = set(inodes)
    root = netns_inode_of_pid(1)
    own = netns_inode_of_pid(os.getpid())
    targets.discard(root or -1)
    targets.discard(own or -1)
    found: list[int] = []
    if not targets:
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == os.getpid():
            continue
        if netns_inode_of_pid(pid) in targets and alive(pid):
            found.append(pid)
    return sorted(found)


def terminate(pids: Iterable[int], *, grace: float = 1.0) -> None:
    """SIGTERM ``pids``, SIGKILL what is left after ``grace`` seconds, wait for all."""
    pending = [p for p in dict.fromkeys(pids) if alive(p)]
    for pid in pending:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    killed = False
    while pending:
        pending = [p for p in pending if alive(p)]
        if not pending:
            break
        if time.monotonic() >= deadline:
            if killed:
                raise LaunchError(f"processes {pending} did not die after SIGKILL")
            for pid in pending:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed = True
            deadline = time.monotonic() + 3.0
        time.sleep(0.01)


def wait_comm(pids: Sequence[int], comm: str, timeout: float) -> list[int]:
    """Wait until each PID has exec()ed into the program named ``comm``.

    Returns the PIDs that died (first) or did not get there within ``timeout``.
    """
    pending = list(pids)
    deadline = time.monotonic() + timeout
    while pending:
        dead = [p for p in pending if not alive(p)]
        if dead:
            return dead + [p for p in pending if p not in dead]
        still: list[int] = []
        for pid in pending:
            try:
                current = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                current = ""
            if current != comm:
                still.append(pid)
        pending = still
        if pending:
            if time.monotonic() >= deadline:
                return pending
            time.sleep(0.005)
    return []


# --------------------------------------------------------------------------- network


def link_exists(name: str) -> bool:
    """Whether a network interface ``name`` exists in the root namespace."""
    return Path("/sys/class/net", name).exists()


def link_is_up(name: str) -> bool:
    """Whether interface ``name`` is administratively up."""
    try:
        flags = int(Path("/sys/class/net", name, "flags").read_text(), 16)
    except (OSError, ValueError):
        return False
    return bool(flags & 0x1)


def tcp_answers(address: str, port: int, timeout: float) -> bool:
    """Whether a TCP connect to ``address:port`` succeeds within ``timeout``."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this mount namespace."""
    top = os.path.realpath(path)
    found: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
            if point == top or point.startswith(top.rstrip("/") + "/"):
                found.append(point)
    return found


def raise_sysctls(wanted: Mapping[str, int], root: Path = PROC_SYS) -> dict[str, list[int]]:
    """Raise each integer setting under ``root`` (``/proc/sys``) to at least its
    wanted value, never lowering one; ``{name: [before, after]}`` of those changed.
    LaunchError naming the setting when one cannot be read or written."""
    changed: dict[str, list[int]] = {}
    for name, value in wanted.items():
        path = root / name
        try:
            before = int(path.read_text().split()[0])
            if before < value:
                path.write_text(f"{value}\n")
                changed[name] = [before, value]
        except (OSError, ValueError, IndexError) as exc:
            key = name.replace("/", ".")
            raise LaunchError(
                f"cannot raise {key} to {value} ({exc}); the testbed's hosts need that many "
                f"neighbour entries: run `sysctl -w {key}={value}`"
            ) from exc
    return changed


def read_sysctls(names: Iterable[str], root: Path = PROC_SYS) -> dict[str, int]:
    """The integer settings ``names`` under ``root`` (``/proc/sys``) that can be read."""
    values: dict[str, int] = {}
    for name in dict.fromkeys(names):
        with contextlib.suppress(OSError, ValueError, IndexError):
            values[name] = int((root / name).read_text().split()[0])
    return values


def restore_sysctls(changed: Mapping[str, Sequence[int]], root: Path = PROC_SYS) -> list[str]:
    """Put back what :func:`raise_sysctls` changed, where the setting still reads the
    value it wrote (someone else's later change stays); the names restored."""
    restored = []
    for name, (before, after) in changed.items():
        path = root / name
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(path.read_text().split()[0]) == after:
                path.write_text(f"{before}\n")
                restored.append(name.replace("/", "."))
    return restored


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Hold the machine-wide testbed lock (one ``up``/``down`` at a time)."""
    import fcntl

    RUN_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (RUN_DIR / "testbed.lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
