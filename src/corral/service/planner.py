"""Choosing machines for a job and turning a request into an execution plan.

Score of a machine for a request (higher is better; ``suggest_machines`` sorts
by it, ``machine_selection: auto`` takes the best eligible ones)::

    score = 10 * free GPUs                      (GPUs of a machine no job is using)
          + 1 * smallest GPU memory, GiB
          + (100 - CPU %) / 10 + (100 - memory %) / 20     (current load)
          + 5 if the machine is in the preferred machines

A machine is eligible when it is online (a health check saw it), not busy, has
at least ``gpus_per_machine`` GPUs with ``min_gpu_memory`` GiB each, and at
least ``nproc_per_node`` slots for a CPU job. The reasons say why (not).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.cluster.model import Cluster
from corral.contract import JOB_CONFIG_ENV, MICRO_BATCH_FITS_ENV, adjust_config
from corral.errors import ConfigError, Conflict, Invalid
from corral.job.build import JobOptions, job_spec, weigh
from corral.job.describe import JobDescription
from corral.job.engine import dry_run
from corral.plan.display import command_lines, node_env
from corral.plan.launchers import template_fields
from corral.recovery.inplace import RecoveryPolicy
from corral.redact import is_secret, redact_env
from corral.service.calibration import server_calibration
from corral.service.machines import machine_host, machines_ssh
from corral.service.models import PASS_THROUGH, JobRequest, Suggestion
from corral.service.settings import ServerSettings
from corral.store.models import Machine
from corral.throughput.resolve import planned_ranks
from corral.words import plural

CONFIG_ENV = JOB_CONFIG_ENV
"""The env var carrying a job's (adjusted) config as JSON to every rank."""


def _free_gpus(m: Machine, busy: bool) -> int:
    return 0 if busy else int((m.capabilities or {}).get("gpu_count") or 0)


def _min_gpu_gib(m: Machine) -> float:
    mib = (m.capabilities or {}).get("gpu_memory_min_mib")
    return float(mib) / 1024 if mib else 0.0


def score(m: Machine, busy: bool, preferred: Sequence[str] = ()) -> float:
    """The machine's score (see the module doc)."""
    load = m.load or {}
    cpu = load.get("cpu_percent")
    mem = load.get("memory_percent")
    value = 10.0 * _free_gpus(m, busy) + _min_gpu_gib(m)
    value += (100.0 - float(cpu if cpu is not None else 50.0)) / 10.0
    value += (100.0 - float(mem if mem is not None else 50.0)) / 20.0
    if m.name in preferred or m.id in preferred:
        value += 5.0
    return round(value, 2)


def eligibility(m: Machine, request: JobRequest, busy_jobs: Sequence[str]) -> list[str]:
    """Why ``m`` cannot take the job (empty: it can)."""
    reasons: list[str] = []
    needs = request.resource_requirements
    if m.status != "online":
        seen = f": {m.last_error}" if m.last_error else ""
        reasons.append("never health-checked" if m.status == "unknown" else f"offline{seen}")
    if busy_jobs:
        reasons.append(f"busy with {', '.join(busy_jobs)}")
    caps = m.capabilities or {}
    gpus = int(caps.get("gpu_count") or 0)
    if needs.gpus_per_machine and gpus < needs.gpus_per_machine:
        reasons.append(f"{gpus} GPUs, {needs.gpus_per_machine} needed")
    if needs.min_gpu_memory and needs.gpus_per_machine:
        have = _min_gpu_gib(m)
        if have < needs.min_gpu_memory:
            reasons.append(f"{have:.1f} GiB per GPU, {needs.min_gpu_memory:g} needed")
    if not needs.gpus_per_machine and request.nproc_per_node and m.slots < request.nproc_per_node:
        reasons.append(f"{m.slots} slots, {request.nproc_per_node} ranks per node asked")
    return reasons


