"""The architecture holds: no import cycle between corral's modules, and nothing
below ``cli/`` knows about the command line."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

import corral
from corral.states import JobState, NodeState

SRC = Path(corral.__file__).parent


@cache
def _parsed(text: str) -> tuple[ast.Module, tuple[ast.AST, ...]]:
    """A source's tree and its nodes in ``ast.walk`` order: the checks below read every
    source file several times, and parsing and walking were most of their CPU (issue 30)."""
    tree = ast.parse(text)
    return tree, tuple(ast.walk(tree))


def _tree(path: Path) -> ast.Module:
    """``path`` parsed (once per text, see :func:`_parsed`)."""
    return _parsed(path.read_text(encoding="utf-8"))[0]


def _walk(path: Path) -> tuple[ast.AST, ...]:
    """Every node of ``path``'s tree, as ``ast.walk`` gives them."""
    return _parsed(path.read_text(encoding="utf-8"))[1]


@pytest.fixture(scope="module", autouse=True)
def _parse_once() -> Iterator[None]:
    """The parse cache lives for this module (one worker runs it), not the session:
    ~100 MB of trees would slow every later garbage collection of the worker."""
    yield
    _parsed.cache_clear()


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level_imports(path: Path) -> set[str]:
    """corral modules imported at module level by ``path`` (``if TYPE_CHECKING:``
    blocks included: a circle there is still a circle; imports inside functions,
    made lazily on purpose, are not)."""
    tree = _tree(path)
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
    assert "corral.job.supervisor" in graph["corral.job.attempts"]
    assert "corral.job.result" in graph["corral.job.engine"]
    assert "corral.outcomes" in graph["corral.recovery.restart"]


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
        if name == "corral.cli" or name.startswith("corral.cli.") or name == "corral.__main__":
            continue
        for node in _walk(path):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "typer" or n == "corral.cli" or n.startswith("corral.cli.") for n in names):
                offenders.append(name)
    assert offenders == []


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in _walk(path):
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


# --- every import, lazy ones included ----------------------------------------------------


def _all_imports(path: Path) -> set[str]:
    """corral modules ``path`` imports anywhere: module level, ``TYPE_CHECKING`` blocks
    and inside functions (a lazy import is still a dependency)."""
    name = _module_name(path) if path.is_relative_to(SRC) else path.stem
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _walk(path):
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
    return found


