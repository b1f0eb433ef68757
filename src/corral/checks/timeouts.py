"""Check: the timeouts of an in-place (torchft) job are in the order that turns a
lost node into a heal, not a hang or a full restart (``--recovery in-place`` only).

What happens when a replica group is lost (torchft's Manager and Lighthouse, and
corral's supervisor):

1. the survivors' collective fails: at once when the peer's process died (its
   connection resets), or only at the process-group timeout (``timeout=`` of
   ``sdk.fault_tolerant``, ``TORCHFT_TIMEOUT_SEC``) when its host vanished and no
   reset ever comes;
2. they ask the Lighthouse for the next quorum. It leaves the lost group out once
   its heartbeat is older than the Lighthouse's heartbeat timeout, and waits for
   heartbeating stragglers up to its join timeout; a group that joins (a restarted
   one, healing) waits in its own quorum call for the survivors, who may still be
   blocked in step 1. The quorum call gives up after ``quorum_timeout``
   (``TORCHFT_QUORUM_TIMEOUT_SEC``) and the rank fails: a full restart. So
   **quorum timeout > process-group timeout + Lighthouse heartbeat timeout + join
   timeout** (the join timeout: ``--ft-join-timeout``);
3. corral declares the host lost after ``--host-timeout`` and tears down only its
   group; a hang (no rank progressed for ``--hang-timeout``) is treated as a stuck
   group instead, with every survivor stalled in steps 1-2 a suspect. So
   **--hang-timeout > process-group timeout + quorum timeout** (the survivors'
   longest stall torchft bounds itself) and **--hang-timeout > --host-timeout**.

The defaults are in that order (30 s, 60 s, 0.5 s + 10 s; 300 s and 20 s). The
process-group and quorum timeouts are the script's: corral sees them when the job
sets ``TORCHFT_TIMEOUT_SEC`` / ``TORCHFT_QUORUM_TIMEOUT_SEC`` (which override
``sdk.fault_tolerant``'s arguments: ``TORCHFT_TIMEOUT_SEC`` is its process group's
timeout, the gloo/NCCL connect included, and its Manager's), else assumes the SDK's
defaults and says so.
A wrong order warns (it never blocks a launch) with the setting to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status
from corral.contract import (
    FT_QUORUM_TIMEOUT_DEFAULT,
    FT_QUORUM_TIMEOUT_ENV,
    FT_TIMEOUT_DEFAULT,
    FT_TIMEOUT_ENV,
)
from corral.defaults import DEFAULT_FT_JOIN_TIMEOUT
from corral.recovery.hang import AUTO_HANG_TIMEOUT
from corral.recovery.health import DEFAULT_HOST_TIMEOUT
from corral.recovery.lighthouse import HEARTBEAT_TIMEOUT_MS

__all__ = ["NAME", "Timeouts", "check", "problems", "timeouts_of"]

NAME = "timeouts"


@dataclass(frozen=True)
class Timeouts:
    """The seconds that decide what a lost node becomes (module doc)."""

    process_group: float = FT_TIMEOUT_DEFAULT
    quorum: float = FT_QUORUM_TIMEOUT_DEFAULT
    hang: float = AUTO_HANG_TIMEOUT
    host: float = DEFAULT_HOST_TIMEOUT
    heartbeat: float = HEARTBEAT_TIMEOUT_MS / 1000
    join: float = DEFAULT_FT_JOIN_TIMEOUT
    assumed: tuple[str, ...] = ()  # the script's settings corral could not see
    # the env's torchft timeouts that are not whole seconds >= 1: (name, value)
    unusable: tuple[tuple[str, str], ...] = ()


def _seconds(env: Mapping[str, str], name: str, default: float) -> tuple[float, bool]:
    """``env[name]`` in seconds, or ``default`` (second: whether it was assumed)."""
    raw = env.get(name, "").strip()
    try:
        value = float(raw)
    except ValueError:
        return default, True
    return (value, False) if value > 0 else (default, True)


def _whole_seconds(raw: str) -> bool:
    """Whether torchft's Manager (``int(value)``) reads ``raw`` as at least 1 second."""
    try:
        return int(raw) >= 1
    except ValueError:
        return False


