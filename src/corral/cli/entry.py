"""The ``corral`` command's entry point: the agents of ``local:N`` started before the CLI loads.

``corral run --hosts local:N ... -- SCRIPT`` spends its first 0.1-0.2 s loading the
CLI (typer, rich, the job's schema) before its options are parsed. The nodes' agents
need none of it, so this module reads the few words that decide them from the
command line (:func:`sniff`: the verb, ``--hosts``, ``--python``, ``--job-id``, the
launcher, and whether the pre-flight runs and no calibration is asked for, with the
environment variables those options read) and starts them first (:func:`main`):
their interpreters start while the CLI loads (with torchrun, the default launcher,
each starts the node's launcher warm, :mod:`corral.agent.warm`), and ``corral run`` takes them
(:func:`take`) when its parsed options ask for the very same agents (the same count,
interpreter and job id; :mod:`corral.job.headstart` hands the engine only an agent
started for exactly its command). Whatever the parsed options say instead (a
misread word, an error, ``--help``), agents not taken are ended at exit: their stdin
closes, and an agent that was never sent a plan exits at the end of its stdin,
leaving nothing behind.

Until the agents are started this module imports the standard library's ``os`` and
``sys`` only (no ``typing``, ``subprocess`` or ``asyncio``: 40-80 ms that every
agent's start, and so its warm torchrun's, would wait for): they are started with
:func:`os.posix_spawnp` and adopted on the job's event loop when taken
(:meth:`corral.transport.local.LocalTransport.adopt`).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing itself is not imported: this module runs first
if TYPE_CHECKING:
    import asyncio
    from collections.abc import Coroutine, Mapping, Sequence
    from typing import Any, TypeVar

    from corral.job.headstart import HeadStart

    _T = TypeVar("_T")

#: Root flags that may come before the verb (none takes a value).
_ROOT_FLAGS = frozenset({"-v", "--verbose"})
#: Words after which ``corral run`` starts no head start (see ``cli/run.py:run``).
_NO_HEAD_START = frozenset({"--no-preflight", "--calibration", "--help", "-h"})
#: The launcher without ``--launcher`` (``--harness``: accelerate), as ``build_job`` picks it.
_DEFAULT_LAUNCHER = "torchrun"
#: The verbs that reach SSH hosts through corral's transport (``--hosts``): for them the
#: transport (asyncssh: 0.2-0.3 s, part of it waiting on ``ldconfig``/``gcc`` as it
#: looks for optional libraries) is imported in the background while the CLI loads.
_SSH_VERBS = frozenset({"run", "exec", "check", "ping", "calibrate"})
#: The launcher whose agents start it warm (``corral.job.headstart.warm_module``).
_WARM_LAUNCHER = "torchrun"


class Sniffed:
    """The agents a ``corral run`` command line will most likely ask for."""

    __slots__ = ("job_id", "launcher", "nodes", "python")

    def __init__(
        self, nodes: int, python: str | None, job_id: str | None, launcher: str | None = None
    ) -> None:
        self.nodes = nodes
        self.python = python
        self.job_id = job_id
        self.launcher = launcher  # None: not known (then no launcher is started warm)

    def _fields(self) -> tuple[object, ...]:
        return (self.nodes, self.python, self.job_id, self.launcher)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sniffed) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return "Sniffed(nodes={!r}, python={!r}, job_id={!r}, launcher={!r})".format(
            *self._fields()
        )


def _value(words: Sequence[str], i: int, flag: str) -> tuple[str | None, int]:
    """The value of ``flag`` at ``words[i]`` (``--flag V`` or ``--flag=V``) and the
    index after it; None when ``words[i]`` is not ``flag``."""
    word = words[i]
    if word == flag:
        return (words[i + 1] if i + 1 < len(words) else None), i + 2
    if word.startswith(flag + "="):
        return word[len(flag) + 1 :], i + 1
    return None, i + 1


def sniff(argv: Sequence[str], environ: Mapping[str, str]) -> Sniffed | None:
    """What ``argv`` (without the program) asks of a ``corral run`` on ``local:N``
    with the pre-flight and no calibration; None for anything else, or when unsure
    (no ``--`` before the script: its words could look like options)."""
    words = list(argv)
    while words and words[0] in _ROOT_FLAGS:
        words.pop(0)
    if not words or words[0] != "run" or "--" not in words:
        return None
    options = words[1 : words.index("--")]
    if environ.get("CORRAL_NO_PREFLIGHT") or any(
        w.partition("=")[0] in _NO_HEAD_START for w in options
    ):
        return None
    found: dict[str, str | None] = {
        "--hosts": environ.get("CORRAL_HOSTS"),
        "--python": environ.get("CORRAL_PYTHON") or None,
        "--job-id": None,
        "--launcher": environ.get("CORRAL_LAUNCHER") or None,
    }
    i = 0
    while i < len(options):
        for flag in found:
            value, after = _value(options, i, flag)
            if value is not None:
                found[flag] = value
                i = after
                break
        else:
            i += 1
    hosts = found["--hosts"] or ""
    count = hosts.removeprefix("local:")
    if not hosts.startswith("local:") or not count.isdigit():
        return None
    launcher = found["--launcher"]
    if launcher is None:  # the last of --harness / --no-harness wins
        harness = [w for w in options if w in ("--harness", "--no-harness")]
        launcher = "accelerate" if harness[-1:] == ["--harness"] else _DEFAULT_LAUNCHER
    return Sniffed(int(count), found["--python"], found["--job-id"], launcher)


def reaches_ssh(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether ``argv`` (without the program) most likely runs a verb on SSH hosts:
    a verb of :data:`_SSH_VERBS` with ``--hosts`` (or ``CORRAL_HOSTS``) not ``local:N``.
    A wrong guess costs one import in the background."""
    words = list(argv)
    while words and words[0] in _ROOT_FLAGS:
        words.pop(0)
    if not words or words[0] not in _SSH_VERBS:
        return False
    options = words[1 : words.index("--")] if "--" in words else words[1:]
    hosts = environ.get("CORRAL_HOSTS")
    for i in range(len(options)):
        value, _ = _value(options, i, "--hosts")
        if value is not None:
            hosts = value
    return hosts is not None and hosts != "" and not hosts.startswith("local:")


