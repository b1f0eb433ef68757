"""Request and response bodies of the service (pydantic; the API's schema).

Every field the seed's API uses keeps its name (``resource_requirements``,
``machine_selection``, ``selected_machines``, ``plugin_name``, ``config``...).
Secrets: a machine holds a key *path* or the *name* of an environment variable
with its password, never a password; ``env`` values of keys named like secrets
(or listed in ``secret_env``) are redacted in everything the service returns or
stores (they reach only the job's supervisor process, over its stdin).
"""

from __future__ import annotations

import ipaddress
import math
import re
import typing
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from corral.contract import is_env_name
from corral.errors import ConfigError
from corral.job.schema import JobOptions, default_of, options_of
from corral.plan.spec import ServiceLauncher
from corral.redact import is_secret, looks_secret
from corral.service.statusparts import GroupChange, HangOut, NodeStatus, StragglerOut
from corral.track.targets import MAX_TARGETS, parse_targets

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
#: How deep a free-form JSON value (a job's ``config``) may nest.
MAX_JSON_DEPTH = 64
#: Bounds of the lists and maps of a body (the server's request-size limit bounds the rest).
MAX_ITEMS = 4096
MAX_AFTER = 64
"""The most jobs one job may wait for (``after``)."""
MAX_ENV = 1024
MAX_LABELS = 64
Ref = Annotated[str, Field(min_length=1, max_length=255)]
"""A machine id or name in a list."""
Arg = Annotated[str, Field(max_length=65536)]
Interface = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[^\s\x00]+$")]
"""A network interface (or NCCL's ``^docker,lo`` / ``=eth0`` forms): no blank."""


class _Body(BaseModel):
    """A request body: no unknown field, finite numbers only, no NUL in any string (nor
    in ``config``), free-form JSON at most :data:`MAX_JSON_DEPTH` levels deep."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _plain_json(cls, value: Any) -> Any:
        _check_json(value, "", 0)
        return value


def _check_json(value: Any, where: str, depth: int) -> None:
    """Refuse a NUL in a string or key, a non-finite number and nesting deeper than
    :data:`MAX_JSON_DEPTH` (the store and the response encoder cannot take them)."""
    at = f" (at {where})" if where else ""
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        if "\0" in value:
            raise ValueError(f"must not contain a NUL character{at}")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"must be a finite number{at}")
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\0" in key:
                raise ValueError(f"a key must not contain a NUL character{at}")
            _check_json(item, f"{where}.{key}" if where else str(key), depth + 1)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]", depth + 1)


HOST_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9._-]{0,252})$")
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")


def is_host(value: str) -> bool:
    """Whether ``value`` is a host name, an ssh alias of the same characters, or an
    IPv4/IPv6 address."""
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        return bool(HOST_RE.match(value)) and ".." not in value


class MachineIn(_Body):
    """A machine to register: an SSH host, or ``local: true`` for a simulated node
    on the server's own machine (the ``local:N`` of the CLI)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "gpu1",
                    "host": "10.0.0.11",
                    "port": 22,
                    "user": "ml",
                    "key_path": "~/.ssh/id_ed25519",
                    "slots": 2,
                    "labels": {"rack": "a"},
                },
                {"name": "sim1", "local": True, "slots": 2},
            ]
        },
    )

    name: str = Field(pattern=NAME_PATTERN, description="Unique name; log prefixes show it.")
    host: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description="Address or ssh alias (default: the name). Not used for local machines.",
    )
    port: int | None = Field(None, ge=1, le=65535)
    user: str | None = Field(None, min_length=1, max_length=64)
    key_path: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Path of the SSH private key on the server.",
    )
    password_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
        description="NAME of an environment variable of the server holding the SSH "
        "password (never the password itself).",
    )
    slots: int = Field(1, ge=1, le=1024, description="Ranks the machine runs by default.")
    labels: dict[
        Annotated[str, Field(min_length=1, max_length=63)], Annotated[str, Field(max_length=255)]
    ] = Field(default_factory=dict, max_length=MAX_LABELS)
    local: bool = Field(False, description="A simulated node on the server's machine.")
    python: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Interpreter on the machine (default: found there).",
    )

    @field_validator("host", "user")
    @classmethod
    def _not_an_option(cls, value: str | None) -> str | None:
        # ssh would read "-oProxyCommand=..." as an option, whatever comes before it
        if value is not None and value.startswith("-"):
            raise ValueError("must not start with '-'")
        return value

    @field_validator("host")
    @classmethod
    def _host_syntax(cls, value: str | None) -> str | None:
        if value is not None and not is_host(value):
            raise ValueError(
                "must be a host name, an IPv4 or IPv6 address or an ssh alias (letters, "
                "digits, '.', '-', '_'; the user goes in the field user)"
            )
        return value

    @field_validator("user")
    @classmethod
    def _user_syntax(cls, value: str | None) -> str | None:
        if value is not None and not USER_RE.match(value):
            raise ValueError("must be a user name (letters, digits, '.', '_', '-')")
        return value

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data: Any) -> Any:
        # A missing name reaches the field validator below, so the error names the field.
        if isinstance(data, dict) and "name" not in data:
            return {**data, "name": None}
        return data

    @field_validator("name", mode="before")
    @classmethod
    def _name_given(cls, value: Any) -> Any:
        if value is None:
            raise PydanticCustomError(
                "missing",
                'every machine needs a name, a local one too (e.g. {"name": "sim1", '
                '"local": true}; `corral machine add --local` picks local-0, local-1, ...)',
            )
        return value


