"""A plan as the user reads it: per node, its env and one copy-pasteable shell line
per command (``corral plan`` prints these; the API's execution plan returns them).

A line does what the node agent does before it starts the command: a ``~`` in
the working directory or in ``CORRAL_NODE_DIR`` (an SSH node's dir is
``~/.corral/runs/...``) is the home directory, written ``"$HOME"/...`` so the
shell expands it inside a quoted word; a working directory under the node's own
dir (``local:N`` nodes run in ``runs/<job>/nodes/<host>/work``) is created first
(``mkdir -p``), as the agent creates it."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from corral.contract import NODE_DIR_ENV
from corral.plan.spec import NodeCommand
from corral.redact import redact_env

_DOUBLE_QUOTE_SPECIAL = frozenset('"$`\\!')
#: The env value the node agent expands ``~`` in (as it does in the working directory).
#: The interpreter a plan names on an SSH host when none is known yet (the agents'
#: probe resolves it at launch).
PLACEHOLDER_PYTHON = "python3"


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


def home_path(path: str) -> str:
    """``path`` as one shell word with a leading ``~`` or ``~/`` as ``"$HOME"``
    (quoted, ``~`` would stay a literal directory named ``~``)."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        rest = path[2:]
        return '"$HOME"/' + (shlex.quote(rest) if rest else "")
    return shlex.quote(path)


def _assign(key: str, value: str) -> str:
    if key == NODE_DIR_ENV and (value == "~" or value.startswith("~/")):
        return shlex.quote(f"{key}=") + home_path(value)
    return quote(f"{key}={value}")


def shell_line(
    cwd: str, env: Mapping[str, str], argv: Sequence[str], *, make_cwd: bool = False
) -> str:
    """``cd CWD && env K=V ... ARGV`` as one shell-quoted line (``mkdir -p CWD && ``
    first with ``make_cwd``); ``~`` in CWD and ``CORRAL_NODE_DIR`` is the home dir."""
    where = home_path(cwd)
    words = [_assign(k, v) for k, v in env.items()] + [quote(w) for w in argv]
    prefix = f"mkdir -p {where} && " if make_cwd else ""
    return f"{prefix}cd {where} && env " + " ".join(words)


def makes_cwd(cmd: NodeCommand) -> bool:
    """Whether the node agent creates the node's working directory (one under the
    node's own dir, as on ``local:N``); any other must exist already."""
    node_dir = cmd.env.get(NODE_DIR_ENV, "").rstrip("/")
    return bool(node_dir) and cmd.cwd.startswith(node_dir + "/")


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
        CommandLine(
            cmd.node_rank,
            cmd.host.name,
            label,
            shell_line(cmd.cwd, run_env, cmd.argv, make_cwd=makes_cwd(cmd)),
        )
        for label, run_env in runs
    ]


def python_note(commands: Sequence[NodeCommand], tried: Sequence[str]) -> str | None:
    """The footer saying how the placeholder ``python3`` of SSH nodes' commands is
    resolved at launch (``tried``: the interpreters tried, in order); None when no
    printed command starts with it (``--python`` given, the command or madengine
    launcher, a per-host ``python``, local nodes)."""
    if not any(not c.host.local and c.argv[:1] == (PLACEHOLDER_PYTHON,) for c in commands):
        return None
    order = " if it exists there, else ".join(tried)
    return f"{PLACEHOLDER_PYTHON} above is resolved per host at launch: {order} (or pass --python)"


def reference_line(cmd: NodeCommand) -> str | None:
    """The launcher's own command the node's processes stand for (``accelerate
    launch ...``), shown for reference: corral starts the ranks itself."""
    return join(cmd.reference_argv) if cmd.reference_argv else None


def weights_line(weights: Iterable[tuple[str, int, float]]) -> str:
    """Workload weights as ``corral run`` and ``corral job submit`` print them, from
    (host, local rank, weight) in plan order."""
    shown = ", ".join(f"{host}:{local} {weight:.3f}" for host, local, weight in weights)
    return f"workload weights (host:local rank): {shown}"


def overheads_line(ranks: Iterable[tuple[str, int, float]]) -> str | None:
    """Each rank's fixed per-step cost in examples, from (host, local rank, examples)
    in plan order; None when no rank has one (the split is proportional)."""
    listed = list(ranks)
    if not any(k for _, _, k in listed):
        return None
    shown = ", ".join(f"{host}:{local} {k:.4g}" for host, local, k in listed)
    return (
        f"fixed step cost in examples (host:local rank): {shown}; the split makes the "
        "step times equal (sdk.batch_sizes)"
    )


def fits_line(ranks: Iterable[tuple[str, int, int | None]]) -> str | None:
    """The largest micro-batch of the ranks that have one, from (host, local rank,
    fit) in plan order; None when none has a limit."""
    shown = ", ".join(f"{host}:{local} {fit}" for host, local, fit in ranks if fit is not None)
    if not shown:
        return None
    return (
        f"micro-batch fits (host:local rank): {shown}; a larger share runs as gradient "
        "accumulation (sdk.WeightedDistributedSampler)"
    )