def _preload_ssh() -> None:
    """Import corral's SSH transport on a background thread (the CLI's own import of it
    then finds it loaded, or waits for it), joined at exit."""
    import atexit
    import threading

    def load() -> None:
        try:
            import corral.transport.ssh  # noqa: F401
        except Exception:  # e.g. asyncssh missing: the CLI says so itself
            return

    thread = threading.Thread(target=load, name="corral-ssh-preload", daemon=True)
    thread.start()
    atexit.register(thread.join, 30.0)


#: The most ``local:N`` nodes whose agents the entry point starts (more: the CLI does).
_MAX_EARLY = 64

#: One agent started early: its pid and the parent's ends of its stdin, stdout, stderr.
Spawned = tuple[int, int, int, int]


class EarlyStart:
    """Agents started by :func:`main` before the CLI loaded, and, once ``corral run``
    took them (:func:`take`), the event loop that owns their pipes and the head start
    that hands them to the engine."""

    def __init__(self, sniffed: Sniffed, job_id: str, argv: list[str], env: dict[str, str]) -> None:
        self.sniffed = sniffed
        self.job_id = job_id
        self.argv = argv  # the node agent's command, as the engine starts it
        self.env = env  # what the agents got beyond the login environment
        self.spawned: list[Spawned] = []
        self.taken = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.head: HeadStart | None = None

    @property
    def pids(self) -> list[int]:
        """The agents' pids."""
        return [pid for pid, *_ in self.spawned]


_early: EarlyStart | None = None


def _start(sniffed: Sniffed) -> EarlyStart | None:
    """Start the agents ``sniffed`` names (standard library only: no event loop yet,
    :func:`_spawn`), ended at exit unless taken; None when there are none to start."""
    if not 1 <= sniffed.nodes <= _MAX_EARLY or not hasattr(os, "posix_spawnp"):
        return None
    import atexit

    from corral.agent.gatenames import TORCHRUN, WARM_FLAG
    from corral.contract import JOB_ID_ENV
    from corral.job.ids import new_job_id
    from corral.transport.loginenv import login_env

    job_id = sniffed.job_id or new_job_id()
    argv = [sniffed.python or sys.executable, "-m", "corral.agent"]
    env = {JOB_ID_ENV: job_id}
    command = [*argv, WARM_FLAG, TORCHRUN] if sniffed.launcher == _WARM_LAUNCHER else argv
    early = EarlyStart(sniffed, job_id, argv, env)
    atexit.register(_end, early)
    full_env = {**login_env(), **env}
    for _ in range(sniffed.nodes):
        try:
            early.spawned.append(_spawn(command, full_env))
        except OSError:  # e.g. no such --python: the engine starts it and says why
            break
    return early


