"""YAML cluster files and MLX JSON hostfiles (private to :mod:`corral.cluster`).

Kept apart from :mod:`corral.cluster.hostfile` because it needs pydantic and
PyYAML, which are slow to import: ``import corral.cluster`` and text hostfiles,
``local:N`` and comma lists never load this module. The public entry points are
:func:`corral.cluster.parse_yaml_cluster` and :func:`corral.cluster.parse_mlx_hostfile`,
which import it on first use.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)

from corral.cluster._text import (
    _HOST_NAME_EXPECTED,
    _build,
    _check_env_name,
    _check_host_name,
    _check_label_key,
    _Defaults,
    _Entry,
    _expand,
    _parse_host_token,
    _parse_spec,
    _SpecError,
    _Where,
)
from corral.cluster.model import Cluster
from corral.errors import ConfigError

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


def parse_yaml_cluster(text: str, source: str) -> Cluster:
    """See :func:`corral.cluster.hostfile.parse_yaml_cluster`."""
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


def parse_mlx_hostfile(text: str, source: str) -> Cluster:
    """See :func:`corral.cluster.hostfile.parse_mlx_hostfile`."""
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
