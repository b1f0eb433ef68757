"""Why a job cannot start now, in the server's words: the 409 of a plan lists each
machine that cannot take it, and a queued job's reason says what it waits for."""

from __future__ import annotations

import pytest

from corral.errors import Conflict
from corral.service.planner import select_machines
from corral.service.queue import waiting_reason
from corral.words import plural
from tests.unit.test_service_planner import machine, request


def test_plural() -> None:
    assert [plural(n, "rank") for n in (0, 1, 2)] == ["0 ranks", "1 rank", "2 ranks"]
    assert plural(1, "machine") == "1 machine"


def test_a_conflict_names_each_machine_that_cannot_take_the_job() -> None:
    machines = [machine("a"), machine("b", status="offline", last_error="timeout")]
    with pytest.raises(Conflict) as info:
        select_machines(machines, request(num=2), {"m-a": ["j-1"]})
    assert str(info.value) == (
        "2 machines needed, 0 available (2 registered): a busy with j-1, b offline: timeout"
    )
    assert waiting_reason(request(num=2), info.value) == (
        "waiting for 2 machines: a busy with j-1, b offline: timeout"
    )


def test_one_machine_is_singular() -> None:
    with pytest.raises(Conflict) as info:
        select_machines([machine("a")], request(num=1), {"m-a": ["j-1"]})
    assert str(info.value) == "1 machine needed, 0 available (1 registered): a busy with j-1"
    assert waiting_reason(request(num=1), info.value) == "waiting for 1 machine: a busy with j-1"


def test_the_reason_of_a_manual_selection_names_the_machines() -> None:
    a, b = machine("a"), machine("b")
    with pytest.raises(Conflict) as info:
        select_machines([a, b], request(num=2), {"m-b": ["j-1"]}, chosen=[a, b])
    wanted = request(num=2, machine_selection="manual", selected_machines=["a", "b"])
    assert waiting_reason(wanted, info.value) == "waiting for a, b: b busy with j-1"
    taken = Conflict("machines are busy: b with j-2", details={"busy": {"b": ["j-2"]}})
    assert waiting_reason(wanted, taken) == "waiting for a, b: b busy with j-2"


def test_a_shortfall_with_some_free_says_how_many() -> None:
    machines = [machine("a"), machine("b")]
    with pytest.raises(Conflict) as info:
        select_machines(machines, request(num=2), {"m-b": ["j-1"]})
    assert waiting_reason(request(num=2), info.value) == (
        "waiting for 2 machines (1 free): b busy with j-1"
    )


def test_the_live_view_writes_one_node_and_one_rank_in_the_singular() -> None:
    import io

    from rich.console import Console

    from corral.job.events import AttemptStarted
    from corral.job.output import TerminalOutput

    console = Console(file=io.StringIO(), width=200)
    output = TerminalOutput(stream=io.BytesIO(), console=console)
    output.on_event(
        AttemptStarted(job_id="j", number=0, hosts=["n1"], world_size=1, launcher="python")
    )
    output.close()
    assert "job j: 1 node, 1 rank, launcher python" in console.file.getvalue()  # type: ignore[attr-defined]
