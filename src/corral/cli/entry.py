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
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import sys
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from corral.job.headstart import HeadStart

_T = TypeVar("_T")

#: Root flags that may come before the verb (none takes a value).
_ROOT_FLAGS = frozenset({"-v", "--verbose"})
#: Words after which ``corral run`` starts no head start (see ``cli/run.py:run``).
_NO_HEAD_START = frozenset({"--no-preflight", "--calibration", "--help", "-h"})
#: The launcher without ``--launcher`` (``--harness``: accelerate), as ``build_job`` picks it.
_DEFAULT_LAUNCHER = "torchrun"


@dataclass(frozen=True)
class Sniffed:
    """The agents a ``corral run`` command line will most likely ask for."""

    nodes: int
    python: str | None
    job_id: str | None
    launcher: str | None = None  # None: not known (then no launcher is started warm)


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


@dataclass
class EarlyStart:
    """Agents started by :func:`main`, and the event loop that owns their pipes."""

    sniffed: Sniffed
    job_id: str
    loop: asyncio.AbstractEventLoop
    head: HeadStart
    taken: bool = False


_early: EarlyStart | None = None


def _start(sniffed: Sniffed) -> EarlyStart:
    """Start the agents ``sniffed`` names on a new event loop (run later by
    :func:`run_on`), ended at exit unless taken."""
    from corral.cluster.hostfile import local_cluster
    from corral.job.headstart import HeadStart
    from corral.job.ids import new_job_id

    job_id = sniffed.job_id or new_job_id()
    loop = asyncio.new_event_loop()
    head = HeadStart()
    cluster = local_cluster(sniffed.nodes)
    loop.run_until_complete(head.spawn(cluster, sniffed.python, job_id, sniffed.launcher))
    early = EarlyStart(sniffed, job_id, loop, head)
    atexit.register(_end, early)
    return early


def _end(early: EarlyStart) -> None:
    """At exit: end the agents nobody took, and close the loop."""
    if not early.taken and not early.loop.is_closed():
        early.loop.run_until_complete(early.head.close())
        early.loop.close()


def take(nodes: int, python: str | None, job_id: str | None) -> EarlyStart | None:
    """The agents started early, when ``corral run``'s parsed options ask for the
    same ones (``nodes`` local nodes, ``python``, ``job_id``; None: the job id picked
    early is the job's); None otherwise (they are ended at exit)."""
    global _early
    early, _early = _early, None
    if early is None:
        return None
    same = early.sniffed.nodes == nodes and early.sniffed.python == python
    if not same or (job_id is not None and job_id != early.job_id):
        _end(early)
        return None
    early.taken = True
    return early


def run_on(early: EarlyStart, main: Coroutine[Any, Any, _T]) -> _T:
    """Run ``main`` as :func:`asyncio.run` would (an interrupt cancels it, its async
    generators and executor are shut down, the loop is closed), on the loop that owns
    the early agents' pipes."""
    if sys.version_info < (3, 11):  # asyncio.Runner: main() starts none before 3.11
        raise RuntimeError("an early start needs Python 3.11 or later")
    with asyncio.Runner(loop_factory=lambda: early.loop) as runner:
        return runner.run(main)


def main() -> None:
    """The ``corral`` command: start ``local:N``'s agents when the command line asks
    for them, then load and run the CLI (:func:`corral.cli.main.main`)."""
    global _early
    sniffed = sniff(sys.argv[1:], os.environ)
    if sniffed is not None and sys.version_info >= (3, 11):
        from corral.errors import CorralError

        with contextlib.suppress(CorralError):  # e.g. local:0: the CLI says what is wrong
            _early = _start(sniffed)
    from corral.cli.main import main as cli_main

    cli_main()
