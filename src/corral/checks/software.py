"""Check 3, software: python, torch, CUDA, NCCL (and mlx for the mlx launcher)
and every installed package agree across hosts; what the launcher needs is there.

What each launcher needs on every host (a host without it fails, with the
``pip install`` that fixes it): corral always; torch for ``torchrun`` and
``accelerate``; Accelerate (importable by the job's interpreter) for
``accelerate`` and for ``--harness`` under any launcher; MLX (``mlx.core``) for
``mlx``, which needs no torch; the ``madengine`` executable for ``madengine``;
torchft for ``--recovery in-place`` (named with its install command).
A missing ``torchrun`` executable, or the first word of a ``command`` template
when it is a plain command name, is a warning (the template may set up its PATH).
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from corral.checks.context import CheckContext, ChecklistOptions
from corral.checks.result import CheckResult, HostCheck, Status
from corral.recovery.inplace import TORCHFT_INSTALL

NAME = "software"
CORE = ("python", "torch", "cuda", "nccl", "corral")
IGNORED_PACKAGES = frozenset({"pip", "setuptools", "wheel", "distribute"})
MISSING = "-"


REQUIRED_BINARIES = {"madengine": "git+https://github.com/ROCm/madengine.git"}
"""Executables without which the launcher cannot run at all (a failure, not a
warning), with what ``pip install`` installs them from."""
_PLAIN_COMMAND = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*\Z")
# bash's keywords and builtins: a template starting with one runs no executable of that name
# fmt: off
_SHELL_WORDS = frozenset((
    "alias", "bg", "bind", "break", "builtin", "caller", "case", "cd", "command", "compgen",
    "complete", "compopt", "continue", "coproc", "declare", "dirs", "disown", "do", "done",
    "echo", "elif", "else", "enable", "esac", "eval", "exec", "exit", "export", "false", "fc",
    "fg", "fi", "for", "function", "getopts", "hash", "help", "history", "if", "in", "jobs",
    "kill", "let", "local", "logout", "mapfile", "popd", "printf", "pushd", "pwd", "read",
    "readarray", "readonly", "return", "select", "set", "shift", "shopt", "source", "suspend",
    "test", "then", "time", "times", "trap", "true", "type", "typeset", "ulimit", "umask",
    "unalias", "unset", "until", "wait", "while",
))
# fmt: on


def template_command(template: str | None) -> str | None:
    """The executable a command template starts with, when its first word is a plain
    command name (``deepspeed``, ``torchrun``): not a path, a placeholder, an
    assignment, a shell keyword or builtin. None otherwise."""
    if not template:
        return None
    try:
        words = shlex.split(template)
    except ValueError:
        return None
    first = words[0] if words else ""
    if not _PLAIN_COMMAND.match(first) or first in _SHELL_WORDS:
        return None
    return first


def extra_binaries(options: ChecklistOptions) -> tuple[str, ...]:
    """Executables to look for on the hosts beyond the launcher's own (the host side
    knows those): a ``command`` template's first word (:func:`template_command`)."""
    if options.launcher != "command":
        return ()
    first = template_command(options.command_template)
    return (first,) if first else ()


@dataclass(frozen=True)
class Needs:
    """What the launch needs on every host besides corral."""

    torch: str | None = None  # why torch is needed (None: it is not)
    accelerate: str | None = None
    mlx: str | None = None
    torchft: str | None = None


def needs(options: ChecklistOptions) -> Needs:
    """What ``options``' launcher (and ``--harness``) needs on every host."""
    launcher = options.launcher
    accelerate = (
        "--harness sets up Accelerate"
        if options.harness
        else "--launcher accelerate"
        if launcher == "accelerate"
        else None
    )
    torch = "torchrun" if launcher == "torchrun" else ("Accelerate" if accelerate else None)
    return Needs(
        torch=torch,
        accelerate=accelerate,
        mlx="--launcher mlx" if launcher == "mlx" else None,
        torchft="--recovery in-place" if options.torchft else None,
    )


def _missing(
    sw: Mapping[str, Any], packages: Mapping[str, str], need: Needs, versions: Mapping[str, str]
) -> list[tuple[str, str, str]]:
    """``(package, problem, fix)`` for each thing ``need`` asks for that the host
    lacks; the fix installs the version the other hosts have (``versions``) if any."""
    exe = str(sw.get("python_executable", "python"))
    modules = sw.get("modules") or {}

    def install(name: str, extra: str = "") -> str:
        version = versions.get(name, MISSING)
        spec = name + extra + (f"=={version}" if version != MISSING else "")
        return f"{exe} -m pip install {shlex.quote(spec)}"

    found: list[tuple[str, str, str]] = []
    if need.torch and not sw.get("torch"):
        found.append(
            ("torch", f"torch is not installed for {exe} ({need.torch} needs it)", install("torch"))
        )
    if need.accelerate and not modules.get("accelerate", "accelerate" in packages):
        found.append(
            (
                "accelerate",
                f"accelerate cannot be imported by {exe} ({need.accelerate})",
                install("accelerate"),
            )
        )
    if need.mlx and not modules.get("mlx.core", "mlx" in packages):
        found.append(
            (
                "mlx",
                f"MLX is not installed for {exe} ({need.mlx} needs it; torch is not needed)",
                install("mlx", "" if sw.get("platform") == "darwin" else "[cpu]"),
            )
        )
    has_torchft = any(p in packages for p in ("torchft", "torchft-nightly"))
    if need.torchft and not modules.get("torchft", has_torchft):
        # the nightly build installs beside current torch (TORCHFT_INSTALL), for this python
        found.append(
            (
                "torchft-nightly",
                f"torchft cannot be imported by {exe} ({need.torchft} needs it)",
                f"{exe} -m {TORCHFT_INSTALL.split(' -m ', 1)[1]}",
            )
        )
    return found


