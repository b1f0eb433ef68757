"""A plan as the user reads it: per node, its env and one copy-pasteable shell line
per command (``corral plan`` prints these; the API's execution plan returns them)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from corral.plan.spec import NodeCommand
from corral.redact import redact_env

_DOUBLE_QUOTE_SPECIAL = frozenset('"$`\\!')


def quote(word: str) -> str:
    """``word`` as one shell word: :func:`shlex.quote`, except that a word holding
    single quotes (and nothing double quotes would expand) is double-quoted, so a
    Python literal such as madengine's context reads as the user would type it."""
    quoted = shlex.quote(word)
    if quoted == word or "'" not in word or _DOUBLE_QUOTE_SPECIAL & set(word):
        return quoted
    return f'"{word}"'


def join(argv: Sequence[str]) -> str:
    """``argv`` as one shell line (see :func:`quote`)."""
    return " ".join(quote(w) for w in argv)


def shell_line(cwd: str, env: Mapping[str, str], argv: Sequence[str]) -> str:
    """``cd CWD && env K=V ... ARGV`` as one shell-quoted line."""
    assigns = [f"{k}={v}" for k, v in env.items()]
    return f"cd {shlex.quote(cwd)} && " + join(["env", *assigns, *argv])


@dataclass(frozen=True)
class CommandLine:
    """One command of a node: ``label`` is ``command`` (one per node, e.g. torchrun)
    or ``rank N`` (the python launcher starts one per rank)."""

    node_rank: int
    host: str
    label: str
    line: str


def node_env(cmd: NodeCommand) -> dict[str, str]:
    """The node's environment, secret values redacted."""
    return redact_env(cmd.env, cmd.secret_env)


def command_lines(cmd: NodeCommand) -> list[CommandLine]:
    """The node's commands as shell lines (secret values redacted)."""
    env = node_env(cmd)
    runs = [
        (f"rank {r.rank}", {**env, **redact_env(r.env, cmd.secret_env)}) for r in cmd.ranks
    ] or [("command", env)]
    return [
        CommandLine(cmd.node_rank, cmd.host.name, label, shell_line(cmd.cwd, run_env, cmd.argv))
        for label, run_env in runs
    ]


def reference_line(cmd: NodeCommand) -> str | None:
    """The launcher's own command the node's processes stand for (``accelerate
    launch ...``), shown for reference: corral starts the ranks itself."""
    return join(cmd.reference_argv) if cmd.reference_argv else None


def weights_line(weights: Iterable[tuple[str, int, float]]) -> str:
    """Workload weights as ``corral run`` and ``corral job submit`` print them, from
    (host, local rank, weight) in plan order."""
    shown = ", ".join(f"{host}:{local} {weight:.3f}" for host, local, weight in weights)
    return f"workload weights (host:local rank): {shown}"