def _good_reasons(m: Machine, busy: bool) -> list[str]:
    caps, load = m.capabilities or {}, m.load or {}
    out = [f"online, {caps.get('cpus', '?')} CPUs"]
    if caps.get("gpu_count"):
        out.append(f"{caps['gpu_count']} free GPUs" if not busy else "GPUs in use")
    if load.get("cpu_percent") is not None:
        out.append(f"CPU {load['cpu_percent']:.0f}%")
    return out


def suggest(
    machines: Sequence[Machine],
    request: JobRequest,
    busy: dict[str, list[str]],
    preferred: Sequence[str] = (),
) -> list[Suggestion]:
    """Every machine ranked for ``request``: eligible first, by score."""
    out = []
    for m in machines:
        why_not = eligibility(m, request, busy.get(m.id, []))
        out.append(
            Suggestion(
                machine_id=m.id,
                name=m.name,
                score=score(m, bool(busy.get(m.id)), preferred),
                eligible=not why_not,
                reasons=why_not or _good_reasons(m, bool(busy.get(m.id))),
            )
        )
    out.sort(key=lambda s: (not s.eligible, -s.score, s.name))
    return out


@dataclass
class Selection:
    """The machines chosen for a job (node 0 first) and the ones passed over."""

    chosen: list[Machine]
    reasons: dict[str, list[str]] = field(default_factory=dict)
    rejected: list[Suggestion] = field(default_factory=list)


def select_machines(
    machines: Sequence[Machine],
    request: JobRequest,
    busy: dict[str, list[str]],
    preferred: Sequence[str] = (),
    chosen: Sequence[Machine] | None = None,
) -> Selection:
    """Pick ``num_machines`` machines (auto: the best eligible; manual: ``chosen``,
    each of which must be eligible). Conflict, with what is available and the
    suggestions, when the request cannot be met."""
    needs = request.resource_requirements
    ranked = suggest(machines, request, busy, preferred)
    by_id = {m.id: m for m in machines}
    if chosen is not None:
        bad = {
            m.name: eligibility(m, request, busy.get(m.id, []))
            for m in chosen
            if eligibility(m, request, busy.get(m.id, []))
        }
        if bad:
            raise Conflict(
                "selected machines cannot take the job: "
                + "; ".join(f"{n}: {', '.join(r)}" for n, r in bad.items()),
                details={"unavailable": bad, "suggestions": _dump(ranked)},
            )
        picked = list(chosen)
    else:
        eligible = [s for s in ranked if s.eligible]
        if len(eligible) < needs.num_machines:
            why_not = ", ".join(
                f"{s.name} {'; '.join(s.reasons)}" for s in ranked if not s.eligible
            )
            raise Conflict(
                f"{plural(needs.num_machines, 'machine')} needed, {len(eligible)} available "
                f"({len(machines)} registered)" + (f": {why_not}" if why_not else ""),
                details={
                    "needed": needs.num_machines,
                    "available": len(eligible),
                    "registered": len(machines),
                    "suggestions": _dump(ranked),
                },
            )
        picked = [by_id[s.machine_id] for s in eligible[: needs.num_machines]]
    picked_ids = {m.id for m in picked}
    scores = {s.machine_id: s for s in ranked}
    return Selection(
        chosen=picked,
        reasons={m.id: scores[m.id].reasons for m in picked},
        rejected=[s for s in ranked if s.machine_id not in picked_ids],
    )


def _dump(ranked: Sequence[Suggestion]) -> list[dict[str, Any]]:
    return [s.model_dump() for s in ranked]


def adjusted_config(request: JobRequest, world_size: int) -> dict[str, Any] | None:
    """The job's config as every rank gets it: with ``adjust_config``, the seed's
    adjustments (:func:`corral.sdk.scale_config` with ``scale_by="world_size"``;
    ranks other than 0 write under ``<output_dir>/rank-N``, see
    :func:`corral.sdk.job_config`)."""
    if request.config is None:
        return None
    config = dict(request.config)
    if not request.adjust_config:
        return config
    keys = request.config_scaling
    try:
        return adjust_config(
            config,
            world_size,
            rule=keys.rule,
            batch_size_key=keys.batch_size_key,
            lr_key=keys.lr_key,
            output_dir_key=keys.output_dir_key,
        )
    except ValueError as exc:
        raise Invalid(f"config: {exc}", details={"field": "config"}) from exc


