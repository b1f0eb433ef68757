"""The link matrix, pure part: who measures with whom when, how much, and who is slow.

Every pair of hosts is measured once, both directions, in rounds of a
round-robin tournament (the circle method): in each round every host is in at
most one pair, so no measurement shares a NIC with another. A pair's bandwidth
is its slower direction.

Scoring: the *reference* is the median over hosts of each host's best pair (what
this network does between healthy hosts, even when one host drags half the pairs
down: with 3 hosts and one bad NIC, 2 of 3 pairs are slow). A pair is slow below
``min_ratio`` x the reference or below the absolute floor ``min_gbs`` (GB/s), or
when it could not be measured. A host in more than half of its pairs' slow ones
is the *culprit* (the host behind the slow links: its NIC, cable or port); a
slow pair with no culprit at either end names both ends as suspects. A pair the
rounds found slow is measured once more, alone (:func:`to_recheck`), and keeps its
better measure (:func:`better`): a pair slow only while the machine was busy
elsewhere is not slow, a throttled link is slow both times.

Units: GB/s (10^9 bytes per second, as nccl-tests), round trips in ms.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_MIN_RATIO",
    "LinkBudget",
    "LinkMatrix",
    "LinkScore",
    "LinkThresholds",
    "PairMeasure",
    "RingMeasure",
    "better",
    "busbw",
    "round_robin",
    "score",
    "to_recheck",
]

#: A pair below this fraction of the reference is slow (a 10x throttle is far below,
#: a loaded but healthy machine's jitter far above).
DEFAULT_MIN_RATIO = 0.3
#: Time per direction of one pair, at most / at least (the budget divides down to it).
MAX_SECONDS = 0.5
MIN_SECONDS = 0.05
#: Bytes per direction of one pair, at most.
MAX_BYTES = 512 << 20


def round_robin(hosts: Sequence[str]) -> list[list[tuple[str, str]]]:
    """Rounds of pairs covering every pair of ``hosts`` exactly once, each host in at
    most one pair per round (circle method: n-1 rounds for even n, n for odd n)."""
    if len(set(hosts)) != len(hosts):
        raise ValueError(f"duplicate hosts: {list(hosts)}")
    slots: list[str | None] = list(hosts)
    if len(slots) % 2:
        slots.append(None)  # the bye
    n = len(slots)
    rounds: list[list[tuple[str, str]]] = []
    for _ in range(n - 1):
        pairs = []
        for i in range(n // 2):
            a, b = slots[i], slots[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((a, b))
        rounds.append(pairs)
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return [r for r in rounds if r]


def busbw(algbw: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: ``algbw * 2 (n - 1) / n``."""
    return algbw * 2 * (ranks - 1) / ranks if ranks > 0 else 0.0


@dataclass(frozen=True)
class LinkBudget:
    """How long the measurement may take: ``seconds`` for every pair and the ring
    together, split evenly over each direction (between :data:`MIN_SECONDS` and
    ``max_seconds``), and ``max_bytes`` per direction."""

    seconds: float = 12.0
    max_seconds: float = MAX_SECONDS
    max_bytes: int = MAX_BYTES
    pings: int = 20

    def __post_init__(self) -> None:
        if not self.seconds > 0 or not self.max_seconds > 0 or self.max_bytes < 1:
            raise ValueError("the links budget needs positive seconds and bytes")

    def per_direction(self, hosts: int) -> float:
        """Seconds one direction of one pair may take for ``hosts`` hosts."""
        rounds = len(round_robin([str(i) for i in range(hosts)])) if hosts > 1 else 0
        slots = 2 * rounds + 1  # each pair both ways, then the ring
        return max(MIN_SECONDS, min(self.max_seconds, self.seconds / slots))


@dataclass(frozen=True)
class LinkThresholds:
    """When a pair is slow: below ``min_ratio`` x the reference or ``min_gbs`` GB/s.
    ``fail``: a culprit fails the check (else it warns)."""

    min_ratio: float = DEFAULT_MIN_RATIO
    min_gbs: float = 0.0
    fail: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_ratio < 1.0:
            raise ValueError(f"min_ratio must be in [0, 1), got {self.min_ratio:g}")
        if self.min_gbs < 0:
            raise ValueError(f"min_gbs must be >= 0, got {self.min_gbs:g}")


@dataclass(frozen=True)
class PairMeasure:
    """One pair: ``a -> b`` and ``b -> a`` in GB/s, the median round trip, or an error."""

    a: str
    b: str
    ab_gbs: float | None = None
    ba_gbs: float | None = None
    rtt_ms: float | None = None
    error: str | None = None

    @property
    def gbs(self) -> float | None:
        """The pair's bandwidth: its slower direction (None when not measured)."""
        if self.error is not None or self.ab_gbs is None or self.ba_gbs is None:
            return None
        return min(self.ab_gbs, self.ba_gbs)

    def other(self, host: str) -> str:
        """The pair's other end."""
        return self.b if host == self.a else self.a

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "a": self.a,
            "b": self.b,
            "gbs": self.gbs,
            "ab_gbs": self.ab_gbs,
            "ba_gbs": self.ba_gbs,
            "rtt_ms": self.rtt_ms,
            "error": self.error,
        }


