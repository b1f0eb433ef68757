"""A batched report is dated when the rank made it, however late the agent reads it.

The SDK sends ``sdk.report`` calls in batches (every 0.2 s), each report with its age
and the batch with ``sent``, the rank's clock when the ages were taken. An agent that
reads a line late (the first one waits while it imports pydantic: a second or more on
a busy machine) must not date the reports by its reading time: every report queued
meanwhile would get the same date, and the rates measured from them (tracking's
throughput, calibrate's drift) would vanish.
"""

from __future__ import annotations

import json

from corral import sdk
from corral.agent.messages import MAX_SEND_LAG, ReportsMessage, forwarded, parse_message
from tests.unit.test_sdk_report import ControlServer, control_server  # noqa: F401


def _line(sent: float | None, ages: list[int]) -> bytes:
    reports = [[step, 10, age, {"loss": 1.0}, None] for step, age in enumerate(ages)]
    message: dict[str, object] = {"type": "reports", "rank": 0, "reports": reports}
    if sent is not None:
        message["sent"] = sent
    return json.dumps(message).encode()


def _times(line: bytes, now: float) -> list[float]:
    message = parse_message(line)
    assert isinstance(message, ReportsMessage)
    return [event["time"] for event in forwarded(message, 0, now=now)]


def test_a_batch_read_late_keeps_the_times_its_reports_were_made() -> None:
    # three batches of one rank, sent 0.2 s apart, all read at once 3 s after the first
    lines = [_line(100.0, [150, 100, 50]), _line(100.2, [150, 100, 50]), _line(100.4, [50])]
    times = [round(t, 6) for line in lines for t in _times(line, now=103.0)]
    assert times == [99.85, 99.9, 99.95, 100.05, 100.1, 100.15, 100.35]


def test_sent_is_believed_only_between_the_read_and_the_longest_lag() -> None:
    assert _times(_line(200.0, [0]), now=150.0) == [150.0]  # never after the read
    assert _times(_line(1.0, [0]), now=150.0) == [150.0 - MAX_SEND_LAG]
    assert _times(_line(None, [500]), now=150.0) == [149.5]  # an SDK without it


def test_a_batch_with_an_invalid_report_keeps_its_sent() -> None:
    line = json.dumps(
        {"type": "reports", "sent": 100.0, "reports": [[1, None, 0, {}, None], "bad"]}
    ).encode()
    message = parse_message(line)
    assert isinstance(message, ReportsMessage) and message.dropped == 1
    assert _times(line, now=105.0) == [100.0]


def test_the_sdk_sends_when_it_took_the_batch(
    control_server: ControlServer,  # noqa: F811
) -> None:
    sdk.report(1, 2, loss=0.5)
    sdk.report(2, 2, loss=0.25)
    line = control_server.wait_lines(2)[1].encode()
    message = parse_message(line)
    assert isinstance(message, ReportsMessage) and message.sent is not None
    ages = [age for _, _, age, _, _ in message.reports]
    late = message.sent + 3.0  # the agent busy for 3 s before it read the line
    assert _times(line, now=late) == [message.sent - age / 1000.0 for age in ages]
