"""How a job option is offered (:class:`Option`), and the field helpers the options'
one schema (:class:`corral.job.schema.JobOptions`) declares its fields with: a
field's type and default are the dataclass field's, the rest its ``Option`` in the
field's metadata, and the parsing of the flags whose text is not their value
(:func:`parse_nproc`). A leaf: the standard library and :mod:`corral.errors` only."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from corral.errors import ConfigError

T = TypeVar("T")

Entry = Literal["run", "plan", "submit", "api", "web", "k8s", "slurm", "actors"]
"""An entry point a job is described at: the verbs ``corral run``, ``corral plan``,
``corral job submit``, the API's ``JobRequest``, the web page's new-job form, the
renders ``corral k8s render|apply`` and ``corral slurm render|submit``, and the actors
runtime (``corral.actors.Cluster(options=...)``, built by ``job.build.ready_ranks``)."""
ENTRIES: tuple[Entry, ...] = ("run", "plan", "submit", "api", "web", "k8s", "slurm", "actors")
VERBS: tuple[Entry, ...] = ("run", "plan", "submit", "k8s", "slurm")
"""The entry points that are command-line verbs (their flags come from the schema)."""


@dataclass(frozen=True)
class Option:
    """How one :class:`JobOptions` field is offered: its help, its command-line flag
    (with an environment variable), the entry points that expose it, the API's bounds
    and, on the web form, its section and label. Its type and default are the field's."""

    help: str
    not_at: Mapping[str, str] = field(default_factory=dict)
    """The entry points that do not offer it, each with the reason why."""
    flag: str | None = None
    """The flag (``--master-port``); None: not a flag (``command``: after ``--``)."""
    metavar: str | None = None
    envvar: str | None = None
    """The ``CORRAL_*`` variable the verbs read the flag from."""
    panel: str = "Launch"
    """The group the verbs' ``--help`` shows it in."""
    negate: bool = False
    """The flag says the opposite of the field (``--no-preflight`` for ``preflight``)."""
    aliases: tuple[str, ...] = ()
    """Older names of the flag that still work (``--dist-timeout``)."""
    bounds: Mapping[str, Any] = field(default_factory=dict)
    """pydantic's constraints of the API's field (``ge``, ``gt``, ``le``, ``max_length``...)."""
    choices: tuple[str, ...] = ()
    """The values it takes (a select on the form, refused otherwise by the API)."""
    what: str = ""
    """What a value is, for the API's error (``unknown QoS class 'x'``)."""
    names: Mapping[str, str] = field(default_factory=dict)
    """Its name at an entry point that calls it otherwise (``command``: the API's ``script``)."""
    section: str | None = None
    """The web form's generated section (None: a hand-written input, or no input)."""
    label: str = ""
    """The web form's label."""
    metavar_for: Mapping[str, str] = field(default_factory=dict)
    """An entry point's own metavar (the launchers Kubernetes and Slurm run)."""
    help_for: Mapping[str, str] = field(default_factory=dict)
    """An entry point's own help where the option means more there (``k8s``: ``--env``
    bare keys come from the Secret)."""

    @property
    def entries(self) -> tuple[str, ...]:
        """The entry points that offer it."""
        return tuple(e for e in ENTRIES if e not in self.not_at)

    def name_at(self, entry: str, name: str) -> str:
        """The field ``name``'s name at ``entry``."""
        return self.names.get(entry, name)

    def help_at(self, entry: str) -> str:
        """The help shown at ``entry``."""
        return self.help_for.get(entry, self.help)


def option(default: T, help: str, not_at: Mapping[str, str] | None = None, **spec: Any) -> T:
    """A :class:`JobOptions` field with its default (written here only) and its
    :class:`Option` (``spec``: that class's other fields)."""
    found = Option(help=help, not_at=dict(not_at or {}), **spec)
    made: T = field(default=default, metadata={"option": found})
    return made


def option_list(help: str, not_at: Mapping[str, str] | None = None, **spec: Any) -> Any:
    """A :class:`JobOptions` field whose default is empty (a tuple, or a mapping)."""
    factory: type = dict if spec.pop("mapping", False) else tuple
    found = Option(help=help, not_at=dict(not_at or {}), **spec)
    return field(default_factory=factory, metadata={"option": found})


def parse_nproc(text: str | None) -> int | Literal["auto"] | None:
    """``--nproc-per-node N|auto`` as given: a number >= 1, ``"auto"`` (what it means,
    GPUs or slots, is the caller's), or None (not given). ConfigError naming the flag."""
    if text is None:
        return None
    if text == "auto":
        return "auto"
    try:
        number = int(text)
    except ValueError:
        raise ConfigError(
            f"{text!r} is not a number or 'auto'", option="--nproc-per-node"
        ) from None
    if number < 1:
        raise ConfigError(f"must be at least 1 (got {number})", option="--nproc-per-node")
    return number


def default_of(item: dataclasses.Field[Any]) -> Any:
    """A field's default (its factory's value for the empty collections)."""
    if item.default is not dataclasses.MISSING:
        return item.default
    factory: Any = item.default_factory
    return factory()


__all__ = [
    "ENTRIES",
    "VERBS",
    "Entry",
    "Option",
    "default_of",
    "option",
    "option_list",
    "parse_nproc",
]
