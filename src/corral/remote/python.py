"""Run corral's standard-library-only helpers on a host with ``python -c``.

Checks and sync need a few lines of Python on every host (hash the code tree,
read versions, bind a port). The hosts may have another corral version, or
none yet, so nothing is imported from the host's corral: the sources of the
needed modules (which must import only the standard library and each other)
are sent in the program text and registered under their own names, then one
function is called with JSON arguments. The result is whatever it prints.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_BOOT = """\
import json as _j, sys as _s, types as _t
def _install(name, src):
    parts = name.split(".")
    for i in range(1, len(parts)):
        pkg = ".".join(parts[:i])
        if pkg not in _s.modules or not getattr(_s.modules[pkg], "_corral_shipped", False):
            m = _t.ModuleType(pkg); m.__path__ = []; m._corral_shipped = True; _s.modules[pkg] = m
    m = _t.ModuleType(name); m._corral_shipped = True; m.__file__ = "<corral:" + name + ">"
    _s.modules[name] = m
    exec(compile(src, m.__file__, "exec"), m.__dict__)
    return m
"""

_SHELL = (
    'for p in "$@"; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -c "$CORRAL_PROGRAM"; '
    'fi; done; echo "no python interpreter found (tried: $*)" >&2; exit 127'
)


def _source(module: str) -> str:
    mod = importlib.import_module(module)
    path = getattr(mod, "__file__", None)
    if path is None:
        raise RuntimeError(f"{module} has no source file")
    return Path(path).read_text(encoding="utf-8")


def program(modules: Sequence[str], call: str, *args: Any) -> str:
    """Program text: install ``modules`` (dotted names, in dependency order), then
    call ``call`` (``module:function``) with ``args`` decoded from JSON."""
    module, _, func = call.partition(":")
    lines = [_BOOT]
    for name in modules:
        lines.append(f"_install({name!r}, {_source(name)!r})")
    payload = json.dumps(list(args))
    lines.append(f"_s.exit(_s.modules[{module!r}].{func}(*_j.loads({payload!r})) or 0)")
    return "\n".join(lines) + "\n"


def candidates(python: str | None) -> list[str]:
    """Interpreters to try on a host, in order: ``--python``, else the
    coordinator's own interpreter path, else ``python3``."""
    if python:
        return [python]
    return [sys.executable, "python3"] if sys.executable else ["python3"]


def shell_argv(python: str | None) -> tuple[list[str], str]:
    """argv that runs ``$CORRAL_PROGRAM`` with the first interpreter found, and the
    name of the variable the program text must be passed in (through ``env``)."""
    return ["sh", "-c", _SHELL, "sh", *candidates(python)], "CORRAL_PROGRAM"