class MachineOut(BaseModel):
    """A registered machine and what the last health check saw (no secret)."""

    id: str
    name: str
    host: str
    port: int | None
    user: str | None
    key_path: str | None
    password_env: str | None
    slots: int
    labels: dict[str, str]
    local: bool
    python: str | None
    created: float
    status: Literal["online", "offline", "busy", "unknown"]
    last_seen: float | None
    last_checked: float | None
    last_error: str | None
    latency_ms: float | None
    capabilities: dict[str, Any]
    load: dict[str, Any]
    running_jobs: list[str]


class NetworkStatus(BaseModel):
    """Aggregate health of every machine."""

    total: int
    online: int
    offline: int
    busy: int
    unknown: int
    machines: list[MachineOut]


class ResourceRequirements(_Body):
    """What a distributed job needs (seed: ``resource_requirements``)."""

    num_machines: int = Field(1, ge=1, le=4096)
    gpus_per_machine: int = Field(
        0,
        ge=0,
        le=1024,
        description="GPUs (= ranks) per machine; 0 for CPU jobs (ranks: nproc_per_node "
        "or the machine's slots).",
    )
    min_gpu_memory: float = Field(0, ge=0, description="Minimum memory per GPU, GiB.")


class ConfigScaling(_Body):
    """How ``adjust_config`` scales a config (see ``corral.sdk.scale_config``)."""

    batch_size_key: str = "batch_size"
    lr_key: str = "learning_rate"
    output_dir_key: str = "output_dir"
    rule: Literal["linear", "sqrt", "none"] = "linear"


OWN: Mapping[str, str] = {
    "command": "script and args (a path on the machines, its arguments)",
    "launcher": "the launchers of a served job only (ServiceLauncher), default torchrun",
    "env": "a JSON object, its keys checked; secret values found by value too",
    "secret_env": "a list of the env keys (bounded)",
    "workload_weights": "each weight a positive finite number (bounded list)",
    "track": "each target checked (mlflow:URI, tensorboard:DIR, wandb:PROJECT)",
}
"""The job options :class:`JobRequest` declares itself, with why; every other option
of the API (:func:`corral.job.schema.options_of` ``("api")``) is generated from the
schema: same name, type, default, description and constraints."""


def _api_type(hint: Any) -> Any:
    """The request's type of a JobOptions field's type (lists for sequences)."""
    origin = typing.get_origin(hint)
    if origin is Sequence:
        return list[typing.get_args(hint)[0]]  # type: ignore[misc]
    if origin is Mapping:
        key, value = typing.get_args(hint)
        return dict[key, value]  # type: ignore[valid-type]
    return hint