def _command_launch(request: JobRequest) -> None:
    """``launcher: command`` has a valid ``command_template`` and no script; any other
    launcher has no template (Invalid naming the field)."""
    if request.launcher != "command":
        if request.command_template is not None:
            raise Invalid(
                f"command_template applies to launcher command only (launcher is "
                f"{request.launcher})",
                details={"field": "command_template"},
            )
        return
    for name in ("script", "plugin_name"):
        if getattr(request, name):
            raise Invalid(
                f"launcher command runs command_template on every machine and takes no {name} "
                "(put the script in the template)",
                details={"field": name},
            )
    if not request.command_template:
        raise Invalid(
            "launcher command needs a command_template", details={"field": "command_template"}
        )
    try:
        template_fields(request.command_template)
    except ConfigError as exc:
        raise Invalid(
            f"command_template: {exc.message}", details={"field": "command_template"}
        ) from exc


def script_of(request: JobRequest, settings: ServerSettings) -> str:
    """The script to run: ``script``, or ``<plugins_dir>/<plugin_name>/main.py``; empty
    for ``launcher: command`` (its ``command_template`` is the whole command)."""
    _command_launch(request)
    if request.launcher == "command":
        return ""
    if request.script and request.plugin_name:
        raise Invalid("give script or plugin_name, not both", details={"field": "script"})
    if request.script:
        return request.script
    if not request.plugin_name:
        raise Invalid("a job needs a script (or a plugin_name)", details={"field": "script"})
    if settings.plugins_dir is None:
        raise Invalid(
            "plugin_name needs the server started with --plugins-dir",
            details={"field": "plugin_name"},
        )
    main = settings.plugins_dir / request.plugin_name / "main.py"
    if not main.is_file():
        raise Invalid(
            f"plugin {request.plugin_name!r} has no {main}", details={"field": "plugin_name"}
        )
    return str(main)


def _calibration_cluster(machines: Sequence[Machine]) -> Cluster:
    """The job's nodes as a calibration names them: by machine name (or address);
    the ``corral calibrate`` an error suggests is for these machines."""
    hosts = tuple(machine_host(m) for m in machines)
    if all(m.local for m in machines):
        return Cluster(hosts, source=f"local:{len(machines)}")
    return Cluster(hosts, source=",".join(h.address or h.name for h in hosts))


def _local_names_note(machines: Sequence[Machine]) -> str:
    """For local machines not named as ``corral calibrate --hosts local:N`` names its
    nodes: how to make the two match."""
    if not all(m.local for m in machines):
        return ""
    names = [f"local-{i}" for i in range(len(machines))]
    if [m.name for m in machines] == names:
        return ""
    return (
        f" (a local:{len(machines)} calibration names its nodes {', '.join(names)}: "
        "register the local machines under those names to use it)"
    )


def workload_weights(
    request: JobRequest, machines: Sequence[Machine], nproc_per_node: int | None
) -> list[float]:
    """One weight per planned rank (plan order, summing to 1) from the request's
    ``workload_weights``; empty for an even split and for a ``calibration``, which
    weighs the job's description as ``corral run --calibration`` does (:func:`weighed`).
    Invalid naming the field."""
    if request.calibration is not None and request.workload_weights is not None:
        raise Invalid(
            "give calibration or workload_weights, not both", details={"field": "calibration"}
        )
    if request.calibration is None and request.workload_weights is None:
        if request.rebalance:
            raise Invalid(
                "rebalance needs a calibration (or workload_weights)",
                details={"field": "rebalance"},
            )
        return []
    if request.calibration is not None:
        return []
    cluster = _calibration_cluster(machines)
    given = request.workload_weights or []
    world = len(planned_ranks(cluster, nproc_per_node))
    if len(given) != world:
        raise Invalid(
            f"workload_weights: {len(given)} weights for {world} planned ranks (one per rank, "
            "machine by machine, then local rank)",
            details={"field": "workload_weights"},
        )
    total = sum(given)
    return [round(w / total, 6) for w in given]