def _full_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    return {
        name: {m for m in _all_imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def _package(module: str) -> str:
    """The first-level package (``corral.job``) or top-level module (``corral.errors``)."""
    return ".".join(module.split(".")[:2])


def test_the_full_graph_sees_lazy_imports() -> None:
    graph = _full_graph()
    assert "corral.cluster._structured" in graph["corral.cluster.hostfile"]  # in a function
    assert "corral.cluster._structured" not in _graph()["corral.cluster.hostfile"]


def test_no_import_cycle_between_modules_lazy_imports_included() -> None:
    graph = {k: {d for d in v if not k.startswith(d + ".")} for k, v in _full_graph().items()}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_no_import_cycle_between_packages() -> None:
    """The root package's own imports are left out: ``corral/__init__`` is the facade
    over every layer (names resolved lazily), which any module may import for
    ``__version__``."""
    packages: dict[str, set[str]] = {}
    for module, deps in _full_graph().items():
        if module == "corral":
            continue
        here = _package(module)
        packages.setdefault(here, set()).update(
            there for there in map(_package, deps) if there != here
        )
    for deps in list(packages.values()):
        for dep in deps:
            packages.setdefault(dep, set())
    cycle = _cycle(packages)
    assert cycle is None, " -> ".join(cycle or [])


def test_dependency_rules() -> None:
    """DESIGN §2: below the engine never imports job/; service/ never imports an edge;
    job/ imports neither an edge nor service/ (lazy imports included)."""
    edges = ("corral.cli", "corral.api", "corral.web")
    below: tuple[str, ...] = ("corral.checks", "corral.sync", "corral.plan", "corral.cluster")
    below += ("corral.transport", "corral.remote", "corral.agent", "corral.contract")
    below += ("corral.recovery", "corral.fleet")
    rules = [
        (below, ("corral.job",)),
        (("corral.service",), edges),
        (("corral.job",), (*edges, "corral.service")),
    ]
    offenders = sorted(
        f"{module} imports {dep}"
        for module, deps in _full_graph().items()
        for users, banned in rules
        if _package(module) in users
        for dep in deps
        if _package(dep) in banned
    )
    assert offenders == []


# --- the SDK's private modules and the env/file contract ---------------------------------


def test_nothing_outside_the_sdk_imports_its_private_modules() -> None:
    offenders = sorted(
        f"{name} imports {dep}"
        for name, deps in _full_graph().items()
        if not name.startswith("corral.sdk")
        for dep in deps
        if dep.startswith("corral.sdk.") and dep.split(".")[2].startswith("_")
    )
    assert offenders == []


def test_the_sdk_check_sees_a_lazy_private_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("def f():\n    from corral.sdk._report import auth_line\n")
    assert "corral.sdk._report" in _all_imports(sample)


def _contract_literals(path: Path) -> list[str]:
    """Where ``path`` spells a name of :mod:`corral.contract` as a string literal
    (``envvar=`` of a CLI option excepted: DESIGN §3, variables that mirror options)."""
    from corral.contract import NAMES

    nodes = _walk(path)
    mirrors = {
        id(kw.value) for node in nodes if isinstance(node, ast.Call)
        for kw in node.keywords if kw.arg == "envvar"
    }  # fmt: skip
    return [
        f"{path.stem}:{node.lineno} {node.value}"
        for node in nodes
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in NAMES
        and id(node) not in mirrors
    ]


def test_the_contract_names_are_spelled_once() -> None:
    offenders = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if _module_name(path) != "corral.contract"
        for hit in _contract_literals(path)
    ]
    assert offenders == []


def test_the_literal_check_sees_a_contract_name(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text('env["CORRAL_NODE_DIR"] = "x"\nOption(envvar="CORRAL_CHECKPOINT_DIR")\n')
    assert [hit.split(" ")[1] for hit in _contract_literals(sample)] == ["CORRAL_NODE_DIR"]


def test_the_contract_is_a_leaf() -> None:
    assert _full_graph()["corral.contract"] == set()


# --- file size ------------------------------------------------------------------------------

MAX_LINES = 800
#: Files still over the limit, each to be split by concern. Shrink it, never grow it.
KNOWN_LONG: set[str] = set()


def test_no_source_file_over_800_lines() -> None:
    long = {
        _module_name(p)
        for p in SRC.rglob("*.py")
        if len(p.read_text(encoding="utf-8").splitlines()) > MAX_LINES
    }
    assert long - KNOWN_LONG == set(), f"over {MAX_LINES} lines: {sorted(long - KNOWN_LONG)}"
    assert KNOWN_LONG - long == set(), f"split now, drop from KNOWN_LONG: {KNOWN_LONG - long}"


def test_no_page_script_or_template_over_800_lines() -> None:
    """The size rule holds for the web pages' own JS and templates too."""
    web = SRC / "web"
    long = sorted(
        str(p.relative_to(web))
        for pattern in ("*.js", "*.html")
        for p in web.rglob(pattern)
        if len(p.read_text(encoding="utf-8").splitlines()) > MAX_LINES
    )
    assert long == [], f"over {MAX_LINES} lines: {long}"


# --- the job description is a leaf ---------------------------------------------------------

#: What loading a job description may load: value modules (the cluster, the SSH
#: options, the spec's defaults), never the engine or what it drives.
DESCRIPTION_LOADS = {
    "corral",
    "corral.lazy",
    "corral.errors",
    "corral.contract",
    "corral.defaults",
    "corral.redact",
    "corral.cluster",
    "corral.cluster._text",
    "corral.cluster.hostfile",
    "corral.cluster.model",
    "corral.plan",
    "corral.plan.spec",
    "corral.transport",
    "corral.transport.options",
    "corral.job",
    "corral.job.describe",
    "corral.job.option",
    "corral.job.schema",
}


def test_loading_a_job_description_loads_no_engine() -> None:
    import subprocess
    import sys

    code = (
        "import sys, corral.job.describe\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('corral'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    engine: tuple[str, ...] = ("corral.agent", "corral.checks", "corral.recovery", "corral.sync")
    engine += ("corral.job.engine", "corral.job.build", "corral.transport.base")
    assert [m for m in out if m.startswith(engine)] == []
    assert set(out) - DESCRIPTION_LOADS == set()


# --- plan/ does no I/O --------------------------------------------------------------------

#: Modules whose import in plan/ means I/O (processes, network, files, time of day).
IO_MODULES: tuple[str, ...] = (
    "subprocess",
    "socket",
    "shutil",
    "pathlib",
    "glob",
    "tempfile",
    "urllib",
    "http",
)
IO_MODULES += ("asyncio", "asyncssh", "httpx", "requests", "psutil", "sqlalchemy")
#: Calls that read or change the world outside the arguments.
IO_CALLS = {"open", "input", "print"}
IO_OS = {"getcwd", "getcwdb", "environ", "getenv", "listdir", "scandir", "stat", "walk"}
IO_OS |= {"chdir", "mkdir", "makedirs", "remove", "unlink", "rename", "system", "popen"}
IO_OS |= {"exists", "isfile", "isdir", "abspath", "realpath", "expanduser", "getmtime"}
IO_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "glob"}


def _io_uses(path: Path) -> list[str]:
    """Where ``path`` imports an I/O module or calls something that does I/O."""
    hits: list[str] = []
    for node in _walk(path):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            hits += [
                f"{where} import {a.name}" for a in node.names if a.name.startswith(IO_MODULES)
            ]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(IO_MODULES):
            hits.append(f"{where} from {node.module}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in IO_CALLS:
                hits.append(f"{where} {node.func.id}()")
        elif isinstance(node, ast.Attribute):
            base = node.value
            chain = base.value.id if isinstance(base, ast.Attribute) and isinstance(
                base.value, ast.Name
            ) else getattr(base, "id", "")  # fmt: skip
            if (chain == "os" or getattr(base, "id", "") == "os") and node.attr in IO_OS:
                hits.append(f"{where} os...{node.attr}")
            elif node.attr in IO_METHODS or (
                getattr(base, "id", "") == "Path" and node.attr in ("cwd", "home")
            ):
                hits.append(f"{where} .{node.attr}")
    return hits


def test_plan_does_no_io() -> None:
    """DESIGN §2: planning is pure, so every launch has a dry run and a re-plan in the
    supervisor is the plan that was confirmed (the launch dir comes in the spec)."""
    hits = [hit for path in sorted((SRC / "plan").rglob("*.py")) for hit in _io_uses(path)]
    assert hits == []


def test_the_io_check_sees_io(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text(
        "import os, subprocess\nfrom pathlib import Path\n"
        "a = os.getcwd()\nb = os.path.exists('x')\nc = Path.cwd()\nd = open('f')\n"
        "e = Path('x').read_text()\nf = os.environ['A']\ng = len('x')\n"
    )
    found = sorted(hit.split(" ", 1)[1] for hit in _io_uses(sample))
    assert found == sorted(
        [
            "import subprocess",
            "from pathlib",
            "os...getcwd",
            "os...exists",
            ".cwd",
            "open()",
            ".read_text",
            "os...environ",
        ]
    )


# --- a package's face never drags in a higher layer ----------------------------------------

#: DESIGN §2's layers, lowest first: a module may stand on its own layer or lower. The
#: top-level modules (``corral.errors``, ``corral.states``, ...) are leaves, layer 0.
LAYERS: tuple[tuple[str, ...], ...] = (
    # values and the parts the engine drives (the ranks' SDK, the node agent, transports)
    (
        *("corral.sdk", "corral.cluster", "corral.plan", "corral.agent", "corral.transport"),
        *("corral.remote", "corral.harness", "corral.track", "corral.store", "corral.throughput"),
    ),
    # below the engine
    ("corral.recovery", "corral.sync", "corral.fleet", "corral.diagnose", "corral.checks"),
    # the engine and what runs or renders jobs through its builder
    ("corral.job", "corral.calibrate", "corral.actors", "corral.k8s", "corral.slurm"),
    # the server's services and its client
    ("corral.notify", "corral.service", "corral.client"),
    # the edges
    ("corral.cli", "corral.api", "corral.web", "corral.testbed", "corral.__main__"),
)


def _layer(module: str) -> int:
    package = _package(module)
    for rank, names in enumerate(LAYERS, start=1):
        if package in names:
            return rank
    if (SRC / package.split(".")[-1]).is_dir():
        raise AssertionError(f"{package} is in no layer of LAYERS: place it")
    return 0  # a top-level module: a leaf


def _face_loads(init: Path, graph: dict[str, set[str]]) -> set[str]:
    """What importing the package of ``init`` loads: its module-level imports, and the
    modules its lazy name map (``_LAZY = {"Name": "corral.x.y"}``) resolves to, each with
    its parent packages, to the end."""
    lazy = {
        node.value for node in _walk(init)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in graph
    }  # fmt: skip
    todo = [*graph[_module_name(init)], *lazy]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen or module not in graph:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(2, len(parts))]
        todo += graph[module]
    return seen


def test_a_package_face_never_drags_in_a_higher_layer() -> None:
    """DESIGN §2: importing a package's ``__init__`` loads only its own layer and lower
    ones (the root package, the facade of the building blocks, the layer of cluster/
    and plan/)."""
    graph = _graph()
    offenders = []
    for init in sorted(SRC.rglob("__init__.py")):
        name = _module_name(init)
        if "migrations" in name:
            continue
        rank = 1 if name == "corral" else _layer(name)  # the root: the base layer's face
        offenders += [
            f"{name} loads {m}" for m in sorted(_face_loads(init, graph)) if _layer(m) > rank
        ]
    assert offenders == []


def test_every_module_stands_on_its_layer_or_lower() -> None:
    """The layers are the ones the code keeps (a module importing above its layer, at
    module level, is named)."""
    offenders = sorted(
        f"{module} imports {dep}"
        for module, deps in _graph().items()
        if module != "corral"
        for dep in deps
        if _layer(dep) > _layer(module)
    )
    assert offenders == []


def test_the_face_check_sees_a_lazy_map(tmp_path: Path) -> None:
    graph = _graph()
    init = SRC / "__init__.py"
    assert any(m.startswith("corral.plan") for m in _face_loads(init, graph))


# --- state names are spelled in one place ---------------------------------------------------

STATE_VALUES = {s.value for s in JobState} | {s.value for s in NodeState}
#: The layers that read job and node states: each names them through corral.states.
STATE_READERS: tuple[str, ...] = (
    "corral.client",
    "corral.service",
    "corral.recovery",
    "corral.job",
)
STATE_READERS += ("corral.cli", "corral.api", "corral.web")
#: Modules still spelling a state, each with why. Shrink it, never grow it.
STATE_LITERALS_LEFT: dict[str, str] = {}


def _names(node: ast.AST) -> list[str]:
    """The names and attributes an expression reads (``job.state.value``: job, state, value)."""
    return [
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(node)
        if isinstance(n, (ast.Name, ast.Attribute))
    ]


def _is_state(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in STATE_VALUES


def _stately(node: ast.AST) -> bool:
    """Named like a state (``job.state``), or a JSON status read by key (``data["status"]``,
    ``row.get("state")``)."""
    keys = [
        n.slice if isinstance(n, ast.Subscript) else n.args[0]
        for n in ast.walk(node)
        if isinstance(n, ast.Subscript)
        or (isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "get" and n.args)
    ]
    return any("state" in n.lower() for n in _names(node)) or any(
        isinstance(k, ast.Constant) and k.value in ("state", "status") for k in keys
    )


def _state_literals(path: Path) -> list[str]:
    """Where ``path`` spells a job or node state as a string: compared with something
    named like a state, passed as ``state=``, assigned to a state, a collection of
    nothing but state names, or a module constant named after its state (``QUEUED =
    "queued"``). Other vocabularies that share a word (a replica's ``failed`` pull, an
    enum of its own) are not states."""
    tree = _tree(path)
    hits: list[ast.AST] = []
    for node in _walk(path):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_stately(side) for side in sides):
                hits += [c for side in sides for c in ast.walk(side) if _is_state(c)]
        elif isinstance(node, ast.keyword) and "state" in (node.arg or "").lower():
            hits += [c for c in ast.walk(node.value) if _is_state(c)]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_stately(t) for t in targets):
                hits += [c for c in ast.walk(node.value) if _is_state(c)]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) > 1:
            hits += node.elts if all(map(_is_state, node.elts)) else []
        elif isinstance(node, ast.Dict) and len(node.keys) > 1:
            keys = [k for k in node.keys if k is not None and _is_state(k)]
            hits += keys if len(keys) == len(node.keys) else []
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_state(node.value):
            value = node.value.value  # type: ignore[attr-defined]
            hits += [node.value] if any(
                isinstance(t, ast.Name) and t.id.lower() == value for t in node.targets
            ) else []  # fmt: skip
    return sorted(
        {f"{path.stem}:{h.lineno} {h.value!r}" for h in hits if isinstance(h, ast.Constant)}
    )


def test_state_names_are_spelled_in_the_vocabulary_only() -> None:
    offenders = [
        hit
        for path in sorted(SRC.rglob("*.py"))
        if _module_name(path).startswith(STATE_READERS)
        and _module_name(path) not in STATE_LITERALS_LEFT
        for hit in _state_literals(path)
    ]
    assert offenders == []
    left = {_module_name(p): _state_literals(p) for p in SRC.rglob("*.py")}
    assert [m for m in STATE_LITERALS_LEFT if not left.get(m)] == [], "fixed: drop it"


def test_the_state_check_sees_state_names(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text(
        'QUEUED = "queued"\nENDED = ("failed", "lost")\nCODES = {"succeeded": 0, "lost": 1}\n'
        'if job.state == "running": pass\nNode(state="starting")\n'
        'class R:\n    state: str = "pending"\n'
        'class HostHealth(enum.Enum):\n    LOST = "lost"\n'
        'x = getattr(p, "lost")\nPullResult("failed")\nstatus = ("pulled", "failed")\n'
        'if data["status"] != "queued": pass\nif row.get("state") == "lost": pass\n'
        'if r.status == "failed": pass\n'
    )
    found = [hit.split(" ")[1] for hit in _state_literals(sample)]
    expected = ["'queued'", "'failed'", "'lost'", "'succeeded'", "'lost'", "'running'"]
    assert sorted(found) == sorted([*expected, "'starting'", "'pending'", "'queued'", "'lost'"])


# --- every job is built by the one builder ------------------------------------------------

#: What only the builder makes: the engine's Job (job/build.py ``new_job``), a job's
#: JobSpec (job/build.py ``job_spec``; plan/specjson.py reads one back from its JSON)
#: and the Slurm render's job (slurm/render.py ``slurm_job``, of a JobDescription).
BUILT: dict[str, tuple[str, ...]] = {
    "corral.job.engine.Job": ("corral.job.build",),
    "corral.plan.spec.JobSpec": ("corral.job.build", "corral.plan.specjson"),
    "corral.slurm.render.SlurmJob": ("corral.slurm.render",),
}
#: Modules making one anyway, each with why. Shrink it, never grow it.
BUILT_ELSEWHERE: dict[str, str] = {}


def _constructions(path: Path) -> list[str]:
    """Where ``path`` calls a class of :data:`BUILT` (imported by name, under any alias,
    or through its module), as ``module.Class:line``; lazy imports included."""
    nodes = _walk(path)
    names: dict[str, str] = {}  # local name -> the class's full name
    modules: dict[str, str] = {}  # local name -> the module it stands for
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in BUILT:
                    names[alias.asname or alias.name] = full
                elif any(b.startswith(full + ".") for b in BUILT):
                    modules[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and any(b.startswith(alias.name + ".") for b in BUILT):
                    modules[alias.asname] = alias.name
                elif not alias.asname:  # ``import a.b.c`` binds ``a``
                    top = alias.name.split(".")[0]
                    modules[top] = top
    hits = []
    for node in nodes:
        if not isinstance(node, ast.Call):
            continue
        func, full = node.func, None
        if isinstance(func, ast.Name):
            full = names.get(func.id)
        elif isinstance(func, ast.Attribute):
            parts: list[str] = [func.attr]
            base: ast.expr = func.value
            while isinstance(base, ast.Attribute):
                parts.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                full = ".".join([modules[base.id], *parts])
        if full in BUILT:
            hits.append(f"{full}:{node.lineno}")
    return sorted(hits, key=lambda hit: int(hit.rpartition(":")[2]))


def test_every_job_is_built_by_the_one_builder() -> None:
    """DESIGN §2: ``corral run``/``plan``, the server's planner and supervisor process,
    calibration and the Kubernetes/Slurm renders build their jobs through job/build.py
    (``ready_job``, ``job_spec``); nothing else makes an engine Job or a JobSpec."""
    offenders = sorted(
        f"{_module_name(path)} makes {hit}"
        for path in SRC.rglob("*.py")
        if _module_name(path) not in BUILT_ELSEWHERE
        for hit in _constructions(path)
        if _module_name(path) not in BUILT[hit.split(":")[0]]
    )
    assert offenders == []
    made = {_module_name(p): _constructions(p) for p in SRC.rglob("*.py")}
    assert [m for m in BUILT_ELSEWHERE if not made.get(m)] == [], "fixed: drop it"


#: What the actors runtime may import of the engine's layer (job/, plan/): the one
#: builder (its workers are a JobDescription made ready by ``job.build.ready_ranks``)
#: and the value modules. Never the planner, the resolver or the engine themselves.
ACTORS_REACH: tuple[str, ...] = (
    *("corral.job.build", "corral.job.describe", "corral.job.schema"),
    *("corral.job.states", "corral.job.result", "corral.job.logfiles"),
)


def test_the_actors_build_their_workers_through_the_builder() -> None:
    """Issue 31: the actors runtime plans its workers with job/build.py (an option
    means the same there as for corral run), not a launch path of its own."""
    reached = {
        dep
        for module, deps in _full_graph().items()
        if _package(module) == "corral.actors"
        for dep in deps
        if _package(dep) in ("corral.job", "corral.plan")
    }
    assert sorted(reached - set(ACTORS_REACH)) == []
    assert "corral.job.build" in reached


def test_the_builder_check_sees_a_job_made(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text(
        "from corral.job.engine import Job as J\nimport corral.plan.spec\n"
        "from corral.store.models import Job\nfrom corral.job import engine\n"
        "def f():\n    from corral.plan.spec import JobSpec\n    JobSpec(script='t')\n"
        "J(s, c)\nJob(id='x')\ncorral.plan.spec.JobSpec()\nengine.Job(s, c)\n"
    )
    assert _constructions(sample) == [
        "corral.plan.spec.JobSpec:7",
        "corral.job.engine.Job:8",
        "corral.plan.spec.JobSpec:10",
        "corral.job.engine.Job:11",
    ]
