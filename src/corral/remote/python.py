"""Run corral's standard-library-only helpers on a host, the program sent over stdin.

Checks, sync and checkpoints need a few lines of Python on every host (hash
the code tree, read versions, bind a port, stream a checkpoint). The hosts may
have another corral version, or none yet, so nothing is imported from the
host's corral: the sources of the needed modules (which must import only the
standard library and each other) are sent in the program text and registered
under their own names, then one function is called with JSON arguments. The
result is whatever it prints.

The program travels over the process's **stdin**, never in its command line or
environment (Linux caps one argument, and one environment string, at 128 KiB):
the command line holds only a short fixed bootstrap that reads a decimal
length line and that many bytes of program text from ``sys.stdin.buffer``, then
runs it. Whatever follows the program on stdin is left for the program, which
must read it through ``sys.stdin`` / ``sys.stdin.buffer`` (not ``os.read(0)``:
the bootstrap's buffered reader may already hold the first bytes).
"""

from __future__ import annotations

import importlib
import json
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from corral.cluster.model import Host
from corral.transport.base import NodeProcess, Transport

__all__ = [
    "agent_argv",
    "bootstrap_argv",
    "candidates",
    "program",
    "shell_command",
    "start_program",
    "stdin_payload",
]

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

#: What ``python -c`` runs: read ``LENGTH\\n`` and that many bytes of program from
#: stdin, then run the program (the rest of stdin is the program's).
_BOOTSTRAP = """\
import sys
b = sys.stdin.buffer
h = b.readline().strip()
if not h.isdigit():
    sys.exit("corral: no helper program arrived on stdin")
s = b.read(int(h))
if len(s) != int(h):
    sys.exit("corral: the helper program on stdin was cut short")
exec(compile(s, "<corral>", "exec"), {"__name__": "__corral__"})
"""

#: ``sh -c`` script: ``$0`` is a label (shows in ``ps``), ``$1`` the bootstrap, the
#: rest the interpreters to try in order.
_SHELL = (
    'b=$1; shift; for p in "$@"; do if command -v "$p" >/dev/null 2>&1; then '
    'exec "$p" -c "$b" "$0"; fi; done; '
    'echo "no python interpreter found (tried: $*)" >&2; exit 127'
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


def stdin_payload(text: str) -> bytes:
    """What goes first on the helper's stdin: the length line, then the program."""
    data = text.encode("utf-8")
    return f"{len(data)}\n".encode() + data


def candidates(python: str | None) -> list[str]:
    """Interpreters to try on a host, in order: ``--python``, else the
    coordinator's own interpreter path, else ``python3``."""
    if python:
        return [python]
    return [sys.executable, "python3"] if sys.executable else ["python3"]


def agent_argv(python: str | None, warm: str | None = None) -> list[str]:
    """The command that starts a host's node agent (``python -m corral.agent``) with
    the first interpreter found; ``warm``: the launcher module it starts warm
    (:mod:`corral.agent.warm`)."""
    agent = "corral.agent" + (f" --warm {shlex.quote(warm)}" if warm else "")
    shell = (
        f'for p in "$@"; do if command -v "$p" >/dev/null 2>&1; then exec "$p" -m {agent}; fi; '
        'done; echo "no python interpreter found (tried: $*)" >&2; exit 127'
    )
    return ["sh", "-c", shell, "sh", *candidates(python)]


def bootstrap_argv(python: str | None, label: str = "corral") -> list[str]:
    """argv that starts the first interpreter found on the host with the fixed
    bootstrap, which then reads the program (:func:`stdin_payload`) from stdin.
    ``label`` (e.g. the call) is the interpreter's ``sys.argv[1]``, visible in ``ps``."""
    return ["sh", "-c", _SHELL, label, _BOOTSTRAP, *candidates(python)]


def shell_command(python: str | None, label: str = "corral") -> str:
    """:func:`bootstrap_argv` as one shell command line (for an ``ssh`` command)."""
    return "exec " + shlex.join(bootstrap_argv(python, label))


async def start_program(
    transport: Transport,
    host: Host,
    python: str | None,
    modules: Sequence[str],
    call: str,
    *args: Any,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> NodeProcess:
    """Start ``call`` (``module:function``, with ``args``) on ``host`` with ``modules``
    shipped, and write the program to its stdin; the process's stdin stays open for
    the caller. The interpreter is ``host.python``, else ``python`` (see
    :func:`candidates`); the host's own env (hostfile/YAML) is applied, then ``env``.
    Transport errors propagate (:class:`~corral.errors.TransportError`)."""
    text = program(modules, call, *args)
    argv = bootstrap_argv(host.python or python, call)
    proc = await transport.start(host, argv, env={**host.env, **(env or {})}, cwd=cwd)
    proc.write(stdin_payload(text))
    return proc
