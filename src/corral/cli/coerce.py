"""Coercing command-line values without a pydantic TypeAdapter per option.

typer (0.29) coerces every option's value through a pydantic ``TypeAdapter`` it
builds for that option when the command parses its arguments: importing its
adapters and building one per option (``corral run`` has 35) costs the
coordinator tens of milliseconds before it starts anything, a cost every
``corral`` verb pays.

:class:`PlainValue` coerces the values whose result is unambiguous itself: a
``str`` given as a string, a ``bool`` as a bool, an ``int`` or ``float`` given as
one or as plain decimal digits, and lists of those. Any other value (a sign, spaces, an
exponent, bytes, a value it cannot read) goes to typer's own coercion, built
when first needed, so the result and every error message are typer's.
:func:`install` puts it on the options and arguments whose annotation is one of
those plain types and that declare no parser, range or file.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from typer._click import Context, Parameter
from typer._coercion import RuntimeParam, build_runtime_param
from typer.core import _TyperParameter

_DIGITS = re.compile(r"[0-9]+")
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?")
_NOT_GIVEN = object()


def _plain_str(value: Any) -> Any:
    return value if type(value) is str else _NOT_GIVEN


def _plain_bool(value: Any) -> Any:
    return value if type(value) is bool else _NOT_GIVEN


def _plain_number(kind: type[int] | type[float], digits: re.Pattern[str], value: Any) -> Any:
    if type(value) is kind:
        return value
    if type(value) is str and digits.fullmatch(value):
        return kind(value)
    return _NOT_GIVEN


_plain_int = functools.partial(_plain_number, int, _DIGITS)
_plain_float = functools.partial(_plain_number, float, _DECIMAL)


_Plain = Callable[[Any], Any]
_LEAVES: dict[Any, _Plain] = {
    str: _plain_str,
    bool: _plain_bool,
    int: _plain_int,
    float: _plain_float,
}
_LISTS: dict[Any, _Plain] = {
    list[str]: _plain_str,
    list[int]: _plain_int,
    list[float]: _plain_float,
}


@dataclass(frozen=True)
class PlainValue(RuntimeParam):
    """A plain value coerced here; anything else by typer's coercion."""

    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        plain = _plain(self.annotation, value)
        if plain is not _NOT_GIVEN:
            return plain
        return build_runtime_param(param.type_descriptor)._coerce_value(value, param, ctx)


def _plain(annotation: Any, value: Any) -> Any:
    """``value`` coerced to ``annotation`` when the result is unambiguous, else
    ``_NOT_GIVEN``."""
    leaf = _LEAVES.get(annotation)
    if leaf is not None:
        return leaf(value)
    item = _LISTS.get(annotation)
    if item is None or not isinstance(value, list | tuple):
        return _NOT_GIVEN
    items = [item(v) for v in value]
    return _NOT_GIVEN if any(i is _NOT_GIVEN for i in items) else items


def handles(param: Parameter) -> bool:
    """Whether :func:`install` gives ``param`` a :class:`PlainValue`."""
    if not isinstance(param, _TyperParameter):
        return False
    descriptor = param.type_descriptor
    info = descriptor.parameter_info
    return (
        (descriptor.annotation in _LEAVES or descriptor.annotation in _LISTS)
        and descriptor.file_annotation is None
        and info.parser is None
        and info.min is None
        and info.max is None
    )


def install(param: Parameter) -> None:
    """Coerce ``param``'s values with :class:`PlainValue` where it :func:`handles` it."""
    if handles(param) and isinstance(param, _TyperParameter) and param._runtime_param is None:
        descriptor = param.type_descriptor
        param._runtime_param = PlainValue(
            parameter_info=descriptor.parameter_info, annotation=descriptor.annotation
        )