def weighed(
    description: JobDescription, request: JobRequest, machines: Sequence[Machine]
) -> JobDescription:
    """``description`` weighed by the request's ``calibration`` (the ranks' weights and,
    where its ranks found one, the largest micro-batch each fits) with the builder's
    :func:`~corral.job.build.weigh`, as ``corral run --calibration`` weighs its job;
    as is without one. Invalid naming the field when it does not fit the machines."""
    if request.calibration is None:
        return description
    calibration = server_calibration(request.calibration)
    try:
        return weigh(description, calibration, names=_calibration_cluster(machines)).description
    except ConfigError as exc:
        raise Invalid(
            f"calibration: {exc.message}{_local_names_note(machines)}",
            details={"field": "calibration"},
        ) from exc


def job_description(
    job_id: str,
    request: JobRequest,
    machines: Sequence[Machine],
    settings: ServerSettings,
    *,
    weights: Sequence[float] | None = None,
    owner: str | None = None,
) -> JobDescription:
    """The one job description of an API request on ``machines``: what is stored as
    the plan and what the supervisor process runs, as is (it holds the real secret
    env values, which its JSON never does). ``weights``: the ranks' workload weights
    as planned (default: resolved now from the request's calibration or
    workload_weights); ``owner``: who it is planned for (its trackers record them)."""
    needs = request.resource_requirements
    nproc = needs.gpus_per_machine or request.nproc_per_node
    env = dict(request.env)
    world = sum(nproc or m.slots for m in machines)
    config = adjusted_config(request, world)
    if config is not None:
        env[CONFIG_ENV] = json.dumps(config, separators=(",", ":"))
    if any(m.local for m in machines) and not all(m.local for m in machines):
        raise Invalid(
            "a job cannot mix local machines and SSH machines",
            details={"machines": [m.name for m in machines]},
        )
    script = script_of(request, settings)
    planned = weights is not None
    if weights is None:
        weights = workload_weights(request, machines, nproc)
    if not os.path.isabs(script) and os.path.isfile(script):
        script = os.path.abspath(script)  # relative to the server's directory
    given = {name: getattr(request, name) for name in PASS_THROUGH}
    options = JobOptions(
        command=(script, *request.args),
        launcher=request.launcher,
        job_id=job_id,
        owner=owner,
        run_dir=str(settings.run_dir),
        nproc_per_node=nproc,
        env=env,
        secret_env=tuple(request.secret_env),
        code_dir=request.code_dir or _code_dir(script, given["workdir"]),
        workload_weights=tuple(weights),
        track=tuple(request.track),
        **given,
    )
    _check_recovery(options, len(machines))
    cluster = Cluster(tuple(machine_host(m) for m in machines), source="corral serve")
    description = JobDescription(options, cluster, machines_ssh(machines, settings))
    return description if planned else weighed(description, request, machines)


def _check_recovery(options: JobOptions, machines: int) -> None:
    """Refuse an in-place job its machines or launcher cannot run (Invalid naming the
    request's field), as ``corral run`` refuses it."""
    try:
        policy = RecoveryPolicy(options.recovery, options.spares, options.ft_join_timeout)
        policy.check(options.launcher or "torchrun", machines, options.min_nodes)
    except ConfigError as exc:
        field = (exc.option or "--recovery").lstrip("-").replace("-", "_")
        raise Invalid(
            f"{field}: {exc.message} ({machines} machine(s) chosen)", details={"field": field}
        ) from exc


def _code_dir(script: str, workdir: str | None) -> str | None:
    """The tree the pre-flight compares with the hosts' when the request names none:
    the script's directory here (never the server's own directory, which holds its
    database and nothing of the job's)."""
    if workdir is not None:
        return None  # the check finds the tree for --workdir itself
    return os.path.dirname(script) if os.path.isabs(script) else None


