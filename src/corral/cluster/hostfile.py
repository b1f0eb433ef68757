"""Parse the ``--hosts`` value and hostfiles into a :class:`Cluster`.

Accepted forms (see DESIGN.md §4):

* ``local:N`` — N simulated nodes on this machine;
* ``h1,h2:4,gpu[01-04]:8`` — a comma list (when it is not an existing file);
* a file, auto-detected as one of

  - a text hostfile, one host per line, formats freely mixed::

        node1.example.com:4                 # host[:slots]
        node2 slots=8                       # DeepSpeed / Horovod style
        ml@node3:8 port=2222 interface=eth1 # extra keys, user@ prefix
        gpu[01-04]:8 label.rack=a env.NCCL_DEBUG=INFO   # Slurm ranges

  - a YAML cluster file (``.yaml``/``.yml``, or text starting with ``hosts:``)
    with a ``hosts:`` list and optional ``defaults:``;
  - an MLX JSON hostfile (``[{"ssh": "h1", "ips": ["10.0.0.1"]}]`` or the
    newer ``{"backend": ..., "envs": [...], "hosts": [...]}``).

Every problem is a :class:`~corral.errors.ConfigError` naming ``file:line``
(or the ``--hosts`` option), saying what is wrong and what is expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)

from corral.cluster.model import LOCAL_ADDRESS, Cluster, Host
from corral.errors import ConfigError

__all__ = [
    "HOSTFILE_KEYS",
    "MAX_HOSTS",
    "HostfileFormat",
    "detect_format",
    "expand_hostlist",
    "load_cluster",
    "load_cluster_file",
    "local_cluster",
    "parse_host_list",
    "parse_hostfile_text",
    "parse_mlx_hostfile",
    "parse_yaml_cluster",
]

HostfileFormat = Literal["text", "yaml", "json"]

#: Plain ``key=value`` keys of a text hostfile line (plus ``label.K`` and ``env.K``).
HOSTFILE_KEYS: tuple[str, ...] = ("slots", "port", "user", "interface", "address")

#: Upper bound on the number of hosts one spec may expand to (guards ``n[1-99999999]``).
MAX_HOSTS = 65536

_OPTION = "--hosts"
_ALLOWED_KEYS_TEXT = ", ".join(HOSTFILE_KEYS) + ", label.NAME, env.NAME"
_HOST_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$")
_DIGITS_RE = re.compile(r"^[0-9]+$")
_YAML_START_RE = re.compile(r"^(hosts|defaults)\s*:(\s|$)")
_HOST_NAME_EXPECTED = (
    "a host name made of letters, digits, '.', '-' and '_' (optionally with "
    "Slurm ranges like gpu[01-04])"
)


class _SpecError(Exception):
    """A problem in one entry; the caller adds file:line or the option."""


# --------------------------------------------------------------------------- locations


@dataclass(frozen=True)
class _Where:
    """Where an entry came from, to build errors and 'first defined on ...' notes."""

    source: str | None = None
    line: int | None = None
    option: str | None = None
    entry: int | None = None

    def error(self, message: str) -> ConfigError:
        if self.entry is not None:
            message = f"entry {self.entry}: {message}"
        return ConfigError(message, source=self.source, line=self.line, option=self.option)

    def describe(self) -> str:
        if self.line is not None:
            return f"line {self.line}"
        if self.entry is not None:
            return f"entry {self.entry}"
        return "an earlier entry"


@dataclass
class _Entry:
    """One host as written, before defaults are applied."""

    name: str
    where: _Where
    slots: int | None = None
    port: int | None = None
    user: str | None = None
    interface: str | None = None
    address: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Defaults:
    slots: int | None = None
    port: int | None = None
    user: str | None = None
    interface: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- values


def _parse_slots(text: str) -> int:
    if not _DIGITS_RE.match(text) or int(text) <= 0:
        raise _SpecError(f"invalid slots {text!r}: expected a positive integer (e.g. slots=8)")
    return int(text)


def _parse_port(text: str) -> int:
    if not _DIGITS_RE.match(text) or not 1 <= int(text) <= 65535:
        raise _SpecError(f"invalid port {text!r}: expected an integer from 1 to 65535")
    return int(text)


def _check_env_name(name: str) -> str:
    if not _ENV_NAME_RE.match(name):
        raise _SpecError(
            f"invalid environment variable name {name!r}: expected letters, digits "
            "and '_', not starting with a digit"
        )
    return name


def _check_label_key(key: str) -> str:
    if not _LABEL_KEY_RE.match(key):
        raise _SpecError(
            f"invalid label name {key!r}: expected letters, digits, '.', '-', '_' and '/'"
        )
    return key


def _check_host_name(name: str) -> str:
    if not _HOST_NAME_RE.match(name) or len(name) > 253:
        raise _SpecError(f"invalid host name {name!r}: expected {_HOST_NAME_EXPECTED}")
    return name


# --------------------------------------------------------------------------- ranges


def _split_groups(pattern: str) -> list[str | list[str]]:
    """Split ``gpu[01-04]x`` into literal strings and expanded bracket groups."""
    parts: list[str | list[str]] = []
    literal: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "]":
            raise _SpecError(
                f"bad range in {pattern!r}: ']' without a matching '[': "
                "expected NAME[LOW-HIGH] such as gpu[01-04]"
            )
        if ch != "[":
            literal.append(ch)
            i += 1
            continue
        close = pattern.find("]", i + 1)
        nested = pattern.find("[", i + 1)
        if close < 0:
            raise _SpecError(
                f"bad range in {pattern!r}: unclosed '[': "
                "expected NAME[LOW-HIGH] such as gpu[01-04]"
            )
        if 0 <= nested < close:
            raise _SpecError(
                f"bad range in {pattern!r}: nested '[': expected NAME[LOW-HIGH] such as gpu[01-04]"
            )
        parts.append("".join(literal))
        literal = []
        parts.append(_expand_group(pattern, pattern[i + 1 : close]))
        i = close + 1
    parts.append("".join(literal))
    return parts


def _expand_group(pattern: str, body: str) -> list[str]:
    """Expand the inside of one bracket group: ``01-04,07`` -> 01 02 03 04 07."""
    expected = "expected comma-separated numbers or LOW-HIGH ranges such as [01-04,07]"
    if not body.strip():
        raise _SpecError(f"bad range in {pattern!r}: empty '[]': {expected}")
    values: list[str] = []
    for item in body.split(","):
        item = item.strip()
        low, dash, high = item.partition("-")
        if not _DIGITS_RE.match(low) or (dash and not _DIGITS_RE.match(high)):
            raise _SpecError(
                f"bad range in {pattern!r}: {item!r} is not a number or range: {expected}"
            )
        if not dash:
            values.append(low)
            continue
        start, stop = int(low), int(high)
        if start > stop:
            raise _SpecError(
                f"bad range in {pattern!r}: {item!r} goes backwards: expected LOW <= HIGH "
                f"(e.g. [{high}-{low}])"
            )
        if stop - start + 1 > MAX_HOSTS:
            raise _SpecError(
                f"bad range in {pattern!r}: {item!r} has {stop - start + 1} values: "
                f"expected at most {MAX_HOSTS} hosts"
            )
        width = len(low)  # Slurm keeps the zero padding of the low bound
        values.extend(str(n).zfill(width) for n in range(start, stop + 1))
    return values


def _expand(pattern: str) -> list[str]:
    """Expand every bracket group of ``pattern`` (cartesian product, left group outermost)."""
    if "[" not in pattern and "]" not in pattern:
        return [pattern]
    parts = _split_groups(pattern)
    choices = [[p] if isinstance(p, str) else p for p in parts]
    total = math.prod(len(c) for c in choices)
    if total > MAX_HOSTS:
        raise _SpecError(
            f"bad range in {pattern!r}: expands to {total} hosts: expected at most {MAX_HOSTS}"
        )
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand_hostlist(pattern: str) -> list[str]:
    """Expand Slurm-style ranges: ``gpu[01-03]`` -> ``["gpu01", "gpu02", "gpu03"]``.

    Several comma-separated numbers/ranges per group (``n[1-3,7]``) and several
    groups (``r[1-2]n[1-2]``, expanded left-most outermost) are accepted; zero
    padding of the low bound is kept. Raises ConfigError on a malformed range.
    """
    try:
        return [_check_host_name(name) for name in _expand(pattern)]
    except _SpecError as exc:
        raise ConfigError(str(exc)) from None


# --------------------------------------------------------------------------- text lines


def _tokenize(line: str) -> list[str]:
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    lexer.escape = ""
    try:
        return list(lexer)
    except ValueError as exc:
        raise _SpecError(
            f"cannot parse line ({exc}): expected matching quotes around a value, "
            'e.g. env.NAME="a b"'
        ) from None


def _split_top_level(text: str, sep: str) -> list[str]:
    """Split on ``sep`` outside brackets, so ``n[1-3,7],m`` gives two items."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(depth - 1, 0)
        if ch == sep and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    items.append("".join(current))
    return items


