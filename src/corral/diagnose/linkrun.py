"""Measure the link matrix: one :mod:`corral.diagnose.linkprobe` helper per host
(shipped over stdin, standard library only), then the round-robin rounds of
:func:`corral.diagnose.links.round_robin` (each pair both ways), then the ring.

Each helper serves a port on its host's training address and streams to the
peers it is told to; it exits on EOF, on ``exit`` and after its own time limit,
and every helper still there at the end is killed: nothing stays on a host.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.cluster.model import Host
from corral.diagnose.links import (
    LinkBudget,
    LinkMatrix,
    PairMeasure,
    RingMeasure,
    better,
    round_robin,
    to_recheck,
)
from corral.errors import CorralError
from corral.remote.python import start_program
from corral.transport.base import NodeProcess, Transport, kill_and_wait

__all__ = ["PROBE_MODULE", "measure_links"]

PROBE_MODULE = "corral.diagnose.linkprobe"
START_TIMEOUT = 30.0
_TAIL = 10


class _Broken(Exception):
    """A helper that ended, stayed silent or answered an error."""


@dataclass
class _Probe:
    host: Host
    addr: str
    proc: NodeProcess | None = None
    port: int | None = None
    error: str | None = None
    events: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    stderr: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=_TAIL))
    readers: list[asyncio.Task[None]] = field(default_factory=list)

    def why(self, default: str) -> str:
        tail = [line for line in self.stderr if line.strip()]
        return f"{default}: {tail[-1]}" if tail else default


async def _read_stdout(probe: _Probe) -> None:
    assert probe.proc is not None
    try:
        while True:
            try:
                line = await probe.proc.stdout.readline()
            except ValueError:
                continue
            if not line:
                return
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    await probe.events.put(event)
    finally:
        await probe.events.put(None)


async def _read_stderr(probe: _Probe) -> None:
    assert probe.proc is not None
    while True:
        try:
            line = await probe.proc.stderr.readline()
        except ValueError:
            continue
        if not line:
            return
        probe.stderr.append(line.decode(errors="replace").rstrip())


async def _next(probe: _Probe, timeout: float) -> dict[str, Any]:
    """The helper's next answer; _Broken when it ends or stays silent."""
    try:
        event = await asyncio.wait_for(probe.events.get(), timeout)
    except asyncio.TimeoutError:
        raise _Broken(f"no answer from {probe.host.name} within {timeout:g} s") from None
    if event is None:
        probe.error = probe.error or probe.why("the link helper exited")
        raise _Broken(probe.error)
    return event


async def _start(
    transport: Transport, probe: _Probe, python: str | None, limit: float, timeout: float
) -> None:
    params = {"bind": probe.addr, "max_seconds": limit}
    try:
        probe.proc = await asyncio.wait_for(
            start_program(
                transport, probe.host, python, [PROBE_MODULE], f"{PROBE_MODULE}:main", params
            ),
            timeout,
        )
    except asyncio.TimeoutError:
        probe.error = f"the link helper did not start within {timeout:g} s"
        return
    except (CorralError, OSError) as exc:
        probe.error = str(exc)
        return
    probe.readers = [
        asyncio.ensure_future(_read_stdout(probe)),
        asyncio.ensure_future(_read_stderr(probe)),
    ]
    try:
        ready = await _next(probe, timeout)
    except _Broken as exc:
        probe.error = probe.error or str(exc)
        return
    if ready.get("event") != "ready":
        probe.error = str(ready.get("message") or "the link helper did not get ready")
        return
    probe.port = int(ready["port"])


