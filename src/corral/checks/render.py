"""The checklist on a console.

By default one line per check (status, the failing / warning hosts named, the
short reason), each problem followed by its fix; ``wide`` shows the check x host
matrix, then each problem with its fix. Lines are soft-wrapped, never cut, so a
fix command can be copied whole. A host's detail that already names the host
(a transport error: ``tb9: cannot resolve tb9``) is not prefixed with it again.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from corral.checks.result import ChecklistReport, CheckResult, Status

STYLE = {Status.PASS: "green", Status.SKIP: "dim", Status.WARN: "yellow", Status.FAIL: "bold red"}
MARK = {Status.PASS: "✓", Status.SKIP: "-", Status.WARN: "!", Status.FAIL: "✗"}
CELL_CHARS = 60
SHOWN_HOSTS = 4
SHOWN_REASONS = 3


def _own(host: str, detail: str) -> str:
    """``detail`` without a leading ``host:`` (the row or column names the host)."""
    return detail.removeprefix(f"{host}:").lstrip() if detail.startswith(f"{host}:") else detail


def _undoubled(text: str, hosts: list[str]) -> str:
    """``text`` with ``host: host: `` (a host named twice) said once."""
    for host in hosts:
        text = text.replace(f"{host}: {host}: ", f"{host}: ")
    return text


def _cell(status: Status, detail: str) -> Text:
    short = detail if len(detail) <= CELL_CHARS else detail[: CELL_CHARS - 1] + "…"
    text = Text(f"{MARK[status]} {status.value}", style=STYLE[status])
    if short:
        text.append(f" {short}", style="dim" if status is Status.PASS else "")
    return text


def _names(hosts: list[str], total: int) -> str:
    """``a, b, c`` (``+N more`` past :data:`SHOWN_HOSTS`); ``all N`` only when that
    would be every one of more than :data:`SHOWN_HOSTS` hosts (a few are always named)."""
    if total > SHOWN_HOSTS and len(hosts) == total:
        return f"all {total}"
    shown = ", ".join(hosts[:SHOWN_HOSTS])
    return shown + (f" +{len(hosts) - SHOWN_HOSTS} more" if len(hosts) > SHOWN_HOSTS else "")


def hosts_field(check: CheckResult, total: int) -> str:
    """Which hosts the row is about: the failing / warning ones, else a count."""
    if check.status in (Status.FAIL, Status.WARN):
        return _names(check.hosts_with(check.status), total)
    if check.status is Status.PASS:
        return f"{len(check.hosts_with(Status.PASS))}/{total}"
    return "-"


def _grouped(bad: list[tuple[str, str]], summary: str) -> str:
    groups: dict[str, list[str]] = {}
    for host, detail in bad:
        groups.setdefault(detail, []).append(host)
    if len(groups) == 1:
        return next(iter(groups)) or summary
    parts = [f"{_names(hs, 0)}: {d}" if d else _names(hs, 0) for d, hs in groups.items()]
    more = len(parts) - SHOWN_REASONS
    return "; ".join(parts[:SHOWN_REASONS]) + (f" (+{more} more)" if more > 0 else "")


def reason(check: CheckResult) -> tuple[str, str | None]:
    """The row's reason, and the hosts' details when that sentence leaves them out.

    The reason is the check's own sentence, or (when it only lists every host's
    detail) those details grouped: hosts sharing a detail together, at most
    :data:`SHOWN_REASONS` groups."""
    if check.status not in (Status.FAIL, Status.WARN):
        skipped = [_own(h, c.detail) for h, c in check.hosts.items() if c.detail]
        return check.summary or (skipped[0] if skipped else ""), None
    own = check.error if check.status is Status.FAIL else check.warning
    own = _undoubled(own, list(check.hosts)) if own else own
    bad = [(h, _own(h, c.detail)) for h, c in check.hosts.items() if c.status is check.status]
    named = "; ".join(f"{h}: {d}" if d else h for h, d in bad)
    if not own or own == named:
        return _grouped(bad, check.summary), None
    if all(d in own for _, d in bad):
        return own, None
    return own, _grouped([(h, d) for h, d in bad if d], "") or None


def rows(console: Console, report: ChecklistReport) -> None:
    """One line per check, each problem's fix (and the software versions) under it."""
    total = len(report.hosts)
    console.print(Text(f"pre-flight checklist: {total} host(s)", style="bold"), soft_wrap=True)
    width = max((len(c.name) for c in report.checks), default=0) + 1
    counts = [hosts_field(c, total) for c in report.checks]
    hosts_width = min(max((len(h) for h in counts), default=0), 24)
    for check, hosts in zip(report.checks, counts, strict=True):
        line = Text(f"{MARK[check.status]} ", style=STYLE[check.status])
        line.append(f"{check.name + ':':<{width}} ", style=STYLE[check.status])
        line.append(f"{check.status.value:<4}  ", style=STYLE[check.status])
        line.append(f"{hosts:<{hosts_width}}  ")
        why, details = reason(check)
        line.append(why, style="dim" if check.status is Status.PASS else "")
        console.print(line, soft_wrap=True)
        if check.status not in (Status.FAIL, Status.WARN):
            continue
        if details:
            console.print(Text(f"  {details}"), soft_wrap=True)
        _versions_and_fix(console, check)


def _versions_and_fix(console: Console, check: CheckResult) -> None:
    """Below a problem: the versions that differ (software check) and the fix."""
    if check.name == "software":
        versions = versions_table(check)
        if versions is not None:
            console.print("  versions that differ:")
            console.print(versions)
    if check.fix_command:
        console.print(Text("  fix: ", style="bold") + Text(check.fix_command), soft_wrap=True)


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
            cells.append(
                _cell(outcome.status, _own(host, outcome.detail)) if outcome else Text("-", "dim")
            )
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
            + Text(_undoubled(message or check.summary, list(check.hosts))),
            soft_wrap=True,
        )
        _versions_and_fix(console, check)


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


def print_report(
    console: Console, report: ChecklistReport, *, full: bool = True, wide: bool = False
) -> None:
    """The checklist and the verdict: one line per check with the fixes (``full``),
    the check x host matrix and the problems (``wide``), or the problems only."""
    if wide:
        console.print(table(report))
        problems(console, report)
    elif full:
        rows(console, report)
    else:
        problems(console, report)
    console.print(verdict(report))
