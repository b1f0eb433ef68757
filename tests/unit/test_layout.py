"""The architecture holds: no import cycle between corral's modules, and nothing
below ``cli/`` knows about the command line."""

from __future__ import annotations

import ast
from pathlib import Path

import corral

SRC = Path(corral.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level_imports(path: Path) -> set[str]:
    """corral modules imported at module level by ``path`` (``if TYPE_CHECKING:``
    blocks included: a circle there is still a circle; imports inside functions,
    made lazily on purpose, are not)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("corral"))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                if base.startswith("corral"):
                    found.add(base)
                    found.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)

    visit(tree.body)
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for m in _module_level_imports(path) if m in modules and m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_graph_sees_imports() -> None:
    graph = _graph()
    assert "corral.job.supervisor" in graph["corral.job.engine"]
    assert "corral.job.result" in graph["corral.recovery.restart"]


def test_a_cycle_is_found() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_modules() -> None:
    cycle = _cycle({k: {d for d in v if not k.startswith(d + ".")} for k, v in _graph().items()})
    assert cycle is None, " -> ".join(cycle or [])


def test_nothing_below_the_cli_imports_it_or_typer() -> None:
    offenders = []
    for path in SRC.rglob("*.py"):
        name = _module_name(path)
        if name.startswith("corral.cli") or name == "corral.__main__":
            continue
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "typer" or n.startswith("corral.cli") for n in names):
                offenders.append(name)
    assert offenders == []


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def test_nothing_below_the_api_knows_http() -> None:
    """DESIGN §2: the service layer and everything under it know nothing of HTTP."""
    http = ("fastapi", "starlette", "sse_starlette", "uvicorn", "corral.api")
    offenders = sorted(
        _module_name(path)
        for path in SRC.rglob("*.py")
        if not _module_name(path).startswith(("corral.api", "corral.web", "corral.cli"))
        and any(n == h or n.startswith(h + ".") for n in _imports(path) for h in http)
    )
    assert offenders == []


def test_the_http_check_sees_an_http_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("from fastapi import FastAPI\nimport corral.api.app\n")
    assert _imports(sample) == ["fastapi", "corral.api.app"]
