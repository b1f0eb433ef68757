"""Machine health: is each machine up, what does it have, how busy is it.

The engine of ``corral serve``'s health check, machine ping and capabilities
endpoints. :func:`probe_machines` runs :mod:`corral.fleet.machinefacts`
(shipped, standard library only) on every host at once, each under one hard
deadline covering connect, authentication, interpreter start and the answer;
a host that fails comes back offline with the reason, never as an exception.
When the deadline passes, the host's attempt is cancelled and a process
already started is killed: the call returns at most :data:`KILL_GRACE` seconds
after the deadline even when a link is dead. Local hosts (``local:N``) and the
coordinator itself (:func:`local_health`) are read in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from corral.cluster.model import Host
from corral.errors import CorralError, TransportError
from corral.fleet import machinefacts
from corral.remote.python import start_program
from corral.transport.base import NodeProcess, Transport, kill_and_wait

__all__ = ["KILL_GRACE", "SHIPPED", "MachineHealth", "local_health", "probe_machines"]

#: The modules sent to each host (dependency order).
SHIPPED = ("corral.agent.hostfacts", "corral.fleet.machinefacts")
#: After the deadline, how long to wait for a killed probe to end (then it is left).
KILL_GRACE = 1.0
DEFAULT_DEADLINE = 20.0
SAMPLE_S = 0.2  # CPU sampling on each host
_SHOWN = 200  # characters of a host's stderr quoted in an error


@dataclass
class MachineHealth:
    """One machine's answer (``online`` False and ``error`` set when none came)."""

    name: str
    online: bool
    checked: float  # time.time() of the answer (or of giving up)
    latency_ms: float | None  # connect + exec round trip (0 in-process; None offline)
    capabilities: dict[str, Any] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (latency rounded to microseconds)."""
        data = asdict(self)
        if self.latency_ms is not None:
            data["latency_ms"] = round(self.latency_ms, 3)
        return data


def local_health(
    name: str = "localhost", *, path: str | None = None, sample_s: float = SAMPLE_S
) -> MachineHealth:
    """This machine, read in-process (blocks ``sample_s`` seconds to sample the CPUs);
    ``path`` chooses the disk reported (default: the home directory)."""
    caps = machinefacts.capabilities(path)
    busy = machinefacts.load(sample_s)
    return MachineHealth(name, True, time.time(), 0.0, caps, busy, None)


def _offline(name: str, error: str) -> MachineHealth:
    return MachineHealth(name, False, time.time(), None, {}, {}, error)


def _describe(exc: TransportError) -> str:
    """The transport's message and cause, without the host name (the result has it)."""
    return f"{exc.message} ({exc.cause})" if exc.cause else exc.message


def _no_answer(deadline: float, started: bool) -> str:
    if started:
        return (
            f"no answer within {deadline:g} s from the probe (killed): host overloaded, "
            "hung or link cut?"
        )
    return f"no answer within {deadline:g} s while connecting (host down, firewalled or link cut?)"


def _reply(out: bytes) -> dict[str, Any] | None:
    """The last JSON object line on stdout that has the facts."""
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        text = line.strip()
        if not text.startswith("{"):
            continue
        with contextlib.suppress(ValueError):
            data = json.loads(text)
            if isinstance(data, dict) and "capabilities" in data:
                return data
    return None


def _silent_exit(code: int, err: bytes) -> str:
    """Why a probe that ended without facts failed: its last stderr line, else its status."""
    lines = err.decode("utf-8", "replace").strip().splitlines()
    if lines:
        return f"{lines[-1][:_SHOWN]} (exit {code})"
    return f"the probe exited with status {code} without an answer"


async def _ask(
    transport: Transport,
    host: Host,
    python: str | None,
    started: list[NodeProcess],
) -> tuple[dict[str, Any] | None, str | None]:
    """Run the probe to its end: (facts, None) or (None, why not)."""
    params = {"sample_s": SAMPLE_S}
    proc = await start_program(
        transport, host, python, SHIPPED, "corral.fleet.machinefacts:main", params
    )
    started.append(proc)
    proc.close_stdin()
    out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
    code = await proc.wait()
    facts = _reply(out)
    if facts is not None:
        return facts, None
    lost = getattr(proc, "lost", None)
    if isinstance(lost, TransportError):
        return None, _describe(lost)
    return None, _silent_exit(code, err)


async def _remote(
    transport: Transport, host: Host, python: str | None, deadline: float
) -> MachineHealth:
    started: list[NodeProcess] = []
    begin = time.monotonic()
    try:
        facts, error = await asyncio.wait_for(_ask(transport, host, python, started), deadline)
    except asyncio.TimeoutError:
        facts, error = None, _no_answer(deadline, bool(started))
    except CorralError as exc:
        facts = None
        error = _describe(exc) if isinstance(exc, TransportError) else str(exc)
    except asyncio.CancelledError:
        if started:
            await asyncio.shield(kill_and_wait(started[0], KILL_GRACE))
        raise
    except Exception as exc:  # a transport that did not translate its error: still offline
        facts, error = None, f"probe failed: {type(exc).__name__}: {exc}"
    if facts is None:
        if started:
            await kill_and_wait(started[0], KILL_GRACE)
        return _offline(host.name, error or "no answer")
    elapsed = time.monotonic() - begin
    took = facts.get("took_s")
    work = float(took) if isinstance(took, int | float) else 0.0
    return MachineHealth(
        name=host.name,
        online=True,
        checked=time.time(),
        latency_ms=max(elapsed - work, 0.0) * 1000.0,
        capabilities=dict(facts.get("capabilities") or {}),
        load=dict(facts.get("load") or {}),
        error=None,
    )


async def _local(host: Host, deadline: float) -> MachineHealth:
    try:
        return await asyncio.wait_for(asyncio.to_thread(local_health, host.name), deadline)
    except asyncio.TimeoutError:
        return _offline(host.name, f"no answer within {deadline:g} s from this machine")
    except OSError as exc:
        return _offline(host.name, f"cannot read this machine: {exc}")


async def probe_machines(
    transport: Transport,
    hosts: Sequence[Host],
    *,
    deadline: float = DEFAULT_DEADLINE,
    python: str | None = None,
) -> dict[str, MachineHealth]:
    """Probe every host in parallel; ``{name: MachineHealth}`` in host order.

    ``deadline`` bounds each host (connect, authentication, the probe and its
    answer); ``python`` is the interpreter to use where ``Host.python`` is unset
    (see :func:`corral.remote.python.candidates`). Never raises for a failed
    host; raises ValueError for a ``deadline`` that is not positive.
    """
    if not deadline > 0:
        raise ValueError(f"deadline must be positive, not {deadline!r}")
    results = await asyncio.gather(
        *(
            _local(h, deadline) if h.local else _remote(transport, h, python, deadline)
            for h in hosts
        )
    )
    return {r.name: r for r in results}
