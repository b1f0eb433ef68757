"""corral's own output off a terminal (never wrapped), folded launcher noise, and the
checklist naming a host once."""

from __future__ import annotations

import io
import sys

import pytest

from corral.agent.protocol import NODE
from corral.checks.render import print_report as print_checklist
from corral.checks.result import ChecklistReport, CheckResult, HostCheck, Status
from corral.cluster import Host
from corral.console import make_console
from corral.job.events import AttemptStarted, Finished, LogLines, RankExited, StateChanged
from corral.job.output import TerminalOutput
from corral.job.result import Failure, JobResult, NodeRun, RankRecord
from corral.job.states import JobState, NodeState
from corral.job.summary import attempts_table, print_finished, print_report
from corral.plan.spec import NodeCommand
from corral.recovery.restart import AttemptRecord

LONG = "x" * 150 + " " + "y" * 150  # past any terminal's 80 columns


def _lines(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


def _node(host: str, ranks: list[int]) -> NodeRun:
    command = NodeCommand(Host(host), node_rank=0, argv=("t",), env={}, cwd="/", nproc=len(ranks))
    node = NodeRun(command=command, state=NodeState.FAILED, started=1.0, ended=2.0)
    for rank in ranks:
        node.ranks[rank] = RankRecord(host=host, rank=rank, exited=True, code=1)
    return node


def _failed(hosts: list[str]) -> JobResult:
    """A failed job of one rank per host; rank 1 on tb2 is the root cause."""
    cause = Failure("tb2", 1, 1, 1.5, "rank 1 on tb2 exited with code 1", [f"Error: {LONG}"])
    return JobResult(
        job_id="j",
        state=JobState.FAILED,
        exit_code=1,
        nodes=[_node(h, [i]) for i, h in enumerate(hosts)],
        failures=[cause],
        started=1.0,
        ended=2.0,
    )


def test_summary_root_cause_and_attempts_are_whole_lines_when_piped() -> None:
    hosts = [f"tb{i}" for i in range(1, 40)]
    result = _failed(hosts)
    console = make_console(file=io.StringIO())
    print_report(result, console)
    record = AttemptRecord(0, hosts, 39, started=1.0, ended=2.0, state="failed", cause=LONG)
    console.print(attempts_table([record]))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert f"    Error: {LONG}\n" in text  # the stderr line, whole, indented
    row = next(line for line in _lines(text) if line.startswith("│ 0 "))
    assert ",".join(hosts) in row and LONG in row  # one row: no cell wrapped
    assert all(line == line.rstrip() for line in _lines(text))


def test_terminal_output_does_not_wrap_its_messages_or_the_summary_when_piped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    terminal = TerminalOutput(  # its own console, on stderr: not a terminal
        ["tb2"], stream=io.BytesIO(), live=False, on_finish=print_finished
    )
    terminal.message(f"rank 1 on tb2 exited: {LONG}")
    terminal.on_event(
        Finished(job_id="j", state=JobState.FAILED, exit_code=1, result=_failed(["tb2"]))
    )
    lines = _lines(err.getvalue())
    assert lines[0] == f"[corral] rank 1 on tb2 exited: {LONG}"
    assert f"    Error: {LONG}" in lines
    assert "  host: tb2   rank: 1   exit: 1" in lines


def test_node_output_after_all_its_ranks_exited_is_folded() -> None:
    out = io.BytesIO()
    console = make_console(file=io.StringIO())
    terminal = TerminalOutput(["h", "g"], stream=out, live=False, console=console)
    terminal.on_event(RankExited(job_id="j", host="h", rank=0, code=0))
    terminal.on_event(LogLines(job_id="j", host="h", rank=NODE, data=b"still running\n"))
    terminal.on_event(RankExited(job_id="j", host="h", rank=1, code=0, last=True))
    noise = b"[W TCPStore.cpp] recvVector failed\nDid the remote server shutdown or crash?\n"
    terminal.on_event(LogLines(job_id="j", host="h", rank=NODE, data=noise))
    terminal.on_event(LogLines(job_id="j", host="g", rank=NODE, data=b"g is not done\n"))
    terminal.on_event(StateChanged(job_id="j", old=JobState.RUNNING, state=JobState.SUCCEEDED))
    terminal.close()
    assert out.getvalue() == b"[h] still running\n[g] g is not done\n"
    said = console.file.getvalue()  # type: ignore[attr-defined]
    assert _lines(said) == ["[corral] h: the launcher's teardown output (2 lines) is in h.node.log"]


def test_a_new_attempt_shows_node_output_again() -> None:
    out = io.BytesIO()
    terminal = TerminalOutput(
        ["h"], stream=out, live=False, console=make_console(file=io.StringIO())
    )
    terminal.on_event(RankExited(job_id="j", host="h", rank=0, code=1, last=True))
    terminal.on_event(AttemptStarted(job_id="j", number=1, hosts=["h"], world_size=1))
    terminal.on_event(LogLines(job_id="j", host="h", rank=NODE, data=b"torchrun banner\n"))
    terminal.close()
    assert out.getvalue() == b"[h] torchrun banner\n"


def test_the_checklist_names_a_host_once_when_its_detail_names_it_too() -> None:
    hosts = {
        "tb1": HostCheck(Status.PASS, "RTT 1 ms"),
        "tb9": HostCheck(Status.FAIL, "tb9: cannot resolve tb9 (Name or service not known)"),
        "tb8": HostCheck(Status.FAIL, "tb8: no SSH connection to tb8 within 5 s"),
    }
    report = ChecklistReport([CheckResult.from_hosts("connectivity", hosts)], list(hosts))
    for options in ({}, {"full": False}, {"wide": True}):
        console = make_console(file=io.StringIO())
        print_checklist(console, report, **options)
        text = console.file.getvalue()  # type: ignore[attr-defined]
        assert "tb9: cannot resolve tb9" in text or "fail cannot resolve tb9" in text
        assert "tb9: tb9:" not in text and "tb8: tb8:" not in text, options
