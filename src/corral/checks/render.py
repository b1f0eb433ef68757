"""The checklist on a console: a check x host table, then each problem with its fix."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.checks.result import ChecklistReport, CheckResult, Status

STYLE = {Status.PASS: "green", Status.SKIP: "dim", Status.WARN: "yellow", Status.FAIL: "bold red"}
MARK = {Status.PASS: "✓", Status.SKIP: "-", Status.WARN: "!", Status.FAIL: "✗"}
CELL_CHARS = 60


def _cell(status: Status, detail: str) -> Text:
    short = detail if len(detail) <= CELL_CHARS else detail[: CELL_CHARS - 1] + "…"
    text = Text(f"{MARK[status]} {status.value}", style=STYLE[status])
    if short:
        text.append(f" {short}", style="dim" if status is Status.PASS else "")
    return text


def table(report: ChecklistReport) -> Table:
    """One row per check, one column per host."""
    grid = Table(title="pre-flight checklist", title_justify="left", show_lines=True)
    grid.add_column("check", no_wrap=True)
    for host in report.hosts:
        grid.add_column(host, overflow="fold")
    for check in report.checks:
        cells = []
        for host in report.hosts:
            outcome = check.hosts.get(host)
            cells.append(_cell(outcome.status, outcome.detail) if outcome else Text("-", "dim"))
        grid.add_row(Text(check.name, style=STYLE[check.status]), *cells)
    return grid


def versions_table(check: CheckResult) -> Table | None:
    """The versions that differ, per host (software check)."""
    mismatched: dict[str, dict[str, str]] = check.data.get("mismatched") or {}
    if not mismatched:
        return None
    grid = Table()
    grid.add_column("host")
    for key in mismatched:
        grid.add_column(key)
    hosts = list(next(iter(mismatched.values())))
    for host in hosts:
        grid.add_row(host, *(mismatched[k].get(host, "-") for k in mismatched))
    return grid


def problems(console: Console, report: ChecklistReport) -> None:
    """Each warning and failure, with its fix command."""
    for check in report.checks:
        if check.status not in (Status.WARN, Status.FAIL):
            continue
        message = check.error if check.status is Status.FAIL else check.warning
        console.print(
            Text(f"{MARK[check.status]} {check.name}: ", style=STYLE[check.status])
            + Text(message or check.summary),
            soft_wrap=True,
        )
        if check.name == "software":
            versions = versions_table(check)
            if versions is not None:
                console.print("  versions that differ:")
                console.print(versions)
        if check.fix_command:
            console.print(Text("  fix: ", style="bold") + Text(check.fix_command), soft_wrap=True)


def verdict(report: ChecklistReport, prefix: str = "") -> Text:
    """One closing line."""
    counts = {s: sum(1 for c in report.checks if c.status is s) for s in Status}
    status = report.overall_status
    text = Text(prefix)
    text.append(f"{MARK[status]} {status.value}", style=STYLE[status])
    text.append(
        f": {counts[Status.PASS]} passed, {counts[Status.WARN]} warned, "
        f"{counts[Status.FAIL]} failed, {counts[Status.SKIP]} skipped on "
        f"{len(report.hosts)} host(s) in {report.duration_s:.2f} s"
    )
    return text


def print_report(console: Console, report: ChecklistReport, *, full: bool = True) -> None:
    """The table (``full``), the problems and the verdict."""
    if full:
        console.print(table(report))
    problems(console, report)
    console.print(verdict(report))
