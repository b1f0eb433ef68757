"""Which function a worker runs: described on the coordinator, loaded on the worker.

``work_fn`` may be a module-level callable, ``"module.function"``,
``"module:function"``, ``"path/to/file.py:function"`` or ``"__main__.function"``.
A function of the coordinator's main script is loaded on the worker from the
script's path under the name ``__mp_main__`` (as :mod:`multiprocessing` does), so
its ``if __name__ == "__main__":`` block does not run; ``sys.modules["__main__"]``
then points at it, so pickled instances of its classes resolve.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import Any, Literal, cast

from corral.errors import ConfigError

Kind = Literal["module", "dotted", "file", "main"]
MAIN_NAME = "__mp_main__"


@dataclass(frozen=True)
class WorkFnSpec:
    """A work function, as the worker finds it.

    ``module``: import ``module`` (or, if that fails, load ``path`` under that name);
    ``dotted``: ``qualname`` is a full dotted path, the longest importable prefix is
    the module; ``file``: load the file ``path``; ``main``: load the script ``path``
    as ``__mp_main__``. ``qualname`` is then looked up in the module.
    """

    kind: Kind
    qualname: str
    module: str | None = None
    path: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As JSON-able data (the init frame)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkFnSpec:
        """The spec from :meth:`to_json`'s data."""
        return cls(**data)

    def __str__(self) -> str:
        if self.kind == "dotted":
            return self.qualname
        where = self.module if self.kind == "module" else self.path
        return f"{where}:{self.qualname}"


def _bad(work_fn: object, why: str) -> ConfigError:
    return ConfigError(f"{work_fn!r}: {why}", option="work_fn")


def _no_file(work_fn: object, who: str, source: str | None) -> ConfigError:
    came = f"its code came from {source!r}" if source else "interactive?"
    return _bad(
        work_fn,
        f"{who} no file ({came}: a REPL, a notebook, `python -` or `python -c`); a worker "
        "loads work_fn from a file: define it in a module (or a script) and import it",
    )


def _pseudo_file(path: str) -> bool:
    """Whether ``path`` names no file but where code came from: ``<stdin>``,
    ``<string>``, ``<python-input-0>``, ..."""
    name = os.path.basename(path)
    return name.startswith("<") and name.endswith(">")


def _main_spec(qualname: str, work_fn: object) -> WorkFnSpec:
    """A function of the coordinator's ``__main__``: its module when run with
    ``python -m``, else its script's path (ConfigError when it has none)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return WorkFnSpec("module", qualname, module=spec.name, path=spec.origin)
    path = getattr(main, "__file__", None)
    if not path:
        raise _no_file(work_fn, "the main program has", None)
    if _pseudo_file(path):
        raise _no_file(work_fn, "the main program has", path)
    return WorkFnSpec("main", qualname, path=os.path.abspath(path))


def _source_file(work_fn: object) -> str | None:
    """The file a function's code was compiled from (None when unknown)."""
    code = getattr(work_fn, "__code__", None)
    filename = getattr(code, "co_filename", None)
    return filename if isinstance(filename, str) else None


def describe(work_fn: Callable[..., Any] | str) -> WorkFnSpec:
    """How a worker finds ``work_fn`` (ConfigError for a lambda, a nested function, a
    function typed at a REPL or read from stdin, or a malformed string)."""
    if isinstance(work_fn, str):
        text = work_fn.strip()
        if ":" in text:
            where, _, name = text.rpartition(":")
            if not where or not name or not name.replace(".", "_").isidentifier():
                raise _bad(work_fn, "expected 'module:function' or 'path/to/file.py:function'")
            if where.endswith(".py") or "/" in where or os.sep in where:
                return WorkFnSpec("file", name, path=where)
            return WorkFnSpec("module", name, module=where)
        if text.startswith("__main__."):
            return _main_spec(text.removeprefix("__main__."), work_fn)
        if "." not in text or not all(p.isidentifier() for p in text.split(".")):
            raise _bad(work_fn, "expected 'module.function' (or module:function, file.py:function)")
        return WorkFnSpec("dotted", text)
    if not callable(work_fn):
        raise _bad(work_fn, "expected a function or a 'module.function' string")
    qualname = getattr(work_fn, "__qualname__", "")
    module = getattr(work_fn, "__module__", None)
    if not qualname or not module or "<" in qualname:
        raise _bad(
            work_fn,
            "a worker can run only a module-level function (not a lambda or a nested function)",
        )
    source = _source_file(work_fn)
    if source is not None and _pseudo_file(source):
        raise _no_file(work_fn, "it has", source)
    if module in ("__main__", MAIN_NAME):
        return _main_spec(qualname, work_fn)
    path = getattr(sys.modules.get(module), "__file__", None)
    return WorkFnSpec("module", qualname, module=module, path=path)


# -- on the worker -------------------------------------------------------------------------


def _load_file(path: str, name: str) -> ModuleType:
    """Execute ``path`` as module ``name`` (registered in ``sys.modules`` first); its
    directory goes first on ``sys.path``, as for ``python path``."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise FileNotFoundError(f"{path}: no such file on this host (cwd {os.getcwd()})")
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a module")
    folder = os.path.dirname(full)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _file_module_name(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    name = stem if stem.isidentifier() else "_corral_work_fn"
    loaded = sys.modules.get(name)
    if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") != (
        os.path.abspath(path)
    ):
        name = f"_corral_work_fn_{name}"
    return name


def _import_longest(dotted: str) -> tuple[ModuleType, str]:
    """The module of the longest importable prefix of ``dotted`` and the rest."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:cut])
        try:
            return importlib.import_module(name), ".".join(parts[cut:])
        except ModuleNotFoundError as exc:
            if exc.name is None or not name.startswith(exc.name):
                raise  # the module exists but imports something missing
    raise ModuleNotFoundError(f"no module found for {dotted!r}", name=parts[0])


def _module_for(spec: WorkFnSpec) -> tuple[ModuleType, str]:
    if spec.kind == "dotted":
        return _import_longest(spec.qualname)
    if spec.kind == "main":
        assert spec.path is not None
        module = _load_file(spec.path, MAIN_NAME)
        sys.modules["__main__"] = module
        return module, spec.qualname
    if spec.kind == "file":
        assert spec.path is not None
        return _load_file(spec.path, _file_module_name(spec.path)), spec.qualname
    assert spec.module is not None
    try:
        return importlib.import_module(spec.module), spec.qualname
    except ImportError:
        if spec.path and os.path.isfile(spec.path):
            return _load_file(spec.path, spec.module), spec.qualname
        raise


def load(spec: WorkFnSpec) -> Callable[..., Any]:
    """Import or load the module of ``spec`` and return its function."""
    module, qualname = _module_for(spec)
    target: Any = module
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise AttributeError(f"{module.__name__} has no {qualname!r}") from None
    if not callable(target):
        raise TypeError(f"{spec} is not callable ({type(target).__name__})")
    return cast(Callable[..., Any], target)