def weight_rows(description: JobDescription) -> list[dict[str, Any]] | None:
    """The plan's ``workload_weights``: ``{host, node_rank, local_rank, weight}`` per
    rank in plan order, and ``fits`` (the largest micro-batch it fits, None: no limit,
    as the job's status shows it); None for an even split."""
    options, cluster = description.options, description.cluster
    if not options.workload_weights:
        return None
    ranks = planned_ranks(cluster, options.nproc_per_node)
    node_of = {h.name: i for i, h in enumerate(cluster.hosts)}
    rows: list[dict[str, Any]] = [
        {
            "host": host.name,
            "node_rank": node_of[host.name],
            "local_rank": local,
            "weight": w,
            "fits": None,
        }
        for (host, local), w in zip(ranks, options.workload_weights, strict=True)
    ]
    raw = options.env.get(MICRO_BATCH_FITS_ENV, "").split(",")
    if len(raw) == len(rows) and any(f.strip() not in ("", "0") for f in raw):
        for row, fit in zip(rows, raw, strict=True):
            row["fits"] = int(fit) if fit.strip().isdigit() and int(fit) > 0 else None
    return rows


def execution_plan(description: JobDescription, selection: Selection) -> dict[str, Any]:
    """The plan as the API shows it: machines (and why), master, per-node commands
    and env exactly as ``corral plan`` prints them (secret values redacted)."""
    options = description.options
    prepared = dry_run(job_spec(options), description.cluster)
    nodes = []
    for cmd in prepared.commands:
        nodes.append(
            {
                "host": cmd.host.name,
                "node_rank": cmd.node_rank,
                "ranks": [r.rank for r in cmd.ranks] or None,
                "nproc": cmd.nproc,
                "cwd": cmd.cwd,
                "env": node_env(cmd),
                "commands": [{"label": c.label, "line": c.line} for c in command_lines(cmd)],
            }
        )
    master = prepared.commands[0] if prepared.commands else None
    master_cmd = next((c for c in prepared.commands if c.hosts_master), master)
    config_json = options.env.get(CONFIG_ENV)
    script, *args = options.command or [""]
    return {
        "job_id": options.job_id,
        "launcher": prepared.spec.launcher,
        "script": script,
        "args": args,
        "command_template": options.command_template,
        "world_size": prepared.world_size,
        "num_machines": len(selection.chosen),
        "master": {
            "host": master_cmd.host.name if master_cmd else None,
            "address": master_cmd.master_addr if master_cmd else None,
            "port": master_cmd.master_port if master_cmd else None,
        },
        "machines": [
            {"id": m.id, "name": m.name, "node_rank": i, "reasons": selection.reasons.get(m.id, [])}
            for i, m in enumerate(selection.chosen)
        ],
        "rejected": [s.model_dump() for s in selection.rejected],
        "nodes": nodes,
        "config": None if config_json is None else json.loads(config_json),
        "env": redact_env(
            {k: v for k, v in options.env.items() if k != CONFIG_ENV}, options.secret_env
        ),
        "fault_tolerance": {
            "max_restarts": options.max_restarts,
            "checkpoint_dir": options.checkpoint_dir,
            "hang_timeout": options.hang_timeout,
            "recovery": options.recovery,
            "spares": options.spares,
            "ft_join_timeout": options.ft_join_timeout,
        },
        "preflight": options.preflight,
        "workload_weights": weight_rows(description),
        "rebalance": options.rebalance,
    }


def stored_request(request: JobRequest) -> dict[str, Any]:
    """The request as stored and returned: secret env values redacted."""
    data = request.model_dump(mode="json")
    data["env"] = redact_env(request.env, request.secret_env)
    return data


def has_secrets(request: JobRequest) -> bool:
    """Whether the request carries a secret env value (kept only in memory)."""
    return any(is_secret(k, request.secret_env) for k in request.env)
