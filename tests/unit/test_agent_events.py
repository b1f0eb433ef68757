"""Validation of what crosses the agent: rank messages (corral.agent.messages) and
agent events as the coordinator parses them (corral.agent.events.parse_event)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from corral.agent.events import parse_event
from corral.agent.messages import (
    AGENT_KEYS,
    MAX_MESSAGE,
    CheckpointMessage,
    Complaints,
    ExitMessage,
    ProgressMessage,
    parse_message,
    report_event,
)

T = 1_700_000_000.0


def _dumps(obj: object) -> bytes:
    return json.dumps(obj).encode()


# -- rank -> agent --------------------------------------------------------------------


def test_sdk_progress_line_is_accepted() -> None:
    line = _dumps(
        {
            "type": "progress",
            "rank": 3,
            "step": 10,
            "total": 100,
            "metrics": {"loss": 0.5, "nan": None},
            "time": T,
        }
    )
    msg = parse_message(line + b"\n")
    assert msg == ProgressMessage(
        type="progress", step=10, total=100, metrics={"loss": 0.5, "nan": None}
    )


def test_checkpoint_and_exit_lines() -> None:
    ckpt = parse_message(
        _dumps({"type": "checkpoint", "step": 5, "path": "/c/x.pt", "rank": 0, "time": T})
    )
    assert ckpt == CheckpointMessage(type="checkpoint", step=5, path="/c/x.pt", ack=False)
    assert parse_message(b'{"type":"exit","code":3}') == ExitMessage(type="exit", code=3)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"not json", "Invalid JSON"),
        (b"[1, 2]", "object"),
        (b'{"step": 1}', "type"),
        (b'{"type": "rank_exit", "rank": 0, "code": 1}', "rank_exit"),
        (b'{"type": "node_exit", "code": 0}', "node_exit"),
        (b'{"type": "progress", "step": "10"}', "progress.step"),
        (b'{"type": "progress", "step": true}', "progress.step"),
        (b'{"type": "progress", "step": 1, "metrics": {"a": "x"}}', "progress.metrics.a"),
        (b'{"type": "progress", "step": 1, "metrics": {"a": NaN}}', "finite"),
        (b'{"type": "progress", "step": 1, "metrics": [1]}', "progress.metrics"),
        (b'{"type": "checkpoint", "step": 1}', "checkpoint.path"),
        (b'{"type": "checkpoint", "step": 1, "path": ""}', "checkpoint.path"),
        (b'{"type": "exit", "code": 1000}', "exit.code"),
    ],
)
def test_invalid_rank_lines_are_rejected(line: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_message(line)


def test_sizes_are_bounded() -> None:
    many = {f"m{i}": 1.0 for i in range(65)}
    with pytest.raises(ValueError, match="metrics"):
        parse_message(_dumps({"type": "progress", "step": 1, "metrics": many}))
    with pytest.raises(ValueError, match="metrics"):
        parse_message(_dumps({"type": "progress", "step": 1, "metrics": {"k" * 200: 1.0}}))
    with pytest.raises(ValueError, match="path"):
        parse_message(_dumps({"type": "checkpoint", "step": 1, "path": "/" * 5000}))
    with pytest.raises(ValueError, match="bytes"):
        parse_message(b'{"type":"progress","step":1,"pad":"' + b"x" * MAX_MESSAGE + b'"}')


def test_rejection_reason_is_short_and_printable() -> None:
    with pytest.raises(ValueError) as err:
        parse_message(_dumps({"type": "\n" + "x" * 5000}))
    text = str(err.value)
    assert len(text) < 260 and text.isprintable()


def test_payload_keys_cannot_override_the_agents() -> None:
    forged = _dumps(
        {
            "type": "progress",
            "step": 1,
            "event": "rank_exit",
            "rank": 7,
            "time": 1.0,
            "code": 1,
        }
    )
    msg = parse_message(forged)
    assert isinstance(msg, ProgressMessage)
    event = report_event(msg, rank=2, now=T)
    assert event == {
        "event": "report",
        "type": "progress",
        "rank": 2,
        "step": 1,
        "total": None,
        "metrics": {},
        "time": T,
    }


def test_models_have_no_agent_keys() -> None:
    for model in (ProgressMessage, CheckpointMessage, ExitMessage):
        assert not AGENT_KEYS & set(model.model_fields), model


def test_complaints_are_rate_limited() -> None:
    now = [0.0]
    complaints = Complaints(interval=5.0, clock=lambda: now[0])
    assert complaints.note("bad 1") == "corral agent: bad 1"
    now[0] = 1.0
    assert complaints.note("bad 2") is None
    assert complaints.note("bad 3") is None
    now[0] = 6.0
    assert complaints.note("bad 4") == "corral agent: bad 4 (2 more dropped before)"
    now[0] = 12.0
    assert complaints.note("bad 5") == "corral agent: bad 5"


# -- agent -> coordinator -------------------------------------------------------------


def _event(name: str, **fields: Any) -> bytes:
    return _dumps({"event": name, "time": T, **fields})


VALID: list[tuple[bytes, dict[str, Any]]] = [
    (
        _event("started", pid=10, pgids=[10, 11], node_dir="/n", hostname="h"),
        {"pid": 10, "pgids": [10, 11], "node_dir": "/n", "hostname": "h"},
    ),
    (_event("rank_start", rank=1, local_rank=1, pid=12), {"rank": 1, "local_rank": 1, "pid": 12}),
    (
        _event(
            "rank_exit",
            rank=1,
            local_rank=1,
            pid=12,
            code=-9,
            eof_time=T,
            error={"message": "boom", "traceback": "..."},
        ),
        {"rank": 1, "code": -9, "eof_time": T, "error": {"message": "boom", "traceback": "..."}},
    ),
    (
        _event("rank_exit", rank=0, local_rank=0, pid=None, code=None, eof_time=None, error=None),
        {"pid": None, "code": None, "error": None},
    ),
    (
        _event("report", type="progress", rank=0, step=3, total=9, metrics={"loss": 1.5}),
        {"type": "progress", "rank": 0, "step": 3, "total": 9, "metrics": {"loss": 1.5}},
    ),
    (
        _event("report", type="checkpoint", rank=0, step=3, path="/c/a.pt", ack=True),
        {"type": "checkpoint", "path": "/c/a.pt", "ack": True, "step": 3},
    ),
    (
        _event(
            "stacks",
            stacks=[{"rank": 0, "pid": 5, "method": "py-spy", "text": "Thread", "error": None}],
        ),
        {
            "stacks": [
                {
                    "rank": 0,
                    "pid": 5,
                    "method": "py-spy",
                    "text": "Thread",
                    "error": None,
                    "trace": None,
                    "trace_error": None,
                }
            ]
        },
    ),
    (_event("master_ready", addr="10.0.0.1", port=29500), {"addr": "10.0.0.1", "port": 29500}),
    (
        _event("master_timeout", addr="10.0.0.1", port=29500, timeout=300.0),
        {"timeout": 300.0},
    ),
    (_event("start_failed", error="no such dir", host="h"), {"error": "no such dir"}),
    (_event("stopping", reason="rank 1 failed"), {"reason": "rank 1 failed"}),
    (_event("hb"), {}),
    (_event("node_exit", ranks={"0": 0, "1": None}, code=0), {"ranks": {"0": 0, "1": None}}),
]


@pytest.mark.parametrize(("payload", "expected"), VALID)
def test_valid_events_keep_the_keys_the_supervisor_reads(
    payload: bytes, expected: dict[str, Any]
) -> None:
    event = parse_event(payload)
    sent = json.loads(payload)
    assert event["event"] == sent["event"] and event["time"] == T
    for key, value in expected.items():
        assert event[key] == value, key
    assert set(sent) <= set(event)  # nothing the agent sent was lost


def test_event_accepts_str_and_drops_unknown_keys() -> None:
    event = parse_event(json.dumps({"event": "hb", "time": T, "extra": "x"}))
    assert event == {"event": "hb", "time": T}


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "Invalid JSON"),
        (b"\xff\xfe", "Invalid JSON"),
        (b'{"event": "rank_exit"', "Invalid JSON"),
        (b"[]", "object"),
        (b'"report"', "object"),
        (b'{"time": 1.0}', "no 'event'"),
        (_event("explode"), "unknown event 'explode'"),
        (_event("report", rank=0, step=1), "report: no 'type'"),
        (_event("report", type="exit", rank=0, code=0), "report: unknown type 'exit'"),
        (_event("rank_exit", rank="0", code=1), "rank_exit.rank"),
        (_event("rank_exit", rank=-1, code=1), "rank_exit.rank"),
        (_event("rank_exit", rank=0, code="1"), "rank_exit.code"),
        (_event("rank_exit", rank=0, code=1, error="str"), "rank_exit.error"),
        (_event("rank_start", rank=0, local_rank=0, pid="x"), "rank_start.pid"),
        (_event("master_ready", addr="a", port=70000), "master_ready.port"),
        (_event("master_timeout", addr="a", port=1, timeout="x"), "master_timeout.timeout"),
        (_event("node_exit", ranks=[], code=0), "node_exit.ranks"),
        (_event("node_exit", ranks={}, code=None), "node_exit.code"),
        (_event("stacks", stacks=[{"rank": 0}]), "stacks.stacks.0"),
        (_event("stacks", stacks=[{"rank": 0, "pid": 1, "method": "gdb", "text": ""}]), "method"),
        (b'{"event": "hb"}', "hb.time"),
        (b'{"event": "hb", "time": NaN}', "hb.time"),
        (b'{"event": "hb", "time": "now"}', "hb.time"),
        (_event("report", type="progress", rank=0, step=1, metrics={"a": "b"}), "metrics.a"),
        (_event("started", pid=1, pgids=[1], node_dir="x" * 70000, hostname="h"), "node_dir"),
    ],
)
def test_invalid_events_raise_one_clear_value_error(payload: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=r"^invalid agent event: ") as err:
        parse_event(payload)
    assert reason in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_forged_report_cannot_pass_as_another_event() -> None:
    # a line a rank might try: the agent forwards only validated fields, and the
    # coordinator's model of a report has no room for another event's fields
    forged = _event("report", type="progress", rank=0, step=1, code=1, event_name="node_exit")
    event = parse_event(forged)
    assert event["event"] == "report" and "code" not in event and "event_name" not in event


def test_huge_unknown_tag_is_cut_in_the_message() -> None:
    with pytest.raises(ValueError) as err:
        parse_event(_event("x" * 10_000))
    assert len(str(err.value)) < 200