def timeouts_of(
    env: Mapping[str, str],
    *,
    hang_timeout: float | None,
    host_timeout: float,
    join_timeout: float = DEFAULT_FT_JOIN_TIMEOUT,
) -> Timeouts:
    """The job's timeouts as planned: its env (torchft's overrides), its options
    (``join_timeout``: the Lighthouse's, ``--ft-join-timeout``)."""
    pg, pg_assumed = _seconds(env, FT_TIMEOUT_ENV, FT_TIMEOUT_DEFAULT)
    quorum, quorum_assumed = _seconds(env, FT_QUORUM_TIMEOUT_ENV, FT_QUORUM_TIMEOUT_DEFAULT)
    assumed = (FT_TIMEOUT_ENV,) * pg_assumed + (FT_QUORUM_TIMEOUT_ENV,) * quorum_assumed
    unusable = tuple(
        (name, raw)
        for name in (FT_TIMEOUT_ENV, FT_QUORUM_TIMEOUT_ENV)
        if (raw := env.get(name, "").strip()) and not _whole_seconds(raw)
    )
    return Timeouts(
        process_group=pg,
        quorum=quorum,
        hang=AUTO_HANG_TIMEOUT if hang_timeout is None else hang_timeout,
        host=host_timeout,
        join=join_timeout,
        assumed=assumed,
        unusable=unusable,
    )


def problems(t: Timeouts) -> list[tuple[str, str]]:
    """Each rule ``t`` breaks: (what goes wrong, the fix naming the value needed)."""
    found: list[tuple[str, str]] = [
        (
            f"{name}={raw!r} is not a whole number of seconds (at least 1): torchft's "
            "Manager and sdk.fault_tolerant cannot read it, every rank fails at its start",
            f"set {name} (--env) to a whole number of seconds",
        )
        for name, raw in t.unusable
    ]
    lighthouse = t.heartbeat + t.join
    need = t.process_group + lighthouse
    if not t.quorum > need:
        found.append(
            (
                f"torchft's quorum timeout ({t.quorum:g} s) is not above the process-group "
                f"timeout ({t.process_group:g} s) + the Lighthouse's heartbeat and join "
                f"timeouts ({t.heartbeat:g} s + {t.join:g} s, --ft-join-timeout): a group "
                "waiting for a quorum gives up while its peers still wait out a lost node's "
                "collective, and the job restarts instead of healing",
                f"raise {FT_QUORUM_TIMEOUT_ENV} (--env) to >= {need + 1:g}, or lower "
                f"{FT_TIMEOUT_ENV}",
            )
        )
    stall = t.process_group + t.quorum
    if not t.hang > stall:
        found.append(
            (
                f"--hang-timeout ({t.hang:g} s) is not above the process-group timeout "
                f"({t.process_group:g} s) + torchft's quorum timeout ({t.quorum:g} s): the "
                "survivors of a lost node are called hung (and torn down) while torchft is "
                "still reconfiguring them",
                f"raise --hang-timeout to >= {stall + 1:g}",
            )
        )
    if not t.hang > t.host:
        found.append(
            (
                f"--hang-timeout ({t.hang:g} s) is not above --host-timeout ({t.host:g} s): "
                "a lost host is taken for a hang of the survivors before it is declared lost",
                f"raise --hang-timeout to >= {max(t.host, stall) + 1:g} (or lower --host-timeout)",
            )
        )
    return found


def check(ctx: CheckContext) -> CheckResult:
    """See the module docstring."""
    opts = ctx.options
    t = timeouts_of(
        opts.env,
        hang_timeout=opts.hang_timeout,
        host_timeout=opts.host_timeout,
        join_timeout=opts.ft_join_timeout,
    )
    found = problems(t)
    order = (
        f"process group {t.process_group:g} s + Lighthouse {t.heartbeat:g}+{t.join:g} s < "
        f"quorum {t.quorum:g} s; process group + quorum < hang {t.hang:g} s; "
        f"host {t.host:g} s < hang"
    )
    summary = ("out of order: " if found else "in order: ") + order
    if t.assumed:
        summary += f" (assumed sdk.fault_tolerant's defaults: {', '.join(t.assumed)} not set)"
    data = {
        "process_group_s": t.process_group,
        "quorum_s": t.quorum,
        "hang_s": t.hang,
        "host_s": t.host,
        "lighthouse_heartbeat_s": t.heartbeat,
        "lighthouse_join_s": t.join,
        "assumed": list(t.assumed),
        "problems": [what for what, _ in found],
    }
    status = HostCheck(Status.WARN if found else Status.PASS, "job-wide")
    return CheckResult.from_hosts(
        NAME,
        dict.fromkeys((h.name for h in ctx.cluster.hosts), status),
        summary=summary,
        warning="; ".join(what for what, _ in found) or None,
        fix_command="; ".join(fix for _, fix in found) or None,
        data=data,
    )
