"""The job's options as command-line flags, derived from their one schema
(:class:`corral.job.schema.JobOptions`), for every verb that takes them (``run``,
``plan``, ``job submit``, ``k8s``, ``slurm``; ``check`` and ``calibrate`` take a few):

- :func:`job_flags` gives a verb every flag its entry point offers, in place of its
  ``flags: JobFlags`` parameter, and hands it the values (:class:`JobFlags`), which
  build the job's :class:`~corral.job.schema.JobOptions` (:meth:`JobFlags.options`);
- :func:`flag_of` is one flag as a parameter annotation, for the verbs that take only
  a few of them.

A flag's name, help, metavar, environment variable and default are the schema's; only
the verbs' own options (the calibration, the script argument) are written here. The
CLUSTER group is in :mod:`corral.cli.common`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, ParamSpec, TypeVar

import typer

from corral.contract import positive_numbers
from corral.errors import ConfigError
from corral.job.option import parse_nproc as parse_nproc_text
from corral.job.schema import JobOptions, Option, default_of, options_of

if typing.TYPE_CHECKING:
    from corral.cluster.model import Cluster

P = ParamSpec("P")
R = TypeVar("R")

_HINTS = typing.get_type_hints(JobOptions)
_FIELDS = {f.name: (f, o) for f, o in options_of()}


def _cli_type(name: str) -> Any:
    """The type the flag of field ``name`` is parsed as (a list for a repeated flag,
    text for ``N|auto`` and for ``W,W,...``)."""
    hint = _HINTS[name]
    origin = typing.get_origin(hint)
    if name in ("nproc_per_node", "workload_weights"):
        return str | None
    if origin in (Mapping, Sequence) or hint in (Mapping, Sequence):
        return list[str] | None
    return hint


def _param(name: str) -> str:
    """The verb's parameter of field ``name`` (``no_preflight`` for ``preflight``)."""
    return f"no_{name}" if _FIELDS[name][1].negate else name


def option_of(name: str, entry: str = "run") -> Any:
    """The ``typer.Option`` of field ``name`` as ``entry`` shows it."""
    opt: Option = _FIELDS[name][1]
    if opt.flag is None:
        raise ValueError(f"{name} is not a flag")
    return typer.Option(
        opt.flag,
        *opt.aliases,
        metavar=opt.metavar_for.get(entry, opt.metavar),
        envvar=opt.envvar,
        help=opt.help_at(entry),
        rich_help_panel=opt.panel,
        show_default=_default(name) not in (None, (), {}),
    )


def flag_of(name: str, entry: str = "run") -> Any:
    """Field ``name``'s flag as a parameter annotation (``Annotated[type, Option]``)."""
    return Annotated[_cli_type(name), option_of(name, entry)]


def _default(name: str) -> Any:
    """The flag's default: the field's (off for a negated flag, None for a list)."""
    item, opt = _FIELDS[name]
    value = default_of(item)
    if opt.negate:
        return False
    return None if isinstance(value, tuple | dict) else value


FLAG_DEFAULTS: Mapping[str, Any] = {item.name: _default(item.name) for item, _ in options_of()}
"""Each field's flag default, for the parameters of the verbs that take a few job flags
(``check``, ``calibrate``): the schema's, never written again in a verb."""


def flag_params(entry: str, skip: Sequence[str] = ()) -> list[inspect.Parameter]:
    """The verb parameters of every flag ``entry`` offers (``command``, the script
    after ``--``, is the verb's own argument)."""
    return [
        inspect.Parameter(
            _param(item.name),
            inspect.Parameter.KEYWORD_ONLY,
            default=_default(item.name),
            annotation=flag_of(item.name, entry),
        )
        for item, opt in options_of(entry)
        if opt.flag is not None and item.name not in skip
    ]


@dataclasses.dataclass(frozen=True)
class JobFlags:
    """The values of a verb's job flags, by field name, as given (or defaulted)."""

    entry: str
    values: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    @classmethod
    def take(cls, entry: str, kwargs: dict[str, Any]) -> JobFlags:
        """The job flags of ``entry`` popped out of a verb's keyword arguments."""
        names = {_param(f.name): f.name for f, o in options_of(entry) if o.flag is not None}
        return cls(entry, {names[k]: kwargs.pop(k) for k in names.keys() & kwargs.keys()})

    def given(self) -> dict[str, Any]:
        """The fields whose flag differs from its default, as the schema's values
        (``env`` a mapping, lists as lists): what ``corral job submit`` sends."""
        found: dict[str, Any] = {}
        for name, value in self.fields().items():
            default = default_of(_FIELDS[name][0])
            if value != default and not (value in ((), [], {}) and default in ((), {})):
                found[name] = list(value) if isinstance(value, tuple) else value
        return found

    def fields(self, cluster: Cluster | None = None, skip: Sequence[str] = ()) -> dict[str, Any]:
        """Every flag's value as its field's (parsed: ``env``, ``N|auto``, ``W,W``), but
        those of ``skip`` (which the verb parses itself)."""
        from corral.job.resolve import parse_env

        out: dict[str, Any] = {}
        for name, value in self.values.items():
            if name in skip:
                continue
            hint = _HINTS[name]
            if _FIELDS[name][1].negate:
                value = not value
            elif name == "env":
                value = parse_env(value or [])
            elif name == "nproc_per_node":
                value = _nproc(value, cluster)
            elif name == "workload_weights":
                value = parse_weights(value)
            elif typing.get_origin(hint) is Sequence or hint is Sequence:
                value = tuple(value or ())
            out[name] = value
        return out

    def options(
        self, command: Sequence[str] | None, cluster: Cluster | None = None, **more: Any
    ) -> JobOptions:
        """The job's options: these flags, the script and its arguments, and ``more``
        fields set by the verb itself."""
        return JobOptions(command=tuple(command or ()), **self.fields(cluster, list(more)), **more)