async def _ask(probe: _Probe, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
    assert probe.proc is not None
    probe.proc.write((json.dumps(cmd) + "\n").encode())
    answer = await _next(probe, timeout)
    if answer.get("event") == "error":
        raise _Broken(str(answer.get("message")))
    return answer


def _cmd(kind: str, peer: _Probe, budget: LinkBudget, seconds: float) -> dict[str, Any]:
    return {
        "cmd": kind,
        "addr": peer.addr or peer.host.address,
        "port": peer.port,
        "seconds": seconds,
        "bytes": budget.max_bytes,
        "pings": budget.pings,
    }


async def _pair(
    a: _Probe, b: _Probe, budget: LinkBudget, seconds: float, timeout: float
) -> PairMeasure:
    for p in (a, b):
        if p.error is not None or p.port is None:
            return PairMeasure(a.host.name, b.host.name, error=f"{p.host.name}: {p.error}")
    try:
        got = await _ask(a, _cmd("pair", b, budget, seconds), timeout)
    except _Broken as exc:
        return PairMeasure(a.host.name, b.host.name, error=str(exc))
    return PairMeasure(
        a.host.name,
        b.host.name,
        ab_gbs=float(got["out_gbs"]),
        ba_gbs=float(got["in_gbs"]),
        rtt_ms=None if got.get("rtt_ms") is None else float(got["rtt_ms"]),
    )


async def _ring(
    probes: Sequence[_Probe], budget: LinkBudget, seconds: float, timeout: float
) -> RingMeasure:
    live = [p for p in probes if p.error is None and p.port is not None]
    if len(live) < 2:
        return RingMeasure((), error="fewer than two hosts took part")
    order = list(zip(live, [*live[1:], live[0]], strict=True))

    async def one(src: _Probe, dst: _Probe) -> tuple[str, str, float | None]:
        try:
            got = await _ask(src, _cmd("ring", dst, budget, seconds), timeout)
        except _Broken:
            return src.host.name, dst.host.name, None
        return src.host.name, dst.host.name, float(got["gbs"])

    links = await asyncio.gather(*(one(s, d) for s, d in order))
    failed = [f"{a}->{b}" for a, b, v in links if v is None]
    return RingMeasure(tuple(links), error=f"failed: {', '.join(failed)}" if failed else None)


async def _stop(probe: _Probe) -> None:
    proc = probe.proc
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.write(b'{"cmd":"exit"}\n')
            proc.close_stdin()
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except (asyncio.TimeoutError, Exception):
            await kill_and_wait(proc, 5.0)
    for task in probe.readers:
        task.cancel()
    await asyncio.gather(*probe.readers, return_exceptions=True)


async def measure_links(
    transport: Transport,
    hosts: Sequence[Host],
    *,
    addresses: Mapping[str, str] | None = None,
    interfaces: Mapping[str, str] | None = None,
    python: Mapping[str, str | None] | None = None,
    budget: LinkBudget = LinkBudget(),  # noqa: B008
    start_timeout: float = START_TIMEOUT,
) -> LinkMatrix:
    """Measure every pair of ``hosts`` (both ways) and the ring; see the module docstring.

    ``addresses``: each host's address on the training network (its helper listens
    there and its peers connect to it; default: the host's own address, listening on
    every interface). ``python``: the interpreter per host name. Unreachable hosts
    are in ``host_errors``; their pairs carry the error.
    """
    began = time.monotonic()
    names = [h.name for h in hosts]
    seconds = budget.per_direction(len(hosts))
    rounds = round_robin(names)
    # every helper exits on its own after the whole plan's worst case
    timeout = 4 * seconds + 20.0
    limit = start_timeout + (len(rounds) + 1) * (2 * timeout) + 30.0
    probes = {h.name: _Probe(h, (addresses or {}).get(h.name, "")) for h in hosts}
    try:
        await asyncio.gather(
            *(
                _start(transport, p, (python or {}).get(n) or p.host.python, limit, start_timeout)
                for n, p in probes.items()
            )
        )
        pairs: list[PairMeasure] = []
        for pairing in rounds:
            pairs += await asyncio.gather(
                *(_pair(probes[a], probes[b], budget, seconds, 2 * timeout) for a, b in pairing)
            )
        for slow in to_recheck(names, pairs):  # once more, alone: busy, or slow?
            again = await _pair(probes[slow.a], probes[slow.b], budget, seconds, 2 * timeout)
            pairs[pairs.index(slow)] = better(slow, again)
        ring = await _ring(list(probes.values()), budget, seconds, timeout)
    finally:
        await asyncio.shield(asyncio.gather(*(_stop(p) for p in probes.values())))
    return LinkMatrix(
        hosts=names,
        pairs=pairs,
        ring=ring,
        interfaces=dict(interfaces or {}),
        addresses={n: p.addr or p.host.address for n, p in probes.items()},
        rounds=len(rounds),
        seconds_per_direction=seconds,
        max_bytes=budget.max_bytes,
        duration_s=time.monotonic() - began,
        host_errors={n: p.error for n, p in probes.items() if p.error is not None},
    )