def _parse_host_token(token: str) -> tuple[str | None, str, int | None]:
    """``[user@]name[:slots]`` -> (user, name pattern, slots)."""
    user: str | None = None
    rest = token
    if "@" in token:
        user, _, rest = token.partition("@")
        if not user:
            raise _SpecError(f"empty user in {token!r}: expected USER@HOST")
    pieces = _split_top_level(rest, ":")
    if len(pieces) > 2:
        raise _SpecError(
            f"cannot parse host {token!r}: expected HOST or HOST:SLOTS "
            "(an IPv6 address can only be given as address=...)"
        )
    name = pieces[0]
    if not name:
        raise _SpecError(f"missing host name in {token!r}: expected HOST or HOST:SLOTS")
    slots = _parse_slots(pieces[1]) if len(pieces) == 2 else None
    return user, name, slots


def _unknown_key(key: str) -> _SpecError:
    hint = ""
    close = difflib.get_close_matches(key, [*HOSTFILE_KEYS, "label", "env"], n=1)
    if close:
        hint = f" (did you mean {close[0]!r}?)"
    return _SpecError(f"unknown key {key!r}{hint}: expected one of {_ALLOWED_KEYS_TEXT}")


def _parse_line(tokens: Sequence[str], where: _Where) -> list[_Entry]:
    """Parse one tokenized hostfile line into entries (several when it has a range)."""
    head, options = tokens[0], tokens[1:]
    if "=" in head:
        raise _SpecError(
            f"expected a host name first, got {head!r}: write e.g. 'node1:8 port=2222'"
        )
    user, pattern, slots = _parse_host_token(head)
    values: dict[str, str] = {}
    env: dict[str, str] = {}
    labels: dict[str, str] = {}
    for token in options:
        key, eq, value = token.partition("=")
        if not eq:
            raise _SpecError(
                f"unexpected {token!r} after the host name: expected key=value with key "
                f"one of {_ALLOWED_KEYS_TEXT}"
            )
        if key.startswith("env."):
            name = _check_env_name(key[4:])
            if name in env:
                raise _SpecError(f"env.{name} given twice: expected each key once per line")
            env[name] = value
        elif key.startswith("label."):
            name = _check_label_key(key[6:])
            if name in labels:
                raise _SpecError(f"label.{name} given twice: expected each key once per line")
            labels[name] = value
        elif key in HOSTFILE_KEYS:
            if key in values:
                raise _SpecError(f"key {key!r} given twice: expected each key once per line")
            values[key] = value
        else:
            raise _unknown_key(key)
    if "slots" in values:
        if slots is not None:
            raise _SpecError(
                f"slots given twice ({head!r} and 'slots={values['slots']}'): "
                "expected either HOST:SLOTS or slots=N"
            )
        slots = _parse_slots(values["slots"])
    if "user" in values and user is not None:
        raise _SpecError(
            f"user given twice ({head!r} and 'user={values['user']}'): "
            "expected either USER@HOST or user=NAME"
        )
    for key in ("user", "interface", "address"):
        if key in values and not values[key]:
            raise _SpecError(f"empty value for {key!r}: expected {key}=VALUE")
    port = _parse_port(values["port"]) if "port" in values else None
    names = [_check_host_name(n) for n in _expand(pattern)]
    if "address" in values and len(names) > 1:
        raise _SpecError(
            f"address={values['address']} given for the range {pattern!r} of {len(names)} "
            "hosts: expected one address per host (write the hosts on separate lines)"
        )
    return [
        _Entry(
            name=name,
            where=where,
            slots=slots,
            port=port,
            user=values.get("user", user),
            interface=values.get("interface"),
            address=values.get("address"),
            env=dict(env),
            labels=dict(labels),
        )
        for name in names
    ]


