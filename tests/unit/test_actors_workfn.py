"""work_fn forms: how the coordinator describes each one and how a worker loads it."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.actors._workfn import MAIN_NAME, WorkFnSpec, describe, load
from corral.errors import ConfigError

SOURCE = textwrap.dedent(
    """
    ran_main_block = False

    def work(handle):
        return ("work", handle)

    class Box:
        @staticmethod
        def method(handle):
            return ("method", handle)

    if __name__ == "__main__":
        ran_main_block = True
        raise SystemExit("the main block must not run on a worker")
    """
)


@pytest.fixture
def module_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``wfmod_<n>.py`` in tmp_path, on sys.path; removed from sys.modules afterwards."""
    name = f"wfmod_{os.getpid()}_{len(sys.modules)}"
    path = tmp_path / f"{name}.py"
    path.write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield path
    for mod in [name, f"_corral_work_fn_{name}"]:
        sys.modules.pop(mod, None)


def test_module_level_callable() -> None:
    spec = describe(describe)
    assert spec == WorkFnSpec(
        "module",
        "describe",
        module="corral.actors._workfn",
        path=sys.modules["corral.actors._workfn"].__file__,
    )
    assert load(spec) is describe
    assert str(spec) == "corral.actors._workfn:describe"


def test_string_forms() -> None:
    assert describe("pkg.mod.func") == WorkFnSpec("dotted", "pkg.mod.func")
    assert describe("pkg.mod:Cls.meth") == WorkFnSpec("module", "Cls.meth", module="pkg.mod")
    assert describe("train/steps.py:work") == WorkFnSpec("file", "work", path="train/steps.py")
    assert describe("steps.py:work") == WorkFnSpec("file", "work", path="steps.py")
    assert describe(" os.path.join ") == WorkFnSpec("dotted", "os.path.join")


@pytest.mark.parametrize("bad", ["work", "a..b", "mod:", ":f", "mod:f-g", "1x.y", ""])
def test_malformed_strings(bad: str) -> None:
    with pytest.raises(ConfigError, match="work_fn"):
        describe(bad)


def test_lambdas_and_nested_functions_are_refused() -> None:
    def nested(handle: object) -> None:
        pass

    for fn in (lambda h: None, nested):
        with pytest.raises(ConfigError, match="module-level"):
            describe(fn)
    with pytest.raises(ConfigError):
        describe(42)  # type: ignore[arg-type]


def test_main_functions_name_the_main_script(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    fake_main = types.ModuleType("__main__")
    fake_main.__file__ = "train.py"
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    spec = describe("__main__.training_work_fn")
    assert spec == WorkFnSpec("main", "training_work_fn", path=os.path.abspath("train.py"))

    def fn(handle: object) -> None:
        pass

    fn.__module__ = "__main__"
    fn.__qualname__ = "fn"
    assert describe(fn) == WorkFnSpec("main", "fn", path=os.path.abspath("train.py"))
    # run as ``python -m pkg.train``: the module is imported by name instead
    fake_main.__spec__ = types.SimpleNamespace(name="pkg.train", origin="/x/pkg/train.py")  # type: ignore[assignment]
    assert describe(fn) == WorkFnSpec("module", "fn", module="pkg.train", path="/x/pkg/train.py")
    del fake_main.__file__
    fake_main.__spec__ = None
    with pytest.raises(ConfigError, match="no file"):
        describe("__main__.fn")


def test_load_each_form(module_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = module_file.stem
    assert load(WorkFnSpec("dotted", f"{name}.work"))(1) == ("work", 1)
    assert load(WorkFnSpec("dotted", f"{name}.Box.method"))(2) == ("method", 2)
    assert load(WorkFnSpec("module", "Box.method", module=name))(3) == ("method", 3)
    assert load(WorkFnSpec("file", "work", path=str(module_file)))(4) == ("work", 4)


def test_load_a_module_by_its_file_when_it_is_not_importable(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere.py"
    path.write_text(SOURCE)
    try:
        fn = load(WorkFnSpec("module", "work", module="not_on_path_mod", path=str(path)))
        assert fn(5) == ("work", 5)
        assert sys.modules["not_on_path_mod"].__file__ == str(path)
    finally:
        sys.modules.pop("not_on_path_mod", None)


def test_load_the_main_script_without_its_main_block(
    module_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    monkeypatch.delitem(sys.modules, MAIN_NAME, raising=False)
    fn = load(WorkFnSpec("main", "work", path=str(module_file)))
    assert fn(6) == ("work", 6)
    main = sys.modules["__main__"]
    assert main is sys.modules[MAIN_NAME] and main.__name__ == MAIN_NAME
    assert main.ran_main_block is False


def test_load_errors(tmp_path: Path, module_file: Path) -> None:
    with pytest.raises(ModuleNotFoundError):
        load(WorkFnSpec("dotted", "no_such_pkg_xyz.work"))
    with pytest.raises(AttributeError, match="missing"):
        load(WorkFnSpec("dotted", f"{module_file.stem}.missing"))
    with pytest.raises(TypeError, match="not callable"):
        load(WorkFnSpec("dotted", f"{module_file.stem}.ran_main_block"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        load(WorkFnSpec("file", "work", path=str(tmp_path / "nope.py")))
    broken = tmp_path / "broken_dep_mod.py"
    broken.write_text("import no_such_dependency_xyz\n")
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        load(WorkFnSpec("dotted", "broken_dep_mod.work"))  # a real import error, not "absent"
    sys.modules.pop("broken_dep_mod", None)


def test_functions_typed_at_a_repl_or_read_from_stdin_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker loads work_fn from a file: code from ``<stdin>`` (``python -``, a
    REPL) has none, so it is refused here rather than failing on every worker."""
    import types

    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile("def work(handle):\n    pass\n", "<stdin>", "exec"), namespace)
    with pytest.raises(ConfigError, match=r"no file \(its code came from '<stdin>'"):
        describe(namespace["work"])  # type: ignore[arg-type]
    exec(compile("def work(handle):\n    pass\n", "<python-input-0>", "exec"), namespace)
    with pytest.raises(ConfigError, match="define it in a module"):
        describe(namespace["work"])  # type: ignore[arg-type]
    fake_main = types.ModuleType("__main__")
    fake_main.__file__ = "<stdin>"
    monkeypatch.setitem(sys.modules, "__main__", fake_main)
    with pytest.raises(ConfigError, match="the main program has no file"):
        describe("__main__.work")
