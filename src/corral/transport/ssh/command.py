"""The remote command lines of the SSH transport (pure: quoting only, no I/O).

Each ``start`` runs one shell-quoted command line on the host::

    printf '__corral_pid__=%d\\n' "$$" >&2; cd '<cwd>' && exec env 'K=V' ... '<argv0>' ...

Every argument goes through :func:`shlex.quote`; variables are set with
``env`` on the command line (no ``SendEnv``/``AcceptEnv`` needed) and only the
ones the caller gives. The first stderr line reports the remote PID (= the
session and process group sshd created for the channel). This needs a
POSIX-style login shell on the host (bash, zsh, dash, ksh).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from corral.contract import is_env_name
from corral.errors import ConfigError

__all__ = ["PID_PREAMBLE", "build_command", "build_shell_command"]

PID_PREAMBLE = "printf '__corral_pid__=%d\\n' \"$$\" >&2"


def _check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    checked = dict(env or {})
    for name in checked:
        if not is_env_name(name):
            raise ConfigError(
                f"invalid environment variable name {name!r}: expected letters, digits and _"
            )
    return checked


def _quote_dir(path: str) -> str:
    return shlex.quote("./" + path if path.startswith("-") else path)


def build_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    report_pid: bool = True,
) -> str:
    """The remote command line that runs ``argv`` verbatim in ``cwd`` with ``env`` added.

    >>> build_command(["echo", "a b"], env={"X": "1"}, cwd="/tmp", report_pid=False)
    "cd /tmp && exec env X=1 echo 'a b'"
    """
    if not argv:
        raise ValueError("empty argv: nothing to run")
    variables = _check_env(env)
    words = ["exec"]
    if variables:
        words.append("env")
        words.extend(shlex.quote(f"{k}={v}") for k, v in variables.items())
    words.extend(shlex.quote(arg) for arg in argv)
    body = " ".join(words)
    if cwd:
        body = f"cd {_quote_dir(cwd)} && {body}"
    return f"{PID_PREAMBLE}; {body}" if report_pid else body


def build_shell_command(
    command: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    report_pid: bool = True,
) -> str:
    """A command line for the host's login shell, run as written (``$VARS`` expand remotely).

    Variables are exported and ``cwd`` entered first; ``command`` is the last line.
    """
    variables = _check_env(env)
    lines = [PID_PREAMBLE] if report_pid else []
    if variables:
        lines.append("export " + " ".join(shlex.quote(f"{k}={v}") for k, v in variables.items()))
    if cwd:
        lines.append(f"cd {_quote_dir(cwd)} || exit 1")
    lines.append(command)
    return "\n".join(lines)