def _parse_spec(text: str, where: _Where) -> list[_Entry]:
    """Parse one hostfile line / list item; errors carry ``where``."""
    try:
        tokens = _tokenize(text)
        return _parse_line(tokens, where) if tokens else []
    except _SpecError as exc:
        raise where.error(str(exc)) from None


# --------------------------------------------------------------------------- building


def _build(
    entries: Iterable[_Entry],
    *,
    source: str,
    defaults: _Defaults | None = None,
    empty: Callable[[], ConfigError],
) -> Cluster:
    defaults = defaults or _Defaults()
    seen: dict[str, _Where] = {}
    hosts: list[Host] = []
    for entry in entries:
        first = seen.get(entry.name)
        if first is not None:
            raise entry.where.error(
                f"duplicate host {entry.name!r} (first defined on {first.describe()}): "
                "expected each host once; give it more slots instead of repeating it"
            )
        seen[entry.name] = entry.where
        if len(hosts) >= MAX_HOSTS:
            raise entry.where.error(f"too many hosts: expected at most {MAX_HOSTS}")
        hosts.append(
            Host(
                name=entry.name,
                address=entry.address or "",
                slots=entry.slots if entry.slots is not None else (defaults.slots or 1),
                port=entry.port if entry.port is not None else defaults.port,
                user=entry.user if entry.user is not None else defaults.user,
                interface=entry.interface if entry.interface is not None else defaults.interface,
                env={**defaults.env, **entry.env},
                labels={**defaults.labels, **entry.labels},
            )
        )
    if not hosts:
        raise empty()
    return Cluster(hosts=tuple(hosts), source=source)


