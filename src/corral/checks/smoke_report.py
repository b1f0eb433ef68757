"""The smoke test's state on the coordinator and its verdict (:mod:`corral.checks.smoke`).

What each host's runner said (:class:`HostRun`), the test's shared state
(:class:`SmokeState`, which also sizes the join window from the runners'
machines) and the :class:`~corral.checks.result.CheckResult` built from them:
a verdict per host, how many hosts joined and which were late, and the command
to run next.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from corral.checks.joinwindow import RunnerFacts, join_window, late_summary
from corral.checks.result import CheckResult, HostCheck, Status
from corral.checks.smoke_host import WAITING

if TYPE_CHECKING:
    from corral.cluster.model import Host
    from corral.transport.base import NodeProcess, Transport

CHECK_NAME = "collective"
#: Late hosts named one by one in the error; more are counted (joinwindow.late_summary).
SHOWN_LATE = 3

_TAIL_LINES = 20


@dataclass
class HostRun:
    """What the coordinator learned about one host's runner."""

    host: Host
    ranks: list[int]
    env: dict[str, str]
    python: str | None
    proc: NodeProcess | None = None
    start_error: str | None = None
    joined: set[int] = field(default_factory=set)
    errors: list[tuple[int | None, str, str]] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # ranks rank 0 named
    exit_code: int | None = None
    stopped: bool = False  # we told it to stop before it exited
    killed: str | None = None  # why the runner killed its workers (e.g. "deadline")
    worker_exits: dict[int, int] = field(default_factory=dict)
    facts: RunnerFacts | None = None  # the runner's machine and CPUs
    import_s: list[float] = field(default_factory=list)  # each joined rank's torch import
    stderr: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=_TAIL_LINES)
    )

    @property
    def all_joined(self) -> bool:
        return set(self.ranks) <= self.joined

    @property
    def blamed(self) -> list[tuple[int | None, str, str]]:
        return [e for e in self.errors if e[1] != WAITING]


@dataclass
class SmokeState:
    """Shared state of one smoke test on the coordinator."""

    transport: Transport
    runs: list[HostRun]
    args: dict[str, Any]
    join_deadline: float  # the hosts' own (the largest window there can be)
    deadline: float
    began: float = 0.0
    base: float = 0.0  # the window asked for
    window: float = 0.0  # the window sized for the machines: late ranks are stopped after it
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    timed_out: bool = False
    first_failure: str | None = None
    result: dict[str, Any] | None = None

    def resize(self) -> None:
        """The join window for what the runners said about their machines."""
        facts = {
            r.host.name: r.facts
            or RunnerFacts(len(r.ranks), None, len(r.ranks))  # not yet: one wave
            for r in self.runs
        }
        self.window = join_window(self.base, facts)

    @property
    def all_joined(self) -> bool:
        return all(r.all_joined for r in self.runs)

    def fail(self, host: str) -> None:
        if self.first_failure is None:
            self.first_failure = host
        self.abort.set()


def _tail(run: HostRun) -> str:
    lines = [line for line in run.stderr if line.strip()]
    for line in reversed(lines):  # the most telling line: an error, else the last one
        if "Error" in line or "error" in line or "No module named" in line:
            return line.strip()
    return lines[-1].strip() if lines else ""


def late(smoke: SmokeState) -> None:
    """The sized join window is over: the ranks that did not join are missing."""
    for run in smoke.runs:
        if run.start_error is None and not run.missing and not run.all_joined:
            run.missing = [r for r in run.ranks if r not in run.joined]


def verdict(smoke: SmokeState, run: HostRun, seconds: float) -> HostCheck:
    n = len(run.ranks)
    joined = f"joined, {n} rank{'s' if n != 1 else ''}"
    if run.start_error is not None:
        return HostCheck(Status.FAIL, f"never joined: {run.start_error}")
    blamed = run.blamed
    if blamed:
        seen = list(dict.fromkeys(f"rank {r}: {m}" if r is not None else m for r, _, m in blamed))
        text = "; ".join(seen[:2]) + (f" (+{len(seen) - 2} more)" if len(seen) > 2 else "")
        return HostCheck(Status.FAIL, text if run.all_joined else f"never joined: {text}")
    if run.missing:
        ranks = ", ".join(str(r) for r in sorted(set(run.missing)))
        why = f"rank{'s' if len(set(run.missing)) > 1 else ''} {ranks} did not join within "
        why += f"{seconds:g} s"
        tail = _tail(run)
        return HostCheck(Status.FAIL, f"never joined: {why}" + (f" ({tail})" if tail else ""))
    if run.killed == "deadline" and not run.stopped:
        if smoke.result is not None:
            return HostCheck(Status.FAIL, f"its ranks did not exit within {seconds:g} s")
        if run.all_joined:
            return HostCheck(
                Status.FAIL, f"joined, but the all-reduce did not finish within {seconds:g} s"
            )
        return HostCheck(Status.FAIL, f"never joined within {seconds:g} s")
    if run.exit_code not in (None, 0) and not run.stopped and not run.errors:
        tail = _tail(run) or _exits(run) or f"the runner exited with code {run.exit_code}"
        if "No module named" in tail:
            tail = f"corral cannot be imported there ({tail}); install it or pass --python"
        return HostCheck(Status.FAIL, tail if run.all_joined else f"never joined: {tail}")
    if run.all_joined:
        return HostCheck(Status.PASS, joined)
    if smoke.timed_out:
        return HostCheck(Status.FAIL, f"never joined within {seconds:g} s")
    if run.proc is None:
        return HostCheck(Status.SKIP, "not started: the test stopped first")
    other = smoke.first_failure or "another host"
    return HostCheck(Status.SKIP, f"not tested: stopped when {other} failed")


