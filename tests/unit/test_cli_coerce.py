"""corral.cli.coerce: plain option values are coerced without typer's pydantic
adapters, to exactly what typer's own coercion gives (value, type, error)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
import typer
from typer._click import Command, Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param
from typer.core import TyperOption

from corral.cli import coerce
from corral.cli.main import _register, app

SAMPLES: list[Any] = [
    "5", "007", "0", "-3", "+4", " 5", "5 ", "1_000", "5.0", "1.5", "-1.5", ".5", "5.",
    "1e3", "inf", "nan", "", "abc", "\u0663", "True", "true", "1", "no",
    b"bytes", 5, 0, -2, 2.5, True, False, None,
    ("a", "b"), ["1", "2"], ("1", "x"), (), [3, "4"], ("2.5",),
]  # fmt: skip


@cache
def _corral() -> Command:
    """corral's click command, built once (~40 ms each time: the whole CLI)."""
    return typer.main.get_command(app)


def _outcome(runtime: Any, value: Any, param: TyperOption) -> tuple[str, Any]:
    ctx = Context(_corral())
    try:
        result = runtime.coerce(value, param=param, ctx=ctx)
    except BadParameter as exc:
        return "error", exc.message
    return type(result).__name__, repr(result)  # repr: nan == nan


def _option(annotation: Any) -> TyperOption:
    command = typer.main.get_command(_app_with(annotation))
    [param] = [p for p in command.params if isinstance(p, TyperOption) and p.name == "value"]
    return param


def _app_with(annotation: Any) -> typer.Typer:
    holder = typer.Typer()

    @holder.command()
    def verb(value: str = typer.Option(None)) -> None:
        """A verb with one option."""

    verb.__annotations__["value"] = annotation  # read when the command is built
    return holder


@pytest.mark.parametrize("annotation", [str, int, float, bool, list[str], list[int], list[float]])
def test_plain_values_coerce_as_typer_does(annotation: Any) -> None:
    param = _option(annotation)
    assert coerce.handles(param)
    typer_way = build_runtime_param(param.type_descriptor)
    for value in SAMPLES:
        multi = param.multiple or param.nargs == -1
        if multi and isinstance(value, str | bytes):
            continue  # click never gives a multi-value option one string
        ours = _outcome(
            coerce.PlainValue(param.type_descriptor.parameter_info, annotation), value, param
        )
        assert ours == _outcome(typer_way, value, param), (annotation, value)


def test_only_plain_options_get_the_plain_coercion() -> None:
    ranged = typer.main.get_command(_ranged_app())
    params = {p.name: p for p in ranged.params}
    assert not coerce.handles(params["port"])  # a range: typer's coercion, its message
    assert coerce.handles(params["name"])


def _ranged_app() -> typer.Typer:
    holder = typer.Typer()

    @holder.command()
    def verb(
        port: int = typer.Option(1, min=1, max=65535),
        name: str = typer.Option("x"),
    ) -> None:
        """A verb with a ranged option."""

    return holder


def test_every_option_of_run_is_installed_or_left_to_typer() -> None:
    _register()
    group = typer.main.get_group(app)
    run = group.commands["run"]
    plain = [p for p in run.params if coerce.handles(p)]
    assert len(plain) > 20  # nearly all of them: strings, numbers, flags, lists