def parse_hostfile_text(text: str, source: str = "<hosts>") -> Cluster:
    """Parse a text hostfile (``host[:slots] [key=value ...]`` lines, ``#`` comments)."""
    entries: list[_Entry] = []
    for number, line in enumerate(text.splitlines(), start=1):
        entries.extend(_parse_spec(line, _Where(source=source, line=number)))
    return _build(
        entries,
        source=source,
        empty=lambda: ConfigError(
            "no hosts in hostfile: expected at least one line like 'node1:8'", source=source
        ),
    )


def parse_host_list(spec: str) -> Cluster:
    """Parse a comma list ``h1,h2:4,gpu[01-04]:8`` (the ``--hosts`` value form)."""
    entries: list[_Entry] = []
    for index, item in enumerate(_split_top_level(spec, ","), start=1):
        if item.strip():
            entries.extend(_parse_spec(item, _Where(option=_OPTION, entry=index)))
    return _build(
        entries,
        source=spec,
        empty=lambda: ConfigError(
            f"no hosts in {spec!r}: expected a comma-separated list such as 'node1,node2:4'",
            option=_OPTION,
        ),
    )


def local_cluster(count: int) -> Cluster:
    """``count`` simulated nodes ``local-0``.. on this machine (``local:N``)."""
    if count < 1 or count > MAX_HOSTS:
        raise ConfigError(
            f"invalid node count {count}: expected local:N with N from 1 to {MAX_HOSTS}",
            option=_OPTION,
        )
    hosts = tuple(
        Host(name=f"local-{i}", address=LOCAL_ADDRESS, slots=1, local=True) for i in range(count)
    )
    return Cluster(hosts=hosts, source=f"local:{count}")


# --------------------------------------------------------------------------- pydantic glue


