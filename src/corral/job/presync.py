"""``corral run --sync`` / ``--sync-script``: bring the hosts' code in line before
the pre-flight checklist looks at it.

The sync script follows the seed's semantics: a missing script is a warning
and the launch goes on; a non-zero exit blocks the launch (through the
pre-flight's ``sync`` check, or directly with ``--no-preflight``). ``--sync``
pushes the code tree (``corral sync``) to the hosts' working directory; a host
that cannot be synced blocks the launch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from corral.cluster.model import Cluster
from corral.errors import LaunchError
from corral.job.events import Level
from corral.job.options import SyncPolicy
from corral.plan.spec import JobSpec
from corral.transport.options import SshOptions


async def sync_before_launch(
    policy: SyncPolicy,
    spec: JobSpec,
    cluster: Cluster,
    ssh: SshOptions,
    python: str | None,
    *,
    checked: bool,
    say: Callable[[str, Level], None],
) -> dict[str, Any]:
    """Run the sync script and/or push the tree; returns what the ``sync`` check reports.
    ``checked``: the pre-flight checklist follows (it reports a failed script)."""
    from corral.sync.push import summary_line, sync_tree
    from corral.sync.script import run_sync_script

    src = os.path.abspath(policy.source or os.getcwd())
    dest = spec.workdir or src
    done: dict[str, Any] = {"pushed": False}
    if policy.script:
        names = [h.name for h in cluster.hosts]
        result = await run_sync_script(
            policy.script,
            hosts_spec=cluster.source or ",".join(names),
            host_names=names,
            src=src,
            dest=dest,
            on_line=lambda line: say(line, "output"),
        )
        done["script"] = {
            "path": result.path,
            "status": result.status,
            "detail": result.message or f"exit code {result.exit_code}",
        }
        if result.status == "missing":
            say(f"warning: {result.message}", "warning")
        if result.blocks and not checked:
            raise LaunchError(result.message)
    if policy.push:
        report = await sync_tree(cluster, src, dest, ssh, python=python)
        failed = [h for h in report.hosts if not h.ok]
        if failed:
            raise LaunchError(
                "--sync failed: "
                + "; ".join(f"{h.host}: {h.error or h.cause or h.status}" for h in failed)
            )
        say(summary_line(report), "detail")
        for warning in report.warnings:
            say(f"warning: {warning}", "warning")
        done["pushed"] = True
    return done
