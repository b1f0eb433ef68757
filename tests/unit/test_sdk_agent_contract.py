"""The contract between the SDK's messages and the node agent's schema: every kind of
line the SDK sends (reports, a checkpoint, a quorum change, a finished chunk) is
accepted by the agent (:mod:`corral.agent.messages`) and becomes ``report`` events
the coordinator accepts (:mod:`corral.agent.events`)."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

from corral import sdk
from corral.agent.events import parse_event
from corral.agent.messages import forwarded, parse_message
from corral.sdk import _report
from corral.sdk._checkpoint import _announce
from corral.sdk._ft import FaultTolerant
from tests.unit.test_sdk_report import ControlServer, control_server  # noqa: F401


def _events(lines: list[str]) -> list[dict[str, Any]]:
    """What the agent forwards for ``lines``, as the coordinator reads it."""
    out = []
    for line in lines:
        message = parse_message(line.encode())  # ValueError: the agent drops the line
        out += [parse_event(json.dumps(event)) for event in forwarded(message, 3, now=1000.0)]
    return out


def test_every_sdk_message_is_accepted_by_the_agent_and_the_coordinator(
    control_server: ControlServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    with sdk.section("compute"):
        pass
    sdk.report(1, 2, loss=0.5, bad=float("nan"))
    sdk.report(2, 2)
    _announce(tmp_path / "ckpt-00000002.pt", 2, 3)  # save_checkpoint's announcement
    owner = types.SimpleNamespace(group=1, step=2, _share=None)
    FaultTolerant._event(owner, "healing")  # type: ignore[arg-type]
    _report.send_event({"type": "chunk", "chunk": 1, "total": 3, "percent": 33})
    lines = control_server.wait_lines(5)[1:]
    events = _events(lines)
    assert [(e["event"], e["type"], e["rank"]) for e in events] == [
        ("report", "progress", 3),
        ("report", "progress", 3),
        ("report", "checkpoint", 3),
        ("report", "quorum", 3),
        ("report", "chunk", 3),
    ]
    first, second = events[0], events[1]
    assert first["metrics"] == {"loss": 0.5, "bad": None}
    assert set(first["sections"]) == {"compute"} and not second["sections"]
    assert 0 < first["time"] <= second["time"] <= 1000.0  # the agent's clock less the age
    assert (events[3]["kind"], events[3]["group"]) == ("healing", 1)
    assert (events[4]["chunk"], events[4]["percent"]) == (1, 33)


def test_an_invalid_report_costs_only_itself(
    control_server: ControlServer,  # noqa: F811
) -> None:
    sdk.report(1, loss=1.0)
    sdk.report(2**70)  # beyond what the agent accepts as a step
    sdk.report(3, **{"": 1.0})  # an empty metric name: refused by the agent
    sdk.report(4)
    _report.flush_reports()
    sdk.report(5, loss=float("nan"))  # sent as null
    _report.flush_reports()
    first, second = control_server.wait_lines(3)[1:]
    message = parse_message(first.encode())
    assert getattr(message, "dropped", None) == 2  # the agent says so, once per line
    events = _events([first, second])
    assert [e["step"] for e in events] == [1, 4, 5]
    assert events[2]["metrics"] == {"loss": None}
