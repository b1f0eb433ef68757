"""Entry point: ``python -m corral.agent``.

The first stdin line is either the start message or a probe. A probe is
answered with the standard library alone (with the host's pre-flight facts when
it asks for them, :mod:`corral.agent.hostcheck`, then the checklist's ``connect``
and ``time`` requests until the start), so the probe round trip costs as little
as possible. At the start message the node's processes are started first, still
with the standard library (:func:`corral.agent.spawn.spawn_node`); the agent's
heavier machinery (asyncio: :mod:`corral.agent.node`) is imported while
the launcher imports its own. When a ``prestart`` op before the probe (a head
start's, :mod:`corral.job.headstart`), the probe or a ``prestart`` op after it
carries the node's plan, its processes start then, held at their gates while the
checklist runs (a later plan they cannot run replaces them), and the start message
releases them
(:mod:`corral.agent.prestart`); the agent loads its machinery once they have
imported torch (at most one heartbeat interval later); an ``abort`` kills them
before anything of the job ran. An agent started with ``--warm MODULE`` starts
the node's launcher before it reads anything (:mod:`corral.agent.warm`): the
first plan adopts it, or it is killed.
"""

from __future__ import annotations

import os
import sys
import time

from corral.agent.warm import Warm, requested, start

TYPE_CHECKING = False  # not typing's: the warm launcher starts before it would load
if TYPE_CHECKING:
    from typing import Any


class _Stdin:
    """The coordinator's ops on the agent's stdin, read a block at a time: what
    follows the line asked for stays in ``buffer``, for the next line or for the
    agent's own reader once the node runs."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def line(self) -> bytes:
        """The next line, with its newline (without one at the end of stdin; b"" there)."""
        while b"\n" not in self.buffer:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                line, self.buffer = self.buffer, b""
                return line
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line + b"\n"


def main() -> int:
    """Start the warm launcher asked for, then run the node (:func:`_run`); a warm
    launcher no plan adopted is killed at the end."""
    module = requested(sys.argv[1:])
    warm = start(module) if module else None  # first: the rest is imported meanwhile
    try:
        return _run(warm)
    finally:
        if warm is not None:
            warm.discard()  # no-op once adopted


def _run(warm: Warm | None) -> int:
    """Answer an optional probe, read the start message, run until the node is done."""
    from corral.agent.hostcheck import host_checks
    from corral.agent.probe import probe_info
    from corral.agent.protocol import encode_event

    # Frames go to the real stdout; anything else printed goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    stdin_fd = os.dup(0)
    stdin = _Stdin(stdin_fd)
    first = stdin.line()
    if not first:
        return 2
    from corral.agent.protocol import decode_op

    try:
        message = decode_op(first)
    except ValueError as exc:
        print(f"corral agent: expected a probe or start op: {exc}", file=sys.stderr)
        return 2
    held = None  # the node's processes started while the checks run (at their gates)
    if message["op"] == "prestart":  # a head start's plan, ahead of the probe
        held, warm = _prestart(message.get("node"), None, warm), None
        message, first = _next_op(stdin)
    if message["op"] == "probe":
        if message.get("prestart"):  # before the host's facts: they take a while
            held = _prestart(message["prestart"], held, warm)  # kept when they can run it
            warm = None
        info = probe_info(message.get("workdir") or "", message.get("port"))
        checks = host_checks(message.get("facts"))  # the checklist's host facts, if asked
        answer = {**info, **(checks.reply() if checks else {}), "event": "probe"}
        out.write(encode_event({**answer, "time": time.time()}))
        out.flush()
        while True:
            message, first = _next_op(stdin)
            if message["op"] == "prestart":  # a plan the probe's answer corrected
                held, warm = _prestart(message.get("node"), held, warm), None
                continue
            reply = checks.answer(message) if checks else None
            if reply is None:
                break
            out.write(encode_event(reply))
            out.flush()
            if message["op"] == "time":  # the checklist's last request: it decides now
                import corral.agent.spawn  # noqa: F401
        if checks is not None:
            checks.close()  # the master port is free before anything is launched
        if message["op"] != "start":
            _cancel(held)
            return 0 if first else 2  # the launch was called off before anything started
    elif message["op"] != "start":
        _cancel(held)
        if first:  # else: a head start never asked for (end of stdin)
            print(
                f"corral agent: expected a probe or start op, got {message['op']!r}",
                file=sys.stderr,
            )
        return 2
    pending = stdin.buffer  # coordinator ops read after the start message, for the agent
    if held is not None:
        from corral.agent.prestart import release, wait_preloaded

        spawned, _ = release(held, message["node"])
        # the launcher's import of torch first: this agent's machinery and the
        # coordinator's handling of its events would share the CPUs with it
        pending = wait_preloaded(spawned, stdin_fd, _wait_limit(message), pending)
    else:
        from corral.agent.spawn import spawn_node

        spawned = spawn_node(message["node"], warm=warm)  # before the agent's own imports
    from corral.agent.node import run_agent

    return run_agent(message, out, stdin_fd, spawned, pending)


def _next_op(stdin: _Stdin) -> tuple[dict[str, Any], bytes]:
    """The coordinator's next op and its line; ``abort`` at the end of stdin or for a
    line that is not an op."""
    from corral.agent.protocol import decode_op

    line = stdin.line()
    try:
        return (decode_op(line) if line else {"op": "abort"}), line
    except ValueError:
        return {"op": "abort"}, line


def _cancel(held: Any) -> None:
    """Kill the node's held processes (nothing of the job ran): nothing is left behind."""
    if held is not None:
        from corral.agent.prestart import cancel

        cancel(held)


def _wait_limit(start: dict[str, Any]) -> float:
    """How long the agent may stay silent after the start message: one heartbeat
    interval (the coordinator expects nothing sooner), at most 5 s."""
    try:
        return max(0.0, min(float(start.get("heartbeat_interval", 2.0)), 5.0))
    except (TypeError, ValueError):
        return 2.0


def _prestart(node: object, held: Any, warm: Warm | None) -> Any:
    """The node's processes started at their gates for ``node`` (None: not for its
    command); ``held``, those started for an earlier plan, are kept when they can
    run this one, else replaced; ``warm``, the launcher started before any plan, is
    adopted when it can run it, else killed."""
    if not isinstance(node, dict):
        if warm is not None:
            warm.discard()
        return held
    from corral.agent.prestart import prestart

    try:
        return prestart(node, held, warm)
    except Exception as exc:  # the start message starts the node then, and reports it
        print(f"corral agent: could not start the node's processes early: {exc}", file=sys.stderr)
        return None


if __name__ == "__main__":
    sys.exit(main())
