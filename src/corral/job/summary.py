"""The end-of-job report: a summary table and the root-cause block (and, after a
restart, the attempts table), printed once when the job has finished."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.job.events import Finished
from corral.job.output import format_progress
from corral.job.result import Failure, JobResult, NodeRun, signal_name
from corral.job.states import JobState, NodeState
from corral.recovery.inplace import episode_lines
from corral.recovery.restart import AttemptRecord

OOM_HINT = (
    "hint: exit -9/137 (SIGKILL) with no traceback is most often the kernel's OOM killer; "
    "check `dmesg | grep -i oom` on that host or lower the batch size"
)

_STATE_STYLE = {
    NodeState.EXITED: "green",
    NodeState.FAILED: "bold red",
    NodeState.LOST: "bold red",
    NodeState.TERMINATED: "yellow",
}
#: How a node's state reads in the summary (a node corral tore down was stopped).
STATE_LABEL = {NodeState.TERMINATED: "stopped"}


def reason_text(reason: str, cause: str | None = None) -> str:
    """Why a job stopped, as every view shows it: a failure names its root cause
    (``rank 1 on n2 exited with code 1``), not the word ``failure``."""
    if reason == "failure":
        return cause or "a rank failed"
    if reason == "timeout":
        return "its time limit (--timeout) passed"
    return reason


def preflight_findings(report: Any) -> list[dict[str, Any]]:
    """The pre-flight checks that failed or warned (a report as JSON, a Checked
    event's): ``name``, ``status`` (fail|warn), ``message``, ``fix_command``: what the
    live view, ``corral job status``, the API and the web page all show."""
    checks = report.get("checks") if isinstance(report, dict) else None
    found = []
    for check in checks or []:
        status = check.get("status")
        if status in ("fail", "warn"):
            found.append(
                {
                    "name": str(check.get("name")),
                    "status": status,
                    "message": str(check.get("error") or check.get("warning") or ""),
                    "fix_command": check.get("fix_command"),
                }
            )
    return found


def finding_line(finding: dict[str, Any]) -> str:
    """One finding as a line: ``pre-flight NAME: MESSAGE (fix: COMMAND)``."""
    line = f"pre-flight {finding['name']}: {finding['message']}"
    if finding.get("fix_command"):
        line += f" (fix: {finding['fix_command']})"
    return line


def _exit_text(node: NodeRun) -> str:
    """The ranks' exit codes (signal names), or with no rank known (a ``command`` or
    ``madengine`` node, a torchrun that failed before its ranks) the node's own."""
    codes = sorted({r.code for r in node.ranks.values() if r.exited}, key=lambda c: (c is None, c))
    if not codes and not node.ranks and node.exit_code is not None:
        codes = [node.exit_code]
    if not codes:
        return "-"
    parts = []
    for code in codes:
        name = signal_name(code) if code is not None and code < 0 else None
        parts.append(name or ("stopped" if code is None else str(code)))
    return ",".join(parts)


def _ranks_text(node: NodeRun) -> str:
    ranks = sorted(node.ranks)
    if not ranks:
        return "-"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 1:
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def _progress_text(node: NodeRun) -> str:
    """The latest report of the node's lowest rank that reported, naming that rank."""
    for record in sorted(node.ranks.values(), key=lambda r: r.rank):
        if record.progress:
            return f"{format_progress(record.progress)} (rank {record.rank})"
    return ""


def summary_table(result: JobResult) -> Table:
    """Per node: ranks, state, exit code or signal, duration, last progress."""
    table = Table(title=f"job {result.job_id}: {result.state.value}", title_justify="left")
    for column in ("node", "ranks", "state", "exit", "duration", "last progress"):
        table.add_column(column)
    for node in result.nodes:
        end = node.ended or result.ended
        duration = f"{end - node.started:.1f}s" if node.started else "-"
        table.add_row(
            node.host.name,
            _ranks_text(node),
            Text(
                STATE_LABEL.get(node.state, node.state.value),
                style=_STATE_STYLE.get(node.state, ""),
            ),
            _exit_text(node),
            duration,
            _progress_text(node),
        )
    return table


def root_cause_text(failure: Failure, others: list[Failure]) -> Text:
    """The root-cause block: earliest failure first, with its stderr tail."""
    text = Text()
    text.append("root cause: ", style="bold red")
    text.append(failure.message + "\n")
    where = f"  host: {failure.host}"
    if failure.rank is not None:
        where += f"   rank: {failure.rank}"
    if failure.code is not None and failure.rank is not None:
        name = signal_name(failure.code) if failure.code < 0 else None
        where += f"   exit: {failure.code}" + (f" ({name})" if name else "")
    text.append(where + "\n")
    if failure.traceback:
        text.append("  traceback (from the rank's error file):\n", style="bold")
        for line in failure.traceback.rstrip().splitlines():
            text.append(f"    {line}\n")
    elif failure.stderr_tail:
        label = failure.tail or f"last {len(failure.stderr_tail)} lines of stderr"
        text.append(f"  {label}:\n", style="bold")
        for line in failure.stderr_tail:
            text.append(f"    {line}\n")
    if failure.code in (-9, 137):
        text.append("  " + OOM_HINT + "\n", style="yellow")
    if others:
        text.append(f"  then {len(others)} more failure(s):\n", style="dim")
        for other in others[:5]:
            text.append(f"    {other.message}\n", style="dim")
    return text


def print_report(result: JobResult, console: Console) -> None:
    """Print the summary table, then the root cause (if the job failed)."""
    console.print(summary_table(result))
    for line in episode_lines(result.groups):  # --recovery in-place
        console.print(Text(f"in place: {line}", style="cyan"))
    cause = result.root_cause
    if result.state == JobState.FAILED and cause is not None:
        console.print(root_cause_text(cause, result.failures[1:]))
    elif result.state == JobState.TIMED_OUT:
        console.print(Text("job timed out (--timeout); every node was torn down", style="red"))
    elif result.state == JobState.CANCELLED:
        console.print(Text("job cancelled; every node was torn down", style="yellow"))
    console.print(
        Text(f"exit code {result.exit_code}, {result.ended - result.started:.1f}s", style="dim")
    )


def attempts_table(records: Sequence[AttemptRecord]) -> Table:
    """Every attempt of the job: hosts, ranks, how it ended and why, how long it ran."""
    table = Table(title="attempts", title_justify="left")
    for column in ("attempt", "hosts", "ranks", "result", "cause", "duration", "resumed from"):
        table.add_column(column, overflow="fold")
    for record in records:
        style = "green" if record.state == JobState.SUCCEEDED else "bold red"
        duration = record.duration
        table.add_row(
            str(record.number),
            ",".join(record.hosts),
            str(record.world_size),
            Text(record.state, style=style),
            "" if record.state == JobState.SUCCEEDED else record.cause,
            "-" if duration is None else f"{duration:.1f}s",
            record.checkpoint or "",
        )
    return table


def print_finished(event: Finished, console: Console) -> None:
    """The end of a job, once: the summary and root cause, then the attempts table
    when there was more than one attempt (a restart never prints a summary)."""
    result = event.result
    if not result.nodes:
        console.print(
            Text(f"job {result.job_id}: {event.state.value} before launch", style="yellow")
        )
        return
    print_report(result, console)
    if len(result.attempts) > 1:
        console.print(attempts_table([AttemptRecord(**a) for a in result.attempts]))