def _env_scalar(value: object) -> object:
    """YAML gives numbers and booleans; env values are strings (``true`` -> ``1``)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return str(value)
    return value


def _label_scalar(value: object) -> object:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value


_EnvValue = Annotated[str, BeforeValidator(_env_scalar)]
_LabelValue = Annotated[str, BeforeValidator(_label_scalar)]
_Slots = Annotated[int, Field(strict=True, gt=0)]
_Port = Annotated[int, Field(strict=True, ge=1, le=65535)]
_Text = Annotated[str, Field(strict=True, min_length=1)]

# What each field expects, for error messages.
_EXPECT: dict[str, str] = {
    "name": _HOST_NAME_EXPECTED,
    "address": "a non-empty string (the address other nodes connect to)",
    "slots": "a positive integer",
    "port": "an integer from 1 to 65535",
    "user": "a non-empty string",
    "interface": "a non-empty network interface name such as eth0",
    "env": "a mapping of NAME: value (strings or numbers)",
    "labels": "a mapping of key: value (strings or numbers)",
    "hosts": "a non-empty list of host lines or host mappings",
    "defaults": "a mapping with keys user, port, slots, interface, env, labels",
    "ssh": "a non-empty string (the host to ssh into)",
    "ips": "a list of IP address strings",
    "envs": 'a list of "NAME=value" strings',
    "backend": "a string",
}


def _check_env_mapping(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        try:
            _check_env_name(name)
        except _SpecError as exc:
            raise ValueError(str(exc)) from None
    return value


def _check_label_mapping(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        try:
            _check_label_key(key)
        except _SpecError as exc:
            raise ValueError(str(exc)) from None
    return value


_EnvMap = Annotated[dict[str, _EnvValue], AfterValidator(_check_env_mapping)]
_LabelMap = Annotated[dict[str, _LabelValue], AfterValidator(_check_label_mapping)]


class _HostModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: _Text
    address: _Text | None = None
    slots: _Slots | None = None
    port: _Port | None = None
    user: _Text | None = None
    interface: _Text | None = None
    env: _EnvMap = Field(default_factory=dict)
    labels: _LabelMap = Field(default_factory=dict)


class _DefaultsModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slots: _Slots | None = None
    port: _Port | None = None
    user: _Text | None = None
    interface: _Text | None = None
    env: _EnvMap = Field(default_factory=dict)
    labels: _LabelMap = Field(default_factory=dict)


class _ClusterFileModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hosts: list[Any] = Field(min_length=1)
    defaults: _DefaultsModel = Field(default_factory=_DefaultsModel)


class _MlxHostModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ssh: _Text
    ips: list[Annotated[str, Field(strict=True)]] = Field(default_factory=list)
    rdma: list[Any] = Field(default_factory=list)  # MLX's RDMA devices; not used by corral
    slots: _Slots | None = None


class _MlxFileModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hosts: list[Any]
    backend: str = ""
    envs: list[Annotated[str, Field(strict=True)]] = Field(default_factory=list)


def _allowed_keys(model: type[BaseModel]) -> str:
    return ", ".join(model.model_fields)


def _short_repr(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _pydantic_message(
    exc: ValidationError, model: type[BaseModel], expect: Mapping[str, str] | None = None
) -> tuple[str, tuple[Any, ...]]:
    """First error of ``exc`` as 'what is wrong: what is expected', and its location.

    Unknown keys are reported first: a misspelt key usually explains the rest.
    """
    expectations = {**_EXPECT, **(expect or {})}
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    error = errors[0]
    loc = tuple(error["loc"])
    path = ".".join(str(part) for part in loc)
    field_name = ""
    for part in loc:  # the innermost known field, not looking inside env/labels mappings
        if str(part) in expectations:
            field_name = str(part)
        if field_name in ("env", "labels"):
            break
    kind = error["type"]
    if kind == "extra_forbidden":
        owner: type[BaseModel] = model
        if len(loc) > 1 and loc[0] == "defaults":
            owner = _DefaultsModel
        message = f"unknown key {str(loc[-1])!r}: expected one of {_allowed_keys(owner)}"
    elif kind == "missing":
        message = f"missing required key {path!r}"
        if field_name:
            message += f": expected {expectations[field_name]}"
    elif kind == "value_error":
        message = str(error["msg"]).removeprefix("Value error, ")
    else:
        expected = expectations.get(field_name, str(error["msg"]).lower())
        if (
            loc
            and isinstance(loc[-1], str)
            and field_name in ("env", "labels")
            and path != field_name
        ):
            expected = "a string or a number"
        message = f"invalid {path or 'value'} {_short_repr(error['input'])}: expected {expected}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return message, loc


# --------------------------------------------------------------------------- YAML


def _node_at(node: yaml.Node, loc: Sequence[Any]) -> yaml.Node:
    """The deepest node reachable from ``node`` along a pydantic ``loc``."""
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.value == str(part):
                    node = value_node
                    break
            else:
                return node
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if not 0 <= part < len(node.value):
                return node
            node = node.value[part]
        else:
            return node
    return node


def _line_of(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _check_duplicate_keys(node: yaml.Node, source: str) -> None:
    """PyYAML keeps the last of duplicate keys silently; we refuse them."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    raise ConfigError(
                        f"duplicate key {key_node.value!r} (first on line "
                        f"{seen[key_node.value]}): expected each key once per mapping",
                        source=source,
                        line=_line_of(key_node),
                    )
                seen[key_node.value] = _line_of(key_node)
            _check_duplicate_keys(value_node, source)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_duplicate_keys(item, source)