NO_FLAGS = JobFlags("", {})
"""A verb's ``flags`` parameter's placeholder: :func:`job_flags` replaces it by the flags."""


def _nproc(value: str | None, cluster: Cluster | None) -> int | None:
    """``--nproc-per-node N|auto``: with a cluster, as ``corral run`` resolves it;
    without one, 'auto' is left to where the job runs (None)."""
    if cluster is not None:
        from corral.job.resolve import parse_nproc

        return parse_nproc(value, cluster)
    number = parse_nproc_text(value)
    return None if number == "auto" else number


def parse_weights(text: str | None) -> tuple[float, ...]:
    """The numbers of ``--workload-weights W,W,...`` (ConfigError naming it)."""
    if not text:
        return ()
    flag = "--workload-weights"
    try:
        return tuple(positive_numbers(text, flag))
    except ValueError as exc:
        what = str(exc).removeprefix(f"{flag}=")  # '1,x': entry 1 ('x') is not ...
        raise ConfigError(f"{what}; one per rank, separated by commas", option=flag) from None


def job_flags(entry: str, skip: Sequence[str] = ()) -> Callable[[Callable[P, R]], Callable[..., R]]:
    """Give a verb the flags of every job option its entry point ``entry`` offers, in
    place of its ``flags: JobFlags`` parameter (``skip``: fields the verb declares
    itself), and call it with their values as :class:`JobFlags`."""
    params = flag_params(entry, skip)

    def decorate(func: Callable[P, R]) -> Callable[..., R]:
        hints = typing.get_type_hints(func, include_extras=True)
        signature = inspect.signature(func)
        mine: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name == "flags":
                mine += [p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params]
            else:
                mine.append(param.replace(annotation=hints.get(param.name, param.annotation)))

        @functools.wraps(func)
        def verb(*args: Any, **kwargs: Any) -> R:
            flags = JobFlags.take(entry, kwargs)
            return func(*args, flags=flags, **kwargs)  # type: ignore[arg-type]

        verb.__signature__ = signature.replace(parameters=mine)  # type: ignore[attr-defined]
        verb.__annotations__ = {p.name: p.annotation for p in mine}
        return verb

    return decorate


_L = "Launch"
CHECKS_PANEL = "Checks"

# single flags for the verbs that take a few (corral check, corral calibrate)
LauncherOpt = Annotated[str, option_of("launcher")]
PythonOpt = flag_of("python")
NprocOpt = flag_of("nproc_per_node")
MasterAddrOpt = flag_of("master_addr")
MasterPortOpt = flag_of("master_port")
WorkdirOpt = flag_of("workdir")
EnvOpt = flag_of("env")
NcclOpt = flag_of("nccl_interface")
GlooOpt = flag_of("gloo_interface")
CheckpointOpt = flag_of("checkpoint_dir")
RunDirOpt = flag_of("run_dir")
JobIdOpt = flag_of("job_id")
SharedDataPathOpt = flag_of("shared_data_path")
MinFreeOpt = flag_of("min_free_gb")
ThresholdOpt = flag_of("consistency_threshold")
ExcludeOpt = flag_of("exclude_divergent")
CodeDirOpt = flag_of("code_dir")
LinksMinRatioOpt = flag_of("links_min_ratio")
LinksMinGbsOpt = flag_of("links_min_gbs")
LinksWarnOpt = flag_of("links_warn_only")

HETERO_PANEL = "Heterogeneous clusters"
CalibrationOpt = Annotated[
    str | None,
    typer.Option(
        "--calibration",
        metavar="FILE|auto",
        envvar="CORRAL_CALIBRATION",
        help="Split the work in proportion to each rank's measured throughput: a file "
        "from `corral calibrate` (same hosts and ranks), or 'auto' to run the built-in "
        "calibration first. Ranks read their weight with the SDK "
        "(sdk.WeightedDistributedSampler, sdk.local_batch_size, sdk.loss_scale).",
        rich_help_panel=HETERO_PANEL,
    ),
]
CalibrationSecondsOpt = Annotated[
    float,
    typer.Option(
        "--calibration-seconds",
        metavar="SECONDS",
        envvar="CORRAL_CALIBRATION_SECONDS",
        help="How long --calibration auto measures (as corral calibrate --seconds).",
        rich_help_panel=HETERO_PANEL,
    ),
]
ScriptArg = Annotated[
    list[str] | None,
    typer.Argument(
        help="The script and its arguments, after `--`.",
        show_default=False,
        metavar="-- SCRIPT [ARGS]...",
    ),
]
