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
from typing import TYPE_CHECKING, Any

from rich.console import Console

from corral.errors import LaunchError

if TYPE_CHECKING:
    from corral.job.engine import LaunchOptions
    from corral.plan.spec import JobSpec


async def sync_before_launch(
    opts: LaunchOptions, spec: JobSpec, console: Console
) -> dict[str, Any]:
    """Run the sync script and/or push the tree; returns what the ``sync`` check reports."""
    from corral.sync.push import summary_line, sync_tree
    from corral.sync.script import run_sync_script

    src = os.path.abspath(opts.code_dir or os.getcwd())
    dest = spec.workdir or src
    done: dict[str, Any] = {"pushed": False}
    if opts.sync_script:
        names = [h.name for h in opts.cluster.hosts]
        result = await run_sync_script(
            opts.sync_script,
            hosts_spec=opts.cluster.source or ",".join(names),
            host_names=names,
            src=src,
            dest=dest,
            on_line=lambda line: console.print(line, markup=False, highlight=False),
        )
        done["script"] = {
            "path": result.path,
            "status": result.status,
            "detail": result.message or f"exit code {result.exit_code}",
        }
        if result.status == "missing":
            console.print(f"warning: {result.message}", style="yellow")
        if result.blocks and not opts.preflight:
            raise LaunchError(result.message)
    if opts.sync:
        report = await sync_tree(opts.cluster, src, dest, opts.ssh, python=opts.python)
        failed = [h for h in report.hosts if not h.ok]
        if failed:
            raise LaunchError(
                "--sync failed: "
                + "; ".join(f"{h.host}: {h.error or h.cause or h.status}" for h in failed)
            )
        console.print(summary_line(report), style="dim")
        for warning in report.warnings:
            console.print(f"warning: {warning}", style="yellow")
        done["pushed"] = True
    return done