def _options_body() -> type[_Body]:
    """The API's fields of the job options the schema generates (not in :data:`OWN`),
    with a check of the options that take one of a few values (their ``enum`` in the
    JSON schema, so the web form shows a choice)."""
    hints = typing.get_type_hints(JobOptions)
    fields: dict[str, Any] = {}
    choices: dict[str, tuple[tuple[str, ...], str]] = {}
    for item, opt in options_of("api"):
        if item.name in OWN:
            continue
        kind = _api_type(hints[item.name])
        if opt.choices:
            choices[item.name] = (opt.choices, opt.what or item.name)
            literal: Any = Literal.__getitem__(opt.choices)
            kind = literal | None if default_of(item) is None else literal
        described = Field(default_of(item), description=opt.help_at("api"), **opt.bounds)
        fields[item.name] = (kind, described)

    def one_of(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
        allowed, what = choices[str(info.field_name)]
        if value is not None and value not in allowed:
            raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")
        return value

    # before the Literal's own check: the error names what the value is and the choices
    validators = {"_one_of": field_validator(*choices, mode="before")(one_of)} if choices else {}
    model: type[_Body] = create_model(
        "JobOptionsBody", __base__=_Body, __validators__=validators, **fields
    )
    return model


if TYPE_CHECKING:

    class _OptionsBody(_Body):
        """For the type checker: the generated fields, typed as they are at run time
        (construct a request with them by ``model_validate``)."""

        def __getattr__(self, name: str) -> Any: ...

else:
    _OptionsBody = _options_body()


class JobRequest(_OptionsBody):
    """A job to plan (and then dispatch), queue as a task, or run on one machine."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "script": "examples/train_ddp.py",
                    "args": ["--steps", "100"],
                    "launcher": "torchrun",
                    "resource_requirements": {"num_machines": 2, "gpus_per_machine": 0},
                    "nproc_per_node": 2,
                    "machine_selection": "auto",
                    "config": {"batch_size": 64, "learning_rate": 0.001},
                    "adjust_config": True,
                    "max_restarts": 1,
                }
            ]
        },
    )

    script: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="The training script (path on the machines).",
    )
    plugin_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="A plugin of `corral serve --plugins-dir` (runs <dir>/<name>/main.py).",
    )
    args: list[Arg] = Field(default_factory=list, max_length=MAX_ITEMS)
    config: dict[str, Any] | None = Field(
        None, description="The job's config; ranks read it with corral.sdk.job_config()."
    )
    adjust_config: bool = Field(
        False,
        description="Batch size / world size, learning rate x world size (or sqrt), "
        "rank-0-only output directory, distributed metadata.",
    )
    config_scaling: ConfigScaling = Field(default_factory=lambda: ConfigScaling())
    env: dict[str, Arg] = Field(default_factory=dict, max_length=MAX_ENV)
    secret_env: list[Ref] = Field(
        default_factory=list, max_length=MAX_ENV, description="env keys whose values are secret."
    )
    launcher: ServiceLauncher = Field(
        "torchrun",
        description="How ranks are started: torchrun, python, accelerate, mlx (MLX's ring "
        "backend), or command (command_template on every machine, no script).",
    )
    resource_requirements: ResourceRequirements = Field(
        default_factory=lambda: ResourceRequirements()
    )
    machine_selection: Literal["auto", "manual"] = "auto"
    selected_machines: list[Ref] = Field(
        default_factory=list, max_length=MAX_ITEMS, description="Machine ids or names (manual)."
    )
    calibration: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        pattern=r"^[^\x00]+$",
        description="A calibration file on the server (what `corral calibrate` saved, e.g. "
        "runs/calibration-latest.json): every rank gets a weight in proportion to its "
        "measured throughput (CORRAL_WORKLOAD_WEIGHTS). Its hosts are matched to the "
        "machines by machine name (or address), with as many ranks as planned there.",
    )
    workload_weights: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None = Field(
        None,
        min_length=1,
        max_length=65536,
        description="The weights given directly instead of a calibration: one positive "
        "number per rank in plan order (machine by machine, then local rank); renormalised "
        "to sum to 1.",
    )
    after: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(
        default_factory=list,
        max_length=MAX_AFTER,
        description="Jobs (ids) that must succeed before this one starts (Slurm's "
        "afterok): it waits in the queue (`waiting for job A to succeed`) and is cancelled, "
        "naming the job, when one of them fails, is cancelled, times out or is lost.",
    )

    @field_validator("env")
    @classmethod
    def _env_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not is_env_name(key):
                raise ValueError(f"invalid environment variable name {key!r}")
        return value

    @model_validator(mode="after")
    def _secrets_by_name_and_value(self) -> JobRequest:
        # a value that is a credential (DATABASE_URL with a password, hf_..., ghp_...) is
        # secret whatever its name: listed here, it is redacted and kept out of the store
        # everywhere secret_env is honoured
        found = [k for k, v in self.env.items() if not is_secret(k, self.secret_env, None)
                 and looks_secret(v)]  # fmt: skip
        if found:
            self.secret_env = [*self.secret_env, *found]
        return self

    track: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        default_factory=list,
        max_length=MAX_TARGETS,
        description="Experiment trackers the job's reports (sdk.report: per-step metrics, "
        "per-rank throughput), parameters and final state are forwarded to, as `corral run "
        "--track`: mlflow:URI, tensorboard:DIR, wandb:PROJECT (offline W&B runs under the "
        "job's run dir). The server needs the tracker's extra (pip install "
        "'corral[mlflow]'); URIs carry no password.",
        examples=[["tensorboard:runs/tb", "mlflow:sqlite:///mlflow.db"]],
    )

    @field_validator("track")
    @classmethod
    def _track_targets(cls, value: list[str]) -> list[str]:
        try:
            parse_targets(value)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return value


PLANNED: tuple[str, ...] = ("nproc_per_node", "code_dir")
"""Generated fields the planner resolves (GPUs per machine, the script's directory)."""
PASS_THROUGH: tuple[str, ...] = tuple(
    name for name in _OptionsBody.model_fields if name not in PLANNED
)
"""The :class:`JobRequest` fields the planner hands to the job's
:class:`~corral.job.schema.JobOptions` as they are, under the same name: every
generated one but :data:`PLANNED`."""


class WorkloadWeight(BaseModel):
    """One planned rank's share of the work (a node's ranks by local rank)."""

    host: str
    node_rank: int
    local_rank: int
    weight: float
    fits: int | None = None
    """The largest micro-batch the rank fits, from the calibration (None: no limit
    found); a larger share runs as gradient accumulation."""


class PlanOut(BaseModel):
    """The answer of a plan: the job id and its execution plan."""

    job_id: str
    status: str
    execution_plan: dict[str, Any]


class DispatchIn(_Body):
    """Start a planned job (the seed's older body's extra fields are accepted and
    must agree with the plan)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"job_id": "j-1"}]})

    job_id: str = Field(min_length=1, max_length=64)
    target_machine: str | None = None
    rank: int | None = Field(None, ge=0)
    world_size: int | None = Field(None, ge=1)
    master_addr: str | None = None
    master_port: int | None = Field(None, ge=0, le=65535)
    plugin_name: str | None = None
    config: dict[str, Any] | None = None


class DistributedJobStatus(BaseModel):
    """The seed's ``DistributedJobStatus``, plus attempts, metrics and the root cause."""

    job_id: str
    name: str | None
    kind: str
    status: str
    reason: str
    world_size: int
    master: str | None
    created: float
    started: float | None
    ended: float | None
    exit_code: int | None
    attempt: int
    restarts: int
    nodes: list[NodeStatus]
    attempts: list[dict[str, Any]]
    last_metrics: dict[str, Any]
    root_cause: dict[str, Any] | None
    machines: list[str]
    task_id: str | None
    workload_weights: list[WorkloadWeight] | None = Field(
        None, description="Each rank's share of the work (null: an even split)."
    )
    preflight: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The pre-flight checks that warned (the launch went on) or failed: "
        "name, status (warn|fail), message, fix_command.",
    )
    owner: str | None = Field(None, description="The user who submitted or queued it.")
    priority: int = 0
    after: list[str] = Field(
        default_factory=list, description="The jobs that must succeed before it starts."
    )
    groups: list[GroupChange] = Field(
        default_factory=list,
        description="recovery in-place: each change of a node's replica group, oldest first.",
    )
    stragglers: list[StragglerOut] = Field(
        default_factory=list,
        description="Ranks named stragglers (sdk.section timings), the latest per rank and "
        "section, in the order they were named.",
    )
    hang: HangOut | None = Field(None, description="The last hang report (null: no hang).")


class JobSummary(BaseModel):
    """A job in a listing."""

    job_id: str
    name: str | None
    script: str | None
    kind: str
    status: str
    created: float
    started: float | None
    ended: float | None
    duration: float | None
    exit_code: int | None
    machines: list[str]
    world_size: int
    task_id: str | None
    owner: str | None = Field(None, description="The user who submitted or queued it.")
    priority: int = 0


class JobList(BaseModel):
    """A page of jobs, newest first."""

    jobs: list[JobSummary]
    total: int
    limit: int
    offset: int


class OutputPage(BaseModel):
    """Merged ``[host:rank]`` output from ``offset``; ask again from ``next_offset``."""

    job_id: str
    offset: int
    next_offset: int
    lines: list[str]
    finished: bool


class TaskIn(_Body):
    """A task: a saved job template."""

    name: str = Field(min_length=1, max_length=255)
    kind: Literal["distributed", "single"] = "distributed"
    request: JobRequest
    priority: int = Field(0, ge=-1_000_000, le=1_000_000, description="Of the jobs it queues.")


class TaskOut(BaseModel):
    """A saved task."""

    id: str
    name: str
    kind: str
    request: dict[str, Any]
    created: float
    owner: str | None = None
    priority: int = 0


class QueuedOut(BaseModel):
    """A queued job: from a task, or a request (``task_id`` null)."""

    job_id: str
    task_id: str | None
    status: str
    position: int
    reason: str = Field("", description="What it waits for (empty: it starts now).")
    priority: int = 0
    owner: str | None = None


class QueueEntry(BaseModel):
    """A queued job in the queue's order (higher priority first, then first in first out)."""

    position: int
    job_id: str
    name: str | None
    owner: str | None
    priority: int
    queued: float | None
    machines: int = Field(description="How many machines it asks for.")
    reason: str


class QueueMove(_Body):
    """A new priority for a queued job, or ``top``: ahead of every other queued job."""

    priority: int | None = Field(None, ge=-1_000_000, le=1_000_000)
    top: bool = False


class Suggestion(BaseModel):
    """A machine ranked for a distributed job, with its score and why."""

    machine_id: str
    name: str
    score: float
    eligible: bool
    reasons: list[str]


class Preferences(_Body):
    """The seed's ``DistributedPreferences``."""

    preferred_machines: list[Ref] = Field(default_factory=list, max_length=MAX_ITEMS)
    default_num_machines: int = Field(1, ge=1, le=4096)
    default_gpus_per_machine: int = Field(0, ge=0, le=1024)
    auto_machine_selection: bool = True


class PrepareIn(_Body):
    """Sync a code tree to machines and install its requirements there."""

    machine_ids: list[Ref] = Field(
        min_length=1, max_length=MAX_ITEMS, description="Machine ids or names."
    )
    source: str = Field(min_length=1, max_length=4096, description="Code tree on the server.")
    dest: str | None = Field(
        None, max_length=4096, description="Where on the machines (default: same path)."
    )
    requirements: str | None = Field(
        "requirements.txt", max_length=4096, description="Relative to the tree; null to skip pip."
    )
    python: str | None = Field(None, max_length=4096)


class StopOut(BaseModel):
    """The answer of a stop request."""

    job_id: str
    status: str
    stopping: bool
    message: str