def _load_yaml(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"invalid YAML ({problem}): expected a mapping with a 'hosts:' list",
            source=source,
            line=int(mark.line) + 1 if mark is not None else None,
        ) from None
    finally:
        loader.dispose()
    return node, data


def _yaml_host_entries(item: Any, node: yaml.Node, index: int, source: str) -> list[_Entry]:
    where = _Where(source=source, line=_line_of(node))
    if isinstance(item, str):
        return _parse_spec(item, where)
    if not isinstance(item, dict):
        raise where.error(
            f"invalid host {_short_repr(item)} (hosts item {index + 1}): expected a host "
            "line such as 'node1:8' or a mapping with a 'name' key"
        )
    try:
        model = _HostModel.model_validate(item)
    except ValidationError as exc:
        message, loc = _pydantic_message(exc, _HostModel)
        line = _line_of(_node_at(node, loc))
        raise ConfigError(message, source=source, line=line) from None
    try:
        names = [_check_host_name(n) for n in _expand(model.name)]
        if model.address is not None and len(names) > 1:
            raise _SpecError(
                f"address {model.address!r} given for the range {model.name!r} of "
                f"{len(names)} hosts: expected one address per host"
            )
    except _SpecError as exc:
        raise ConfigError(
            str(exc), source=source, line=_line_of(_node_at(node, ["name"]))
        ) from None
    return [
        _Entry(
            name=name,
            where=where,
            slots=model.slots,
            port=model.port,
            user=model.user,
            interface=model.interface,
            address=model.address,
            env=dict(model.env),
            labels=dict(model.labels),
        )
        for name in names
    ]


def parse_yaml_cluster(text: str, source: str = "<yaml>") -> Cluster:
    """Parse a YAML cluster file: ``hosts:`` (lines or mappings) and optional ``defaults:``."""
    node, data = _load_yaml(text, source)
    if node is None or data is None:
        raise ConfigError(
            "no hosts in cluster file: expected a mapping with a 'hosts:' list", source=source
        )
    if not isinstance(data, dict):
        raise ConfigError(
            f"invalid cluster file (top level is {type(data).__name__}): expected a "
            "mapping with a 'hosts:' list",
            source=source,
            line=_line_of(node),
        )
    _check_duplicate_keys(node, source)
    try:
        model = _ClusterFileModel.model_validate(data)
    except ValidationError as exc:
        message, loc = _pydantic_message(exc, _ClusterFileModel)
        raise ConfigError(message, source=source, line=_line_of(_node_at(node, loc))) from None
    d = model.defaults
    defaults = _Defaults(
        slots=d.slots, port=d.port, user=d.user, interface=d.interface, env=d.env, labels=d.labels
    )
    hosts_node = _node_at(node, ["hosts"])
    assert isinstance(hosts_node, yaml.SequenceNode)
    entries: list[_Entry] = []
    for index, (item, item_node) in enumerate(zip(model.hosts, hosts_node.value, strict=True)):
        entries.extend(_yaml_host_entries(item, item_node, index, source))
    return _build(
        entries,
        source=source,
        defaults=defaults,
        empty=lambda: ConfigError(
            "no hosts in cluster file: expected at least one host under 'hosts:'",
            source=source,
            line=_line_of(hosts_node),
        ),
    )


