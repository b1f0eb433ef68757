"""What a job writes down: ``plan.json``, ``job.json`` and ``result.json`` under
``<run_dir>/<job-id>/`` (private to the user), secret values redacted.

``corral logs`` finds a job's hosts again from ``job.json``; the server reads
``result.json`` (:func:`result_json`) for a supervisor process that ended.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from typing import Any

from corral.contract import NODE_DIR_ENV
from corral.job.resolve import Prepared
from corral.job.result import JobResult
from corral.plan.launchers.command import template_of
from corral.plan.spec import NODE_LAUNCHERS, JobSpec
from corral.private import write_private
from corral.redact import REDACTED, is_secret
from corral.transport.options import SshOptions

__all__ = ["job_command", "job_json", "plan_json", "redact_words", "result_json", "write_json"]

# NAME=value, the value up to the end of its shell word (quoted parts included)
_ASSIGNMENT = re.compile(
    r"""(?<![\w.])([A-Za-z_][A-Za-z0-9_]*)=((?:"[^"]*"|'[^']*'|[^\s;&|<>()"'`])+)"""
)
_MIN_SECRET = 4  # shorter secret env values are not searched for in command words


def redact_words(words: Sequence[str], spec: JobSpec) -> list[str]:
    """``words`` as recorded: the value of every ``NAME=value`` whose name is a secret
    (see :mod:`corral.redact`) and every secret ``--env`` value replaced by
    :data:`~corral.redact.REDACTED`."""
    values = [
        v for k, v in spec.env.items() if len(v) >= _MIN_SECRET and is_secret(k, spec.secret_env, v)
    ]

    def assignment(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        if is_secret(name, spec.secret_env, value.strip("'\"")):
            return f"{name}={REDACTED}"
        return match.group(0)

    out = []
    for word in words:
        for value in values:
            word = word.replace(value, REDACTED)
        out.append(_ASSIGNMENT.sub(assignment, word))
    return out


def job_command(prepared: Prepared) -> list[str]:
    """The job's command as ``job.json`` records it: SCRIPT ARGS, or for a launcher
    that runs its own command per node (``command``, ``madengine``) node 0's
    rendered command; redacted (:func:`redact_words`)."""
    spec = prepared.spec
    if spec.launcher in NODE_LAUNCHERS and prepared.commands:
        return redact_words(prepared.commands[0].argv, spec)
    return redact_words([spec.script, *spec.args], spec)


def job_json(prepared: Prepared, ssh: SshOptions) -> dict[str, Any]:
    """What ``corral logs`` needs later to find the job's hosts again (no secrets:
    the SSH password is never known here, only the name of its variable), and the
    command (per host too for ``command``/``madengine``: each node's differs)."""
    spec = prepared.spec
    per_node = spec.launcher in NODE_LAUNCHERS
    doc: dict[str, Any] = {
        "job_id": prepared.spec.job_id,
        "hosts": [
            {
                "name": c.host.name,
                "address": c.host.address,
                "port": c.host.port,
                "user": c.host.user,
                "local": c.host.local,
                "python": c.host.python,
                "node_dir": c.env.get(NODE_DIR_ENV),
                **({"argv": redact_words(c.argv, spec)} if per_node else {}),
            }
            for c in prepared.commands
        ],
        "ssh": {
            "user": ssh.user,
            "key": ssh.key,
            "port": ssh.port,
            "config": ssh.config,
            "password_env": ssh.password_env,
            # what the user accepted for this job's hosts; `corral logs` connects the same way
            "accept_new_host_keys": ssh.accept_new_host_keys,
            "insecure_no_host_key_check": ssh.insecure_no_host_key_check,
        },
        "launcher": prepared.spec.launcher,
        "command": job_command(prepared),
    }
    if (template := template_of(spec)) is not None:
        doc["command_template"] = redact_words([template], spec)[0]
    return doc


def plan_json(prepared: Prepared) -> dict[str, Any]:
    """``plan.json``: every node's command, secret env values redacted."""
    return {
        "job_id": prepared.spec.job_id,
        "launcher": prepared.spec.launcher,
        "nodes": [c.to_json(redact=True) for c in prepared.commands],
    }


def result_json(result: JobResult) -> dict[str, Any]:
    """A JSON-able record of a finished job (``result.json``)."""
    return {
        "job_id": result.job_id,
        "state": result.state.value,
        "exit_code": result.exit_code,
        "started": result.started,
        "ended": result.ended,
        "reason": result.reason,
        "nodes": [
            {
                "host": n.host.name,
                "state": n.state.value,
                "detail": n.detail,
                "ranks": {str(r.rank): {"code": r.code, "pid": r.pid} for r in n.ranks.values()},
            }
            for n in result.nodes
        ],
        "failures": [
            {
                "host": f.host,
                "rank": f.rank,
                "code": f.code,
                "signal": f.signal,
                "exit_code": f.exit_code,
                "message": f.message,
                "time": f.time,
                "stderr_tail": f.stderr_tail,
                "traceback": f.traceback,
            }
            for f in result.failures
        ],
        "attempts": result.attempts,
        "groups": result.groups,  # --recovery in-place: each group's loss and rejoin
    }


def write_json(path: Any, data: Any) -> None:
    """``data`` as private JSON at ``path`` (an unwritable run dir is not the job's end)."""
    with contextlib.suppress(OSError):
        write_private(path, json.dumps(data, indent=2, default=str))
