"""A calibration's per-rank figures mapped onto the ranks a run plans (pure).

:func:`resolve_weights` gives one weight per planned rank, in the planner's
order: host by host as the cluster lists them, then by local rank on each host
(the global rank order of the ``python`` launcher; torchrun assigns global ranks
at its rendezvous, see ``docs/heterogeneous.md``). Hosts are matched by name
(or address); the weights are renormalised over the planned ranks, so a run on
some of the measured hosts keeps their relative speeds. :func:`resolve_fits`
gives, in the same order, the largest micro-batch each rank fits (exported as
``CORRAL_MICRO_BATCH_FITS`` beside the weights), :func:`resolve_overheads` each
rank's fixed per-step cost in examples (``CORRAL_STEP_OVERHEADS``: the split then
equalises step times, see ``sdk.equal_time_batches``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from corral.cluster.model import Cluster, Host
from corral.contract import MICRO_BATCH_FITS_ENV, STEP_OVERHEADS_ENV
from corral.errors import ConfigError
from corral.throughput.model import OPTION, Calibration, RankRate, load_calibration
from corral.throughput.weights import shares

__all__ = [
    "fits_env",
    "overheads_env",
    "planned_ranks",
    "resolve_fits",
    "resolve_overheads",
    "resolve_weights",
    "weights_from_rates",
]


def planned_ranks(cluster: Cluster, nproc_per_node: int | None) -> list[tuple[Host, int]]:
    """``(host, local_rank)`` of every rank the planner makes, in its order."""
    return [
        (host, local)
        for host in cluster.hosts
        for local in range(nproc_per_node if nproc_per_node is not None else host.slots)
    ]


def _host_ranks(calibration: Calibration, host: Host) -> list[RankRate]:
    for name in (host.name, host.address):
        found = calibration.host_ranks(name)
        if found:
            return found
    return []


def _rerun(cluster: Cluster, nproc: int | None) -> str:
    hosts = cluster.source or ",".join(h.name for h in cluster.hosts)
    extra = f" --nproc-per-node {nproc}" if nproc is not None else ""
    return f"re-run `corral calibrate --hosts {hosts}{extra}`"


def weights_from_rates(
    rates: Mapping[tuple[str, int], float], cluster: Cluster, nproc_per_node: int | None
) -> tuple[float, ...]:
    """Weights of the planned ranks from ``(host name, local rank) -> examples/s``
    (within noise: even); a planned rank without a rate is a ConfigError."""
    missing = [
        f"{host.name}:{local}"
        for host, local in planned_ranks(cluster, nproc_per_node)
        if (host.name, local) not in rates
    ]
    if missing:
        raise ConfigError(
            f"no throughput for {', '.join(missing)}; {_rerun(cluster, nproc_per_node)}",
            option=OPTION,
        )
    values = [rates[(h.name, local)] for h, local in planned_ranks(cluster, nproc_per_node)]
    split, _ = shares(values)
    return tuple(round(w, 6) for w in split)


def _matched(
    calibration_file: str | Path | Calibration, cluster: Cluster, nproc_per_node: int | None
) -> dict[tuple[str, int], RankRate]:
    """The measured rank of every planned ``(host name, local rank)``; ConfigError as
    :func:`resolve_weights` documents."""
    calibration = (
        calibration_file
        if isinstance(calibration_file, Calibration)
        else load_calibration(calibration_file)
    )
    matched: dict[tuple[str, int], RankRate] = {}
    for host in cluster.hosts:
        measured = _host_ranks(calibration, host)
        planned = nproc_per_node if nproc_per_node is not None else host.slots
        if not measured:
            raise ConfigError(
                f"host {host.name} is not in the calibration (measured: "
                f"{', '.join(calibration.hosts)}); {_rerun(cluster, nproc_per_node)}",
                option=OPTION,
            )
        if len(measured) != planned:
            raise ConfigError(
                f"host {host.name} ran {len(measured)} rank(s) in the calibration but this "
                f"run plans {planned} there; {_rerun(cluster, planned)}",
                option=OPTION,
            )
        for index, rank in enumerate(measured):
            matched[(host.name, index)] = rank
    return matched


def resolve_weights(
    calibration_file: str | Path | Calibration,
    cluster: Cluster,
    nproc_per_node: int | None,
) -> tuple[float, ...]:
    """One weight per planned rank (summing to 1) from a calibration file (or a
    loaded :class:`Calibration`), for ``JobSpec.workload_weights``.

    ConfigError (option ``--calibration``) when the file is missing or invalid, a
    host of the cluster was not measured, or it ran another number of ranks than
    planned; the message names the host and the ``corral calibrate`` to run.
    """
    matched = _matched(calibration_file, cluster, nproc_per_node)
    rates = {key: rank.examples_per_s for key, rank in matched.items()}
    return weights_from_rates(rates, cluster, nproc_per_node)


def resolve_fits(
    calibration_file: str | Path | Calibration,
    cluster: Cluster,
    nproc_per_node: int | None,
) -> tuple[int | None, ...]:
    """The largest micro-batch of every planned rank (None: no limit found), in the
    order of :func:`resolve_weights`; its ConfigErrors."""
    matched = _matched(calibration_file, cluster, nproc_per_node)
    return tuple(
        matched[(host.name, local)].fits for host, local in planned_ranks(cluster, nproc_per_node)
    )


def resolve_overheads(
    calibration_file: str | Path | Calibration,
    cluster: Cluster,
    nproc_per_node: int | None,
) -> tuple[float, ...]:
    """Every planned rank's fixed per-step cost in examples (``step_fixed_s`` times
    its rate; 0: not measured), in the order of :func:`resolve_weights`; its
    ConfigErrors."""
    matched = _matched(calibration_file, cluster, nproc_per_node)
    return tuple(
        round(matched[(host.name, local)].overhead_examples, 3)
        for host, local in planned_ranks(cluster, nproc_per_node)
    )


def overheads_env(overheads: Sequence[float]) -> dict[str, str]:
    """``CORRAL_STEP_OVERHEADS`` for ``overheads`` (plan order), or nothing when no
    rank has one (the proportional split)."""
    if not any(overheads):
        return {}
    return {STEP_OVERHEADS_ENV: ",".join(f"{k:g}" for k in overheads)}


def fits_env(fits: Sequence[int | None]) -> dict[str, str]:
    """``CORRAL_MICRO_BATCH_FITS`` for ``fits`` (plan order, ``0``: no limit), or
    nothing when no rank has a limit."""
    if not any(fits):
        return {}
    return {MICRO_BATCH_FITS_ENV: ",".join(str(f or 0) for f in fits)}