# --------------------------------------------------------------------------- MLX JSON


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _json_item_offsets(text: str) -> list[int]:
    """Offsets of the host items of a (valid) MLX JSON hostfile, list or object form."""
    decoder = json.JSONDecoder()
    pos = _skip_ws(text, 0)
    if text.startswith("{", pos):
        pos = _skip_ws(text, pos + 1)
        while not text.startswith("}", pos):
            key, pos = decoder.raw_decode(text, pos)
            pos = _skip_ws(text, _skip_ws(text, pos) + 1)  # past ':'
            if key == "hosts" and text.startswith("[", pos):
                break
            _, pos = decoder.raw_decode(text, pos)
            pos = _skip_ws(text, pos)
            if text.startswith(",", pos):
                pos = _skip_ws(text, pos + 1)
        else:
            return []
    if not text.startswith("[", pos):
        return []
    offsets: list[int] = []
    pos = _skip_ws(text, pos + 1)
    while not text.startswith("]", pos):
        offsets.append(pos)
        _, pos = decoder.raw_decode(text, pos)
        pos = _skip_ws(text, pos)
        if text.startswith(",", pos):
            pos = _skip_ws(text, pos + 1)
    return offsets


_MLX_EXPECT = {"hosts": 'a list of host objects like {"ssh": "h1", "ips": ["10.0.0.1"]}'}