def _exits(run: HostRun) -> str:
    parts = []
    for rank, code in sorted(run.worker_exits.items()):
        sig = f" (signal {code - 128})" if code > 128 else ""
        parts.append(f"rank {rank} exited with code {code}{sig}")
    return "; ".join(parts)


def _fmt_size(size: int) -> str:
    mib = size / (1 << 20)
    if mib >= 1:
        return f"{mib:g} MiB" if mib == int(mib) else f"{mib:.1f} MiB"
    return f"{size / 1024:.0f} KiB"


def _fix(smoke: SmokeState, verdicts: Mapping[str, HostCheck]) -> tuple[str | None, str]:
    """A command to run next, and a hint for the error line."""
    kinds = {k for run in smoke.runs for _, k, _ in run.blamed}
    starts = [r.host.name for r in smoke.runs if r.start_error is not None]
    master = smoke.args["master_addr"]
    port = smoke.args["port"]
    if "store" in kinds:
        return f"ss -ltnp 'sport = :{port}'", ""
    if starts:
        return "corral ping", "check that the host is up and reachable over SSH"
    if kinds & {"torch"} or any(
        "No module named" in v.detail or "interpreter" in v.detail for v in verdicts.values()
    ):
        return (
            "corral exec -- python3 -c 'import corral, torch'",
            "install corral and torch there, or pass --python",
        )
    if kinds & {"connect", "init", "allreduce"} or any(r.missing for r in smoke.runs):
        return (
            "corral exec -- ip -br addr",
            f"check that every host reaches {master}:{port} and each other; set "
            "--gloo-interface/--nccl-interface (GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME) to "
            "the interface the hosts share",
        )
    return None, ""


def report(smoke: SmokeState, seconds: float, backend: str, size_bytes: int) -> CheckResult:
    verdicts = {run.host.name: verdict(smoke, run, seconds) for run in smoke.runs}
    ok = smoke.result is not None and all(v.status is Status.PASS for v in verdicts.values())
    if not ok and not any(v.status is Status.FAIL for v in verdicts.values()):
        # nobody to blame, yet no result: the collective itself hung or died
        why = (
            f"joined, but the all-reduce did not finish within {seconds:g} s"
            if smoke.timed_out
            else "joined, but no all-reduce result came back"
        )
        verdicts = {
            name: HostCheck(Status.FAIL, why)
            if v.status is Status.PASS
            else HostCheck(Status.FAIL, f"never joined within {seconds:g} s")
            for name, v in verdicts.items()
        }
    world = sum(len(run.ranks) for run in smoke.runs)
    never = [n for n, v in verdicts.items() if v.detail.startswith("never joined")]
    joined = [run.host.name for run in smoke.runs if run.all_joined]
    late = [run.host.name for run in smoke.runs if not run.all_joined]
    imports = [t for run in smoke.runs for t in run.import_s]
    timed_late = bool(late) and (smoke.timed_out or any(run.missing for run in smoke.runs))
    res = smoke.result or {}
    data: dict[str, Any] = {
        "backend": res.get("backend", backend),
        "world_size": world,
        "bus_bandwidth_gbps": res.get("busbw_gbps"),
        "algbw_gbps": res.get("algbw_gbps"),
        "latency_ms": res.get("latency_ms"),
        "size_bytes": int(res.get("size_bytes", size_bytes)),
        "iterations": res.get("iterations", smoke.args["iterations"]),
        "never_joined": never,
        "ranks": {run.host.name: run.ranks for run in smoke.runs},
        "join_window_s": round(seconds, 1),
        "joined_hosts": joined,
        "import_s": {run.host.name: max(run.import_s) for run in smoke.runs if run.import_s},
    }
    if ok:
        summary = (
            f"all-reduce {_fmt_size(data['size_bytes'])} x {world} ranks ({data['backend']}): "
            f"{data['bus_bandwidth_gbps']:.3g} GB/s bus bandwidth, "
            f"{data['latency_ms']:.3g} ms"
        )
        return CheckResult.from_hosts(CHECK_NAME, verdicts, summary=summary, data=data)
    fix, hint = _fix(smoke, verdicts)
    failing = [(n, v.detail) for n, v in verdicts.items() if v.status is Status.FAIL]
    error = "; ".join(f"{n}: {d}" for n, d in failing)
    if timed_late and len(late) > SHOWN_LATE:
        error = late_summary(joined, late, seconds, imports)
    elif timed_late:
        error += f"; {late_summary(joined, late, seconds, imports, named=False)}"
    if hint:
        error += f" ({hint})"
    if timed_late:
        summary = late_summary(joined, late, seconds, ())
    elif never:
        summary = f"{', '.join(never)} never joined the all-reduce"
    else:
        summary = f"all-reduce across {world} ranks failed on {', '.join(n for n, _ in failing)}"
    return CheckResult.from_hosts(
        CHECK_NAME, verdicts, summary=summary, error=error, fix_command=fix, data=data
    )