@dataclass(frozen=True)
class RingMeasure:
    """Every host sending to the next at once: GB/s per ``(sender, receiver)`` link.
    The slowest link bounds a ring all-reduce: its bus bandwidth is that link's."""

    links: tuple[tuple[str, str, float | None], ...]
    error: str | None = None

    @property
    def busbw_gbs(self) -> float | None:
        """The ring's bus bandwidth estimate (its slowest link), None if one failed."""
        values = [v for _, _, v in self.links]
        if not values or any(v is None for v in values):
            return None
        return min(v for v in values if v is not None)

    @property
    def slowest(self) -> tuple[str, str] | None:
        """``(sender, receiver)`` of the slowest link."""
        known = [(v, a, b) for a, b, v in self.links if v is not None]
        return (min(known)[1], min(known)[2]) if known else None

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "busbw_gbs": self.busbw_gbs,
            "slowest": list(self.slowest) if self.slowest else None,
            "links": [{"from": a, "to": b, "gbs": v} for a, b, v in self.links],
            "error": self.error,
        }


@dataclass
class LinkMatrix:
    """Everything measured: the pairs, the ring, and how (interface, address, sizes)."""

    hosts: list[str]
    pairs: list[PairMeasure]
    ring: RingMeasure | None = None
    interfaces: dict[str, str] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    rounds: int = 0
    seconds_per_direction: float = 0.0
    max_bytes: int = 0
    duration_s: float = 0.0
    allreduce: dict[str, Any] | None = None  # NCCL/gloo bus bandwidth, when measured
    host_errors: dict[str, str] = field(default_factory=dict)  # hosts that did not take part

    def pair(self, a: str, b: str) -> PairMeasure | None:
        """The measurement of ``a``-``b`` (either order)."""
        for p in self.pairs:
            if {p.a, p.b} == {a, b}:
                return p
        return None

    def to_json(self) -> dict[str, Any]:
        """JSON form (the check's data, the API's answer)."""
        return {
            "hosts": list(self.hosts),
            "pairs": [p.to_json() for p in self.pairs],
            "ring": self.ring.to_json() if self.ring else None,
            "interfaces": dict(self.interfaces),
            "addresses": dict(self.addresses),
            "rounds": self.rounds,
            "seconds_per_direction": round(self.seconds_per_direction, 4),
            "max_bytes": self.max_bytes,
            "duration_s": round(self.duration_s, 3),
            "allreduce": self.allreduce,
            "host_errors": dict(self.host_errors),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LinkMatrix:
        """The inverse of :meth:`to_json`."""
        ring = data.get("ring")
        return cls(
            hosts=list(data.get("hosts") or []),
            pairs=[
                PairMeasure(
                    str(p["a"]),
                    str(p["b"]),
                    p.get("ab_gbs"),
                    p.get("ba_gbs"),
                    p.get("rtt_ms"),
                    p.get("error"),
                )
                for p in data.get("pairs") or []
            ],
            ring=RingMeasure(
                tuple((str(x["from"]), str(x["to"]), x.get("gbs")) for x in ring["links"]),
                ring.get("error"),
            )
            if ring
            else None,
            interfaces=dict(data.get("interfaces") or {}),
            addresses=dict(data.get("addresses") or {}),
            rounds=int(data.get("rounds") or 0),
            seconds_per_direction=float(data.get("seconds_per_direction") or 0.0),
            max_bytes=int(data.get("max_bytes") or 0),
            duration_s=float(data.get("duration_s") or 0.0),
            allreduce=data.get("allreduce"),
            host_errors=dict(data.get("host_errors") or {}),
        )


@dataclass
class LinkScore:
    """The verdict over a :class:`LinkMatrix`.

    ``hosts`` maps each host to ``(verdict, detail)`` with verdict ``ok``, ``suspect``
    (in a slow pair nobody else explains) or ``culprit``.
    """

    reference_gbs: float | None
    threshold_gbs: float
    slow: list[tuple[str, str]]
    culprits: list[str]
    suspects: list[str]
    hosts: dict[str, tuple[str, str]]

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "reference_gbs": self.reference_gbs,
            "threshold_gbs": self.threshold_gbs,
            "slow_pairs": [list(p) for p in self.slow],
            "culprits": list(self.culprits),
            "suspects": list(self.suspects),
            "hosts": {h: {"verdict": v, "detail": d} for h, (v, d) in self.hosts.items()},
        }