def _binaries(sw: Mapping[str, Any], exe: str, template_word: str | None) -> list[tuple[str, str]]:
    """``(problem, fix)`` of each launcher executable not found (fix empty: a warning)."""
    problems = []
    for name, path in (sw.get("binaries") or {}).items():
        if path:
            continue
        where = f"{name} not found next to {exe} or on PATH"
        if name in REQUIRED_BINARIES:
            problems.append(
                (
                    f"{where} (--launcher {name} runs it on every node)",
                    f"{exe} -m pip install {REQUIRED_BINARIES[name]}",
                )
            )
        elif name == template_word:
            problems.append((f"{where} (the --command-template's first word)", ""))
        else:
            problems.append((where, ""))
    return problems


def _majority(values: list[str]) -> str:
    """The most common value; ties go to the first host's (the master's side)."""
    counts = Counter(values)
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)


def _versions(row: Mapping[str, str], launcher: str) -> str:
    """A passing host's detail: python and the framework the launcher uses."""
    if launcher == "mlx":
        return f"python {row['python']}, mlx {row['mlx']}"
    torch = row["torch"] if row["torch"] != MISSING else "no torch"
    return f"python {row['python']}, torch {torch}"


def check(ctx: CheckContext) -> CheckResult:
    """Fail when a version differs on some hosts (those are named, with the table of
    versions), when corral or what the launcher needs (see the module doc) is
    missing; warn when a launcher executable that is not required is missing."""
    answered = ctx.answered()
    launcher = ctx.options.launcher
    need = needs(ctx.options)
    template_word = template_command(ctx.options.command_template)
    keys = list(CORE) + (["mlx"] if launcher == "mlx" else [])
    table: dict[str, dict[str, str]] = {}
    for f in answered:
        sw = f.facts.get("software", {})
        row = {k: str(sw.get(k) or MISSING) for k in keys}
        row["python"] = str(sw.get("python") or MISSING)
        table[f.host.name] = row
    packages: dict[str, dict[str, str]] = {
        f.host.name: {
            k: v for k, v in f.facts.get("packages", {}).items() if k not in IGNORED_PACKAGES
        }
        for f in answered
    }
    names = sorted({p for pk in packages.values() for p in pk} - set(keys))
    mismatched: dict[str, dict[str, str]] = {}  # key -> host -> value (differing keys only)
    expected: dict[str, str] = {}
    for key in keys:
        values = [table[h][key] for h in table]
        if len(set(values)) > 1:
            mismatched[key] = {h: table[h][key] for h in table}
            expected[key] = _majority(values)
    for name in names:
        per_host = {h: packages[h].get(name, MISSING) for h in packages}
        if len(set(per_host.values())) > 1:
            mismatched[name] = per_host
            expected[name] = _majority(list(per_host.values()))

    hosts: dict[str, HostCheck] = {}
    fixes: list[str] = []
    for host in ctx.cluster.hosts:
        f = ctx.facts[host.name]
        if not f.ok:
            hosts[host.name] = HostCheck(Status.SKIP, "host did not answer")
            continue
        sw = f.facts.get("software", {})
        problems: list[str] = []
        status = Status.PASS
        exe = sw.get("python_executable", "python")
        if not sw.get("corral_importable"):
            status = Status.FAIL
            problems.append(f"corral is not installed for {exe}")
            fixes.append(f"{exe} -m pip install corral  (on {host.name})")
        lacking = _missing(sw, packages[host.name], need, expected)
        for _, problem, fix in lacking:
            status = Status.FAIL
            problems.append(problem)
            fixes.append(f"{fix}  (on {host.name})")
        differing = [
            f"{k} {v[host.name]} (others {expected[k]})"
            for k, v in mismatched.items()
            if v.get(host.name) != expected[k]
        ]
        if differing:
            status = Status.FAIL
            problems.append("differs: " + ", ".join(differing[:6]))
            if len(differing) > 6:
                problems[-1] += f" and {len(differing) - 6} more"
            pins = [
                f"{k}=={expected[k]}"
                for k in mismatched
                if k not in ("python", "cuda", "nccl", *(name for name, _, _ in lacking))
                and mismatched[k].get(host.name) != expected[k]
                and expected[k] != MISSING
            ]
            if pins:
                fixes.append(f"{exe} -m pip install {' '.join(pins)}  (on {host.name})")
        for problem, fix in _binaries(sw, exe, template_word):
            if fix:
                status = Status.FAIL
                fixes.append(f"{fix}  (on {host.name})")
            elif status is Status.PASS:
                status = Status.WARN
            problems.append(problem)
        if problems:
            hosts[host.name] = HostCheck(status, "; ".join(problems))
        else:
            hosts[host.name] = HostCheck(Status.PASS, _versions(table[host.name], launcher))
    data: dict[str, Any] = {"versions": table, "mismatched": mismatched}
    same = (
        ", ".join(f"{k} {table[next(iter(table))][k]}" for k in keys if k not in mismatched)
        if table
        else ""
    )
    summary = f"{len(mismatched)} version(s) differ" if mismatched else f"same everywhere: {same}"
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary=summary,
        fix_command="; ".join(fixes) or None,
        data=data,
    )
