"""How ``corral job`` shows a job of ``corral serve``: status, plan, listing, and the
live output of a followed job (the events rendered as ``corral run`` renders them)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.client import jobs as api
from corral.client.events import LaunchFailed, Lost
from corral.client.http import Client
from corral.console import make_console
from corral.errors import ServerUnreachable
from corral.job.events import Checked, Finished, JobEvent, LogLines
from corral.job.output import TerminalOutput, format_progress, say
from corral.job.result import Failure
from corral.job.summary import finding_line, preflight_findings, root_cause_text
from corral.outcomes import EXIT_INTERRUPTED
from corral.plan.display import fits_line, weights_line
from corral.states import TERMINAL_STATES, JobState, NodeState
from corral.words import plural

STATE_STYLE: dict[str, str] = {
    JobState.SUCCEEDED: "green",
    NodeState.EXITED: "green",
    JobState.FAILED: "bold red",
    JobState.LOST: "bold red",
    JobState.TIMED_OUT: "red",
    JobState.CANCELLED: "yellow",
    JobState.RUNNING: "cyan",
    JobState.QUEUED: "yellow",
}


def state_text(state: str) -> Text:
    """A state, colored."""
    return Text(state, style=STATE_STYLE.get(state, ""))


def duration_text(seconds: float | None) -> str:
    """``4.2s``, ``3m07s``, ``2h05m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _when(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def ranks_text(ranks: list[int]) -> str:
    """``0-3`` for a range, else ``0,2``; ``-`` for none."""
    if not ranks:
        return "-"
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def node_progress(progress: dict[str, Any], *, running: bool) -> str:
    """A node's last progress; its percentage and ETA only while the job runs."""
    if progress.get("step") is None:
        return ""
    text = format_progress(progress)
    if running and progress.get("percent") is not None:
        text += f" ({progress['percent']:g}%"
        if progress.get("eta_s") is not None:
            text += f", eta {duration_text(progress['eta_s'])}"
        text += ")"
    return text


def weights_text(plan: dict[str, Any]) -> str:
    """The workload weights of a plan or a job status, as ``corral run --calibration``
    prints them (and the micro-batch fits, where the calibration found some)."""
    rows = plan["workload_weights"]
    text = weights_line((w["host"], int(w["local_rank"]), float(w["weight"])) for w in rows)
    fits = fits_line((w["host"], int(w["local_rank"]), w.get("fits")) for w in rows)
    return text if fits is None else f"{text}\n{fits}"


def root_cause_block(cause: dict[str, Any]) -> Text:
    """The root-cause block of a job's status (as ``corral run`` prints it), with the
    failed rank's log tail when its stderr tail is empty."""
    if cause.get("host") is None:
        text = Text("root cause: ", style="bold red")
        text.append(str(cause.get("message") or "unknown"))
        for line in cause.get("details") or []:
            text.append(f"\n  {line}")
        return text
    failure = Failure(
        host=str(cause["host"]),
        rank=cause.get("rank"),
        code=cause.get("code"),
        time=float(cause.get("time") or 0),
        message=str(cause.get("message") or ""),
        stderr_tail=list(cause.get("stderr_tail") or []),
        traceback=cause.get("traceback"),
        exit_code=int(cause.get("exit_code") or 1),
        tail=str(cause.get("tail") or ""),
    )
    text = root_cause_text(failure, [])
    tail = cause.get("log_tail") or []
    if tail and not failure.stderr_tail and not failure.traceback:
        text.append(f"  last {plural(len(tail), 'line')} of its log:\n", style="bold")
        for line in tail:
            text.append(f"    {line}\n")
    text.rstrip()
    return text


def print_status(status: dict[str, Any], console: Console) -> None:
    """A job's status: state and reason, master, nodes, attempts, root cause."""
    state = str(status["status"])
    title = Text(f"job {status['job_id']}")
    if status.get("name"):
        title.append(f" ({status['name']})")
    title.append(": ")
    title.append_text(state_text(state))
    if status.get("reason"):
        title.append(f": {status['reason']}")
    console.print(title, soft_wrap=True)
    ran = None
    if status.get("started"):
        ran = (status.get("ended") or time.time()) - status["started"]
    facts = [
        f"owner {status.get('owner') or '-'}, priority {status.get('priority', 0)}"
        + (f", after {', '.join(status['after'])} succeed" if status.get("after") else ""),
        f"master {status.get('master') or '-'}, world size {status.get('world_size')}, "
        f"machines {', '.join(status.get('machines') or []) or '-'}",
        f"attempt {status.get('attempt', 0)} ({plural(status.get('restarts', 0), 'restart')}), "
        f"started {_when(status.get('started'))}, ran {duration_text(ran)}",
    ]
    if status.get("workload_weights"):  # the current attempt's (--rebalance changes them)
        facts.append(weights_text(status))
    for fact in facts:
        console.print(f"  {fact}", markup=False, soft_wrap=True)
    for finding in status.get("preflight") or []:
        style = "bold red" if finding.get("status") == "fail" else "yellow"
        console.print(f"  {finding_line(finding)}", style=style, markup=False, soft_wrap=True)
    if status.get("nodes"):
        table = Table(title="nodes", title_justify="left")
        for column in ("node", "host", "ranks", "state", "progress", "detail"):
            table.add_column(column, overflow="fold")
        for node in status["nodes"]:
            table.add_row(
                str(node["node_rank"]),
                node["host"],
                ranks_text(node.get("ranks") or []),
                state_text(str(node["status"])),
                node_progress(node.get("progress") or {}, running=state == JobState.RUNNING),
                node.get("detail") or "",
            )
        console.print(table)
    if status.get("attempts"):
        console.print(_attempts_table(status["attempts"]))
    if status.get("groups"):
        console.print(_groups_table(status["groups"]))
    for line, style in diagnosis_lines(status):
        console.print(line, style=style, markup=False, soft_wrap=True)
    cause = status.get("root_cause")
    if cause and state != JobState.SUCCEEDED:
        console.print(root_cause_block(cause), soft_wrap=True)
    if state in TERMINAL_STATES:
        console.print(f"exit code {api.exit_code_of(status)}", style="dim", markup=False)


def diagnosis_lines(status: dict[str, Any]) -> list[tuple[str, str]]:
    """(line, style) for the stragglers named (``corral run``'s live lines) and the
    last hang report of a job's status: its summary, the odd ones out, the collective
    the flight recorder names, where the report is."""
    lines = [
        (str(s.get("text") or _straggler_text(s)), "yellow") for s in status.get("stragglers") or []
    ]
    hang = status.get("hang")
    if hang:
        lines.append((f"hang report: {hang.get('summary')}", "bold red"))
        for odd in hang.get("odd") or []:
            lines.append(
                (f"  odd one out: rank {odd['rank']} on {odd['host']} at {odd['where']}", "")
            )
        found = hang.get("collective")
        if found:
            who = ", ".join(str(r) for r in found.get("missing_ranks") or [])
            others = "; ".join(
                f"rank {m['rank']} was in {m['collective']} instead"
                for m in found.get("mismatched") or []
            )
            lines.append(
                (
                    f"  collective: {found['collective']} #{found['sequence']} "
                    f"(group {found.get('group')}); "
                    + (others if others and not who else f"never entered by ranks {who or '-'}"),
                    "",
                )
            )
        if hang.get("report"):
            lines.append((f"  report: {hang['report']}", "dim"))
    return lines


def _straggler_text(found: dict[str, Any]) -> str:
    against = "the median" if found.get("basis") == "median" else "its own best"
    return (
        f"straggler: rank {found['rank']} on {found['host']}, {found['section']} "
        f"{float(found['ratio']):.1f}x {against} for {found.get('span')} steps"
    )


def _attempts_table(attempts: list[dict[str, Any]]) -> Table:
    table = Table(title="attempts", title_justify="left")
    for column in ("attempt", "hosts", "ranks", "result", "cause", "duration", "resumed from"):
        table.add_column(column, overflow="fold")
    for attempt in attempts:
        record = attempt.get("record") or {}
        result = str(
            record.get("state") or (JobState.RUNNING.value if attempt.get("ended") is None else "-")
        )
        ran = None
        if attempt.get("started") and attempt.get("ended"):
            ran = attempt["ended"] - attempt["started"]
        table.add_row(
            str(attempt["number"]),
            ",".join(attempt.get("hosts") or []),
            str(attempt.get("world_size") or "-"),
            state_text(result),
            ""
            if result in (JobState.SUCCEEDED, JobState.RUNNING)
            else str(attempt.get("cause") or ""),
            duration_text(ran),
            attempt.get("checkpoint") or "",
        )
    return table


def group_text(change: dict[str, Any]) -> str:
    """One replica-group change (``recovery: in-place``) in words."""
    what = str(change.get("change"))
    text = f"node {change.get('host')} (group {change.get('group')}) {what}"
    if change.get("step") is not None:
        text += f" at step {change['step']}"
    if change.get("healed_from"):
        text += f", healed from {change['healed_from']}"
    text += f"; {plural(int(change.get('participants') or 0), 'group')} training"
    if change.get("detail") and what != "rejoined":
        text += f" ({change['detail']})"
    return text


def _groups_table(changes: list[dict[str, Any]]) -> Table:
    table = Table(title="replica groups (in-place recovery)", title_justify="left")
    for column in ("time", "change"):
        table.add_column(column, overflow="fold")
    for change in changes:
        table.add_row(_when(change.get("time")), group_text(change))
    return table


def jobs_table(page: dict[str, Any]) -> Table:
    """A page of jobs (``corral job list``)."""
    shown = len(page["jobs"])
    table = Table(title=f"{shown} of {plural(page['total'], 'job')}", title_justify="left")
    for column in ("job", "name", "owner", "status", "machines", "ranks", "duration", "exit"):
        table.add_column(column, overflow="fold")
    for job in page["jobs"]:
        code = job.get("exit_code")
        table.add_row(
            job["job_id"],
            job.get("name") or "",
            job.get("owner") or "-",
            state_text(str(job["status"])),
            ",".join(job.get("machines") or []),
            str(job.get("world_size") or "-"),
            duration_text(job.get("duration")),
            "-" if code is None else str(code),
        )
    return table


def queue_table(entries: list[dict[str, Any]]) -> Table:
    """The queue in its order (``corral job queue``)."""
    table = Table(title=f"queue: {plural(len(entries), 'job')}", title_justify="left")
    for column in ("#", "job", "name", "priority", "owner", "machines", "waiting for"):
        table.add_column(column, overflow="fold")
    for entry in entries:
        table.add_row(
            str(entry["position"] + 1),
            entry["job_id"],
            entry.get("name") or "",
            str(entry.get("priority", 0)),
            entry.get("owner") or "-",
            str(entry.get("machines", "")),
            entry.get("reason") or "starts now",
        )
    return table


def print_plan(plan: dict[str, Any], console: Console) -> None:
    """The execution plan as ``corral plan`` prints one: machines and why, then per
    node its env and copy-pasteable command lines (secret values redacted)."""
    table = Table(
        title=f"plan for job {plan['job_id']} ({plan['launcher']}, "
        f"{plural(len(plan['nodes']), 'node')}, {plural(plan['world_size'], 'rank')})",
        title_justify="left",
    )
    for column in ("node", "host", "ranks", "cwd", "why"):
        table.add_column(column, overflow="fold")
    reasons = {m["name"]: m.get("reasons") or [] for m in plan.get("machines", [])}
    for node in plan["nodes"]:
        ranks = node.get("ranks")
        table.add_row(
            str(node["node_rank"]),
            node["host"],
            ranks_text(ranks) if ranks else f"{node['nproc']} (assigned at rendezvous)",
            node["cwd"],
            "; ".join(reasons.get(node["host"], [])),
        )
    console.print(table)
    master = plan.get("master") or {}
    port = master.get("port") or "picked at launch"
    console.print(f"master: {master.get('host')} ({master.get('address')}:{port})", markup=False)
    if plan.get("workload_weights"):
        console.print(weights_text(plan), markup=False)
    for node in plan["nodes"]:
        console.print(
            f"\nnode {node['node_rank']} ({node['host']}) env:", style="bold", markup=False
        )
        for key, value in (node.get("env") or {}).items():
            console.print(f"  {key}={value}", markup=False, soft_wrap=True)
        for run in node.get("commands") or []:
            console.print(f"node {node['node_rank']} {run['label']}:", style="bold", markup=False)
            console.print(run["line"], markup=False, soft_wrap=True)


def describe(plan: dict[str, Any]) -> str:
    """One line for a started job: its machines, ranks, launcher and master."""
    master = plan.get("master") or {}
    names = ", ".join(m["name"] for m in plan.get("machines", []))
    return (
        f"job {plan['job_id']}: {names}; {plural(plan['world_size'], 'rank')}, launcher "
        f"{plan['launcher']}; master {master.get('host')} ({master.get('address')})"
    )


def show_waiting(status: dict[str, Any]) -> None:
    """The line of a queued job: what it waits for."""
    reason = status.get("reason") or "waiting for machines"
    say(make_console(), f"job {status['job_id']} is queued: {reason}", "yellow")


# -- following a job --------------------------------------------------------------------


def show_checked(event: Checked, console: Console) -> None:
    """The pre-flight's problems (every failing and warning check) and its verdict."""
    for finding in preflight_findings(event.report):
        style = "bold red" if finding["status"] == "fail" else "yellow"
        say(console, finding_line(finding), style)
    if event.blocking:
        say(console, "the pre-flight checklist refused the launch", "bold red")


def _wanted(event: JobEvent, host: str | None, rank: int | None) -> bool:
    if not isinstance(event, LogLines):
        return True
    return (host is None or event.host == host) and (rank is None or event.rank == rank)


def line_wanted(line: str, host: str | None, rank: int | None) -> bool:
    """Whether a merged ``[host:rank] text`` line passes the --host / --rank filter."""
    if host is None and rank is None:
        return True
    label, sep, _ = line.partition("] ")
    if not sep or not label.startswith("["):
        return False
    name, colon, number = label[1:].partition(":")
    line_rank = int(number) if colon and number.lstrip("-").isdigit() else -1
    return (host is None or name == host) and (rank is None or line_rank == rank)


def _render(
    events: Iterable[JobEvent], output: TerminalOutput, host: str | None, rank: int | None
) -> int:
    """Show the events of a followed job; its exit code (from its last event)."""
    code = 0
    for event in events:
        if isinstance(event, Checked):
            show_checked(event, output.console)
        elif isinstance(event, (Finished, LaunchFailed, Lost)):
            code = event.exit_code  # the root cause follows, from the job's status
        elif _wanted(event, host, rank):
            output.on_event(event)
    return code


def follow(client: Client, job_id: str, *, host: str | None = None, rank: int | None = None) -> int:
    """Print the job's output and corral's messages live until it ends (a queued job's
    waiting reason first); its exit code, as ``corral run`` would exit."""
    output = TerminalOutput()
    try:
        code = _render(api.follow(client, job_id, show_waiting), output, host, rank)
    except KeyboardInterrupt:
        output.close()
        say(
            make_console(),
            f"stopped following; job {job_id} goes on (corral job stop {job_id} stops it)",
            "yellow",
        )
        return EXIT_INTERRUPTED
    finally:
        output.close()  # idempotent
    try:
        status = api.wait_until_ended(client, job_id)
    except ServerUnreachable:
        return code  # the last event said how it ended
    if status["status"] not in TERMINAL_STATES:
        return code
    print_ending(status, make_console())
    return api.exit_code_of(status) if status["status"] == JobState.LOST else code


def print_ending(status: dict[str, Any], console: Console) -> None:
    """The end of a followed job: the root cause when it failed, then one line."""
    state = str(status["status"])
    cause = status.get("root_cause")
    if cause and state != JobState.SUCCEEDED:
        console.print(root_cause_block(cause), soft_wrap=True)
    ran = None
    if status.get("started") and status.get("ended"):
        ran = status["ended"] - status["started"]
    line = Text(f"job {status['job_id']}: ")
    line.append_text(state_text(state))
    line.append(f", exit code {api.exit_code_of(status)}, {duration_text(ran)}")
    console.print(line, soft_wrap=True)
