"""A default is written once: each ``DEFAULT_*`` constant is defined by one module, and
the defaults of :mod:`corral.defaults` are not written again as literals (a parameter,
a field, a keyword or a ``.get(name, default)`` spelling the same value)."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import corral
from corral import defaults

SRC = Path(corral.__file__).parent


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once for both scans (~0.7 CPU-s for the sources)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def _module(path: Path) -> str:
    if not path.is_relative_to(SRC):
        return path.stem
    return ".".join(path.relative_to(SRC.parent).with_suffix("").parts)


def _defined(tree: ast.Module) -> list[str]:
    """The ``DEFAULT_*`` names a module assigns at module level."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if n.startswith("DEFAULT_")]


def duplicated_defaults(paths: list[Path]) -> dict[str, list[str]]:
    """Each ``DEFAULT_*`` name defined by more than one module, with the modules."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        for name in _defined(_parsed(path)):
            where[name].append(_module(path))
    return {name: sorted(mods) for name, mods in where.items() if len(mods) > 1}


def _same(node: ast.AST | None, value: object) -> bool:
    return (
        isinstance(node, ast.Constant)
        and type(node.value) in (int, float)
        and type(value) in (int, float)
        and node.value == value
    )


def literal_copies(path: Path, known: dict[str, object]) -> list[str]:
    """Where ``path`` writes a default of ``known`` (option name -> value) as a literal."""
    hits: list[str] = []
    for node in ast.walk(_parsed(path)):
        pairs: list[tuple[str, ast.AST | None, int]] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            pairs += [
                (a.arg, d, d.lineno)
                for a, d in zip(
                    positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
                )
            ]
            pairs += [
                (a.arg, d, d.lineno)
                for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                if d
            ]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            pairs.append((node.target.id, node.value, node.lineno))
        elif isinstance(node, ast.Call):
            pairs += [(k.arg, k.value, k.value.lineno) for k in node.keywords if k.arg]
            name = node.args[0] if node.args else None
            if (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and len(node.args) == 2
                and isinstance(name, ast.Constant)
                and isinstance(name.value, str)
            ):
                pairs.append((name.value, node.args[1], node.lineno))
        hits += [
            f"{_module(path)}:{line} {name}"
            for name, value, line in pairs
            if name in known and _same(value, known[name])
        ]
    return hits


def _known() -> dict[str, object]:
    return {
        name.removeprefix("DEFAULT_").lower(): getattr(defaults, name) for name in defaults.__all__
    }


def test_each_default_constant_is_defined_by_one_module() -> None:
    assert duplicated_defaults(sorted(SRC.rglob("*.py"))) == {}


def test_the_defaults_are_not_written_again_as_literals() -> None:
    known = _known()
    assert {"grace", "master_port", "collective_timeout"} <= set(known)
    offenders = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if path != Path(defaults.__file__)
        for hit in literal_copies(path, known)
    ]
    assert offenders == []


def test_the_scans_see_a_copy(tmp_path: Path) -> None:
    one, two = tmp_path / "corral_a.py", tmp_path / "corral_b.py"
    one.write_text("DEFAULT_MASTER_PORT = 29500\n")
    two.write_text(
        "DEFAULT_MASTER_PORT: int = 29500\n"
        "class P:\n    grace: float = 10.0\n    master_port: int = 0\n"
        "def f(x, grace=10.0, *, master_port: int = 29500): ...\n"
        "def g(start): return start.get('grace', 10.0), f(1, grace=10.0)\n"
    )
    assert duplicated_defaults([one, two]) == {"DEFAULT_MASTER_PORT": ["corral_a", "corral_b"]}
    hits = [h.split(" ")[1] for h in literal_copies(two, _known())]
    assert hits.count("grace") == 4 and hits.count("master_port") == 1
