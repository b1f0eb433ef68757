"""The text hostfile grammar: ``host[:slots] [key=value ...]`` lines, Slurm-style
ranges and the ``--hosts`` comma list, and the checks and builder the YAML and MLX
JSON parsers (:mod:`corral.cluster._structured`) share. Errors name ``file:line``
or the option; :mod:`corral.cluster.hostfile` picks the parser for a file.
"""

from __future__ import annotations

import itertools
import math
import re
import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from corral.cluster.model import Cluster, Host
from corral.contract import is_env_name
from corral.errors import ConfigError

#: Plain ``key=value`` keys of a text hostfile line (plus ``label.K`` and ``env.K``).
HOSTFILE_KEYS: tuple[str, ...] = ("slots", "port", "user", "interface", "address")

#: Upper bound on the number of hosts one spec may expand to (guards ``n[1-99999999]``).
MAX_HOSTS = 65536

_OPTION = "--hosts"
_ALLOWED_KEYS_TEXT = ", ".join(HOSTFILE_KEYS) + ", label.NAME, env.NAME"
_HOST_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._/-]*$")
_DIGITS_RE = re.compile(r"^[0-9]+$")
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
    if not is_env_name(name):
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
    import difflib  # only on this error path

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