def _spawn(argv: list[str], env: dict[str, str]) -> Spawned:
    """Start ``argv`` as :class:`corral.transport.local.LocalTransport` starts a node's
    agent (in its own session, stdin/stdout/stderr piped, no other descriptor of ours
    inherited), with :func:`os.posix_spawnp`: ``subprocess`` and ``asyncio`` are not
    imported yet (the engine adopts it, :meth:`LocalTransport.adopt`)."""
    (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
    mine = (in_r, in_w, out_r, out_w, err_r, err_w)
    actions: list[tuple[int, ...]] = [
        (os.POSIX_SPAWN_DUP2, in_r, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable() if fd not in mine]
    try:
        pid = os.posix_spawnp(argv[0], argv, env, file_actions=actions, setsid=True)
    except OSError:
        for fd in (in_w, out_r, err_r):
            os.close(fd)
        raise
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    return pid, in_w, out_r, err_r


def _inheritable() -> list[int]:
    """This process's inheritable descriptors above stderr (a child of ``subprocess``
    gets none of them: ``close_fds``)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    found = []
    for name in names:
        fd = int(name)
        try:
            if fd > 2 and os.get_inheritable(fd):
                found.append(fd)
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return found


def _end(early: EarlyStart) -> None:
    """At exit: end the agents nobody took (their stdin closed: an agent never sent a
    plan exits at its end, killing what it started; waited for at most
    :data:`corral.job.headstart.END_WAIT` s, then killed)."""
    if early.taken:
        return
    early.taken = True  # ended once
    import signal
    import time

    from corral.job.headstart import END_WAIT

    for _, stdin, *_ in early.spawned:
        os.close(stdin)
    waiting = set(early.pids)
    deadline = time.monotonic() + END_WAIT
    while waiting:
        for pid in list(waiting):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                waiting.discard(pid)
        if waiting and time.monotonic() >= deadline:
            for pid in waiting:
                try:
                    os.killpg(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except OSError:
                    pass
            break
        time.sleep(0.01)
    for _, _, stdout, stderr in early.spawned:
        os.close(stdout)
        os.close(stderr)


def take(nodes: int, python: str | None, job_id: str | None) -> EarlyStart | None:
    """The agents started early, when ``corral run``'s parsed options ask for the
    same ones (``nodes`` local nodes, ``python``, ``job_id``; None: the job id picked
    early is the job's), adopted on a new event loop (run by :func:`run_on`); None
    otherwise (they are ended now)."""
    global _early
    early, _early = _early, None
    if early is None:
        return None
    same = early.sniffed.nodes == nodes and early.sniffed.python == python
    if not same or (job_id is not None and job_id != early.job_id):
        _end(early)
        return None
    import asyncio

    from corral.cluster.hostfile import local_cluster
    from corral.job.headstart import HeadStart

    early.taken = True
    early.loop = asyncio.new_event_loop()
    adopt = HeadStart.adopting(local_cluster(nodes), early.argv, early.env, early.spawned)
    early.head = early.loop.run_until_complete(adopt)
    return early


def run_on(early: EarlyStart, main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` as :func:`asyncio.run` would (an interrupt cancels it, its async
    generators and executor are shut down, the loop is closed), on the loop that owns
    the early agents' pipes."""
    import asyncio

    loop = early.loop
    if sys.version_info < (3, 11):  # asyncio.Runner: main() starts none before 3.11
        raise RuntimeError("an early start needs Python 3.11 or later")
    if loop is None:
        raise RuntimeError("the agents started early were not taken")
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        return runner.run(main)


def main() -> None:
    """The ``corral`` command: start ``local:N``'s agents when the command line asks
    for them, then load and run the CLI (:func:`corral.cli.main.main`)."""
    global _early
    sniffed = sniff(sys.argv[1:], os.environ)
    if sniffed is not None and sys.version_info >= (3, 11):  # asyncio.Runner: run_on
        _early = _start(sniffed)
    elif reaches_ssh(sys.argv[1:], os.environ):
        _preload_ssh()
    from corral.cli.main import main as cli_main

    cli_main()