def fmt_gbs(value: float | None) -> str:
    """A bandwidth for people: ``1.23 GB/s``, ``45.6 MB/s``."""
    if value is None:
        return "-"
    if value >= 1.0:
        return f"{value:.3g} GB/s"
    return f"{value * 1000:.3g} MB/s"


def _reference(matrix: LinkMatrix) -> float | None:
    best: list[float] = []
    for host in matrix.hosts:
        mine = [p.gbs for p in matrix.pairs if host in (p.a, p.b) and p.gbs is not None]
        if mine:
            best.append(max(mine))
    return statistics.median(best) if best else None


def score(matrix: LinkMatrix, thresholds: LinkThresholds = LinkThresholds()) -> LinkScore:
    """Judge ``matrix``: the slow pairs, the culprit hosts, a detail line per host."""
    reference = _reference(matrix)
    threshold = max(thresholds.min_gbs, (reference or 0.0) * thresholds.min_ratio)
    slow = [p for p in matrix.pairs if p.gbs is None or p.gbs < threshold]  # errors count as slow
    slow_keys = [(p.a, p.b) for p in slow]
    hosts: dict[str, tuple[str, str]] = {}
    culprits: list[str] = []
    for host in matrix.hosts:
        mine = [p for p in matrix.pairs if host in (p.a, p.b)]
        bad = [p for p in slow if host in (p.a, p.b)]
        if host in matrix.host_errors or (mine and 2 * len(bad) > len(mine)):
            culprits.append(host)
    suspects: list[str] = []
    for p in slow:
        if p.a not in culprits and p.b not in culprits:
            suspects += [h for h in (p.a, p.b) if h not in suspects]
    for host in matrix.hosts:
        mine = [p for p in matrix.pairs if host in (p.a, p.b)]
        values = [p.gbs for p in mine if p.gbs is not None]
        bad = [p for p in slow if host in (p.a, p.b)]
        peers = ", ".join(p.other(host) for p in bad)
        median = statistics.median(values) if values else None
        if host in matrix.host_errors:
            hosts[host] = ("culprit", f"not measured: {matrix.host_errors[host]}")
        elif host in culprits:
            errors = [p.error for p in bad if p.error]
            if errors and not values:
                why = f"no link measured: {errors[0]}"
            else:
                why = f"{len(bad)} of {len(mine)} links slow (median {fmt_gbs(median)}"
                if reference:
                    why += f", {(median or 0.0) / reference:.2g}x the network's "
                    why += fmt_gbs(reference)
                why += f"; to {peers})"
            hosts[host] = ("culprit", why)
        elif host in suspects:
            why = "; ".join(
                f"link to {p.other(host)} "
                + (f"failed: {p.error}" if p.error else f"slow: {fmt_gbs(p.gbs)}")
                for p in bad
                if p.a not in culprits and p.b not in culprits
            )
            hosts[host] = ("suspect", why + f" (below {fmt_gbs(threshold)})")
        else:
            detail = f"median {fmt_gbs(median)} to {len(values)} peer(s)"
            rtts = [p.rtt_ms for p in mine if p.rtt_ms is not None]
            if rtts:
                detail += f", rtt {statistics.median(rtts):.2g} ms"
            if bad:
                detail += f" (slow only to {peers})"
            hosts[host] = ("ok", detail)
    return LinkScore(
        reference_gbs=reference,
        threshold_gbs=threshold,
        slow=slow_keys,
        culprits=culprits,
        suspects=suspects,
        hosts=hosts,
    )


def to_recheck(hosts: Sequence[str], pairs: Sequence[PairMeasure]) -> list[PairMeasure]:
    """The measured pairs that the default thresholds find slow: each is measured
    once more (an unmeasured pair's error stands)."""
    slow = set(score(LinkMatrix(hosts=list(hosts), pairs=list(pairs))).slow)
    return [p for p in pairs if p.gbs is not None and ((p.a, p.b) in slow or (p.b, p.a) in slow)]


def better(first: PairMeasure, again: PairMeasure) -> PairMeasure:
    """A pair's better measure of two: each direction's faster, the shorter round
    trip (``again`` unmeasured: ``first``)."""
    if again.gbs is None or first.gbs is None:
        return first if first.gbs is not None else again

    def best(x: float | None, y: float | None, pick: Any) -> float | None:
        known = [v for v in (x, y) if v is not None]
        return pick(known) if known else None

    return PairMeasure(
        first.a,
        first.b,
        ab_gbs=best(first.ab_gbs, again.ab_gbs, max),
        ba_gbs=best(first.ba_gbs, again.ba_gbs, max),
        rtt_ms=best(first.rtt_ms, again.rtt_ms, min),
    )