def parse_mlx_hostfile(text: str, source: str = "<json>") -> Cluster:
    """Parse an MLX JSON hostfile: name = ``ssh``, address = first of ``ips``.

    Both the list form and the ``{"backend", "envs", "hosts"}`` form are accepted;
    ``envs`` (``"NAME=value"`` strings) go into every host's env. An optional
    ``slots`` key per host is a corral extension (default 1).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"invalid JSON ({exc.msg}): expected a list like "
            '[{"ssh": "h1", "ips": ["10.0.0.1"]}]',
            source=source,
            line=exc.lineno,
        ) from None
    env: dict[str, str] = {}
    if isinstance(data, dict):
        try:
            file_model = _MlxFileModel.model_validate(data)
        except ValidationError as exc:
            message, _ = _pydantic_message(exc, _MlxFileModel, _MLX_EXPECT)
            raise ConfigError(message, source=source) from None
        for item in file_model.envs:
            name, eq, value = item.partition("=")
            try:
                if not eq:
                    raise _SpecError(f"invalid envs item {item!r}: expected 'NAME=value'")
                env[_check_env_name(name)] = value
            except _SpecError as exc:
                raise ConfigError(str(exc), source=source) from None
        items: list[Any] = file_model.hosts
    elif isinstance(data, list):
        items = data
    else:
        raise ConfigError(
            f"invalid MLX hostfile (top level is a JSON {type(data).__name__}): expected a "
            'list like [{"ssh": "h1", "ips": ["10.0.0.1"]}]',
            source=source,
        )
    try:
        offsets = _json_item_offsets(text)
    except (ValueError, IndexError):  # pragma: no cover - text already parsed as JSON
        offsets = []
    entries: list[_Entry] = []
    for index, item in enumerate(items):
        line = text.count("\n", 0, offsets[index]) + 1 if index < len(offsets) else None
        where = _Where(source=source, line=line, entry=index + 1)
        if not isinstance(item, dict):
            raise where.error(
                f"invalid host {_short_repr(item)}: expected an object like "
                '{"ssh": "h1", "ips": ["10.0.0.1"]}'
            )
        try:
            model = _MlxHostModel.model_validate(item)
        except ValidationError as exc:
            message, _ = _pydantic_message(exc, _MlxHostModel, _MLX_EXPECT)
            raise where.error(message) from None
        try:
            user, name, slots = _parse_host_token(model.ssh)
            if slots is not None or "[" in name:
                raise _SpecError(
                    f'invalid ssh {model.ssh!r}: expected a host name (put slots in "slots")'
                )
            _check_host_name(name)
        except _SpecError as exc:
            raise where.error(str(exc)) from None
        entries.append(
            _Entry(
                name=name,
                where=where,
                slots=model.slots,
                user=user,
                address=model.ips[0] if model.ips else None,
                env=dict(env),
            )
        )
    return _build(
        entries,
        source=source,
        empty=lambda: ConfigError(
            'no hosts in MLX hostfile: expected a list like [{"ssh": "h1", "ips": [...]}]',
            source=source,
        ),
    )


# --------------------------------------------------------------------------- files and --hosts


def detect_format(text: str, path: str | Path | None = None) -> HostfileFormat:
    """Which parser a hostfile needs: by extension, else by content.

    ``.yaml``/``.yml`` and text whose first line (after comments) starts with
    ``hosts:`` or ``defaults:`` (or a YAML ``---``) are YAML; ``.json`` and text
    that parses as a JSON list (or starts with ``[``/``{``) are MLX JSON; anything
    else is a text hostfile.
    """
    suffix = Path(path).suffix.lower() if path is not None else ""
    if suffix in (".yaml", ".yml"):
        return "yaml"
    if suffix == ".json":
        return "json"
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        return "json"
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line == "---" or line.startswith("%YAML") or _YAML_START_RE.match(line):
            return "yaml"
        break
    return "text"


def _with_ssh_defaults(cluster: Cluster, user: str | None, port: int | None) -> Cluster:
    if user is None and port is None:
        return cluster
    hosts = tuple(
        h
        if h.local
        else dataclasses.replace(
            h,
            user=h.user if h.user is not None else user,
            port=h.port if h.port is not None else port,
        )
        for h in cluster.hosts
    )
    return Cluster(hosts=hosts, source=cluster.source)


def load_cluster_file(path: str | Path) -> Cluster:
    """Read and parse a hostfile of any supported format (auto-detected)."""
    source = str(path)
    file_path = Path(path).expanduser()
    if not file_path.exists():
        raise ConfigError(f"hostfile {source!r} not found: expected an existing file")
    if file_path.is_dir():
        raise ConfigError(f"hostfile {source!r} is a directory: expected a file")
    try:
        text = file_path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read hostfile ({exc}): expected a readable UTF-8 file", source=source
        ) from None
    fmt = detect_format(text, file_path)
    if fmt == "yaml":
        return parse_yaml_cluster(text, source)
    if fmt == "json":
        return parse_mlx_hostfile(text, source)
    return parse_hostfile_text(text, source)


def load_cluster(spec: str, *, ssh_user: str | None = None, ssh_port: int | None = None) -> Cluster:
    """The cluster named by a ``--hosts`` value: ``local:N``, a file path or ``h1,h2,...``.

    ``ssh_user``/``ssh_port`` (``--ssh-user``/``--ssh-port``) fill in hosts that
    do not set their own; they do not apply to ``local:N`` nodes.
    """
    spec = spec.strip()
    if not spec:
        raise ConfigError(
            "empty value: expected a hostfile path, local:N or h1,h2,...", option=_OPTION
        )
    if ssh_port is not None and not 1 <= ssh_port <= 65535:
        raise ConfigError(
            f"invalid port {ssh_port}: expected an integer from 1 to 65535", option="--ssh-port"
        )
    if ssh_user is not None and not ssh_user.strip():
        raise ConfigError("empty user: expected a user name", option="--ssh-user")
    if spec.startswith("local:"):
        count = spec.removeprefix("local:").strip()
        if not _DIGITS_RE.match(count):
            raise ConfigError(
                f"invalid {spec!r}: expected local:N with N an integer >= 1 (e.g. local:4)",
                option=_OPTION,
            )
        return local_cluster(int(count))
    path = Path(spec).expanduser()
    if path.exists():
        cluster = load_cluster_file(spec)
    elif "," in spec:
        cluster = parse_host_list(spec)
    else:
        hint = f" (to use it as a host list, add a comma: '{spec},')" if "/" not in spec else ""
        raise ConfigError(
            f"hostfile {spec!r} not found: expected an existing file, local:N or a "
            f"comma-separated host list such as 'node1,node2'{hint}",
            option=_OPTION,
        )
    return _with_ssh_defaults(cluster, ssh_user, ssh_port)
