"""A job's events.jsonl: written whole and private, read back by byte offset."""

from __future__ import annotations

import itertools
import json
import stat
from pathlib import Path

from corral.job.events import Finished, LogLines, Message, StateChanged
from corral.job.result import Failure, JobResult
from corral.job.states import JobState
from corral.service.eventlog import (
    EVENTS_FILE,
    EventWriter,
    LoggedEvent,
    read_events,
    read_supervisor,
    write_supervisor,
)
from corral.service.jobs import prefixed_lines


def lines_of(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def test_writer_creates_the_file_0600_and_writes_one_line_per_event(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    writer = EventWriter(path)
    try:
        writer.on_event(Message(job_id="j", text="hello", time=1.0))
        writer.on_event(LogLines(job_id="j", host="sim1", rank=0, data=b"a\nb\n", time=2.0))
        writer.on_event(
            StateChanged(
                job_id="j", old=JobState.PENDING, state=JobState.RUNNING, attempt=1, time=3.0
            )
        )
        # flushed per event: another process sees each line at once
        assert len(path.read_bytes().splitlines()) == 3
    finally:
        writer.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    message, log, state = lines_of(path)
    assert message == {"kind": "message", "time": 1.0, "text": "hello", "level": "info"}
    assert log == {"kind": "log", "time": 2.0, "host": "sim1", "rank": 0, "text": "a\nb\n"}
    assert state["kind"] == "state"
    assert state["state"] == "running"
    assert state["old"] == "pending"
    assert state["attempt"] == 1
    assert "job_id" not in state


def test_log_bytes_that_are_not_utf8_become_text(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    writer = EventWriter(path)
    writer.on_event(LogLines(job_id="j", host="h", rank=1, data=b"caf\xe9\n"))
    writer.close()
    (log,) = lines_of(path)
    assert log["text"] == "caf\ufffd\n"


def test_finished_carries_the_result_as_json(tmp_path: Path) -> None:
    result = JobResult(
        job_id="j",
        state=JobState.FAILED,
        exit_code=1,
        nodes=[],
        failures=[
            Failure(
                host="sim2",
                rank=3,
                code=-9,
                time=5.0,
                message="rank 3 killed",
                stderr_tail=["boom"],
            )
        ],
        started=1.0,
        ended=6.0,
        reason="rank 3 on sim2 was killed",
    )
    path = tmp_path / EVENTS_FILE
    writer = EventWriter(path)
    writer.on_event(
        Finished(job_id="j", state=JobState.FAILED, exit_code=1, result=result, time=6.5)
    )
    writer.close()
    (finished,) = lines_of(path)
    assert finished["kind"] == "finished"
    assert finished["state"] == "failed"
    assert finished["exit_code"] == 1
    data = finished["result"]
    assert isinstance(data, dict)
    assert data["state"] == "failed"
    assert data["reason"] == "rank 3 on sim2 was killed"
    (failure,) = data["failures"]
    assert failure["host"] == "sim2"
    assert failure["rank"] == 3
    assert failure["signal"] == "SIGKILL"
    assert failure["stderr_tail"] == ["boom"]


def test_writer_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    for text in ("one", "two"):
        writer = EventWriter(path)
        writer.write({"kind": "message", "text": text})
        writer.close()
    assert [e.data["text"] for e in read_events(path)] == ["one", "two"]


def write_lines(path: Path, *objs: dict[str, object]) -> list[int]:
    """Append ``objs`` as lines; the byte offset where each starts."""
    starts = []
    with open(path, "ab") as fh:
        for obj in objs:
            starts.append(fh.tell())
            fh.write(json.dumps(obj).encode() + b"\n")
    return starts


def test_ids_are_byte_offsets_and_next_pos_chains_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    starts = write_lines(path, *({"kind": "message", "text": "x" * i} for i in range(1, 6)))
    events = list(read_events(path))
    assert [e.pos for e in events] == starts
    assert events[0].pos == 0
    for before, after in itertools.pairwise(events):
        assert before.next_pos == after.pos
    assert events[-1].next_pos == path.stat().st_size
    raw = path.read_bytes()
    for e in events:
        assert json.loads(raw[e.pos : e.next_pos]) == e.data


def test_reading_from_an_offset_resumes_exactly_there(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    write_lines(path, *({"kind": "message", "n": i} for i in range(10)))
    everything = list(read_events(path))
    middle = everything[4]
    rest = list(read_events(path, middle.next_pos))
    assert rest == everything[5:]
    assert list(read_events(path, everything[-1].next_pos)) == []


def test_chained_small_reads_cover_the_file_once(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    write_lines(path, *({"kind": "log", "n": i, "text": "y" * (i % 7)} for i in range(50)))
    seen: list[LoggedEvent] = []
    pos = 0
    while True:
        batch = list(read_events(path, pos, max_bytes=64))  # a few lines per read
        if not batch:
            break
        seen.extend(batch)
        pos = batch[-1].next_pos
    assert [e.data["n"] for e in seen] == list(range(50))
    assert pos == path.stat().st_size


def test_a_line_longer_than_max_bytes_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    write_lines(path, {"kind": "log", "text": "z" * 1000}, {"kind": "message", "text": "end"})
    events = list(read_events(path, 0, max_bytes=16))
    assert events[0].data["text"] == "z" * 1000
    assert events[0].next_pos == len(json.dumps({"kind": "log", "text": "z" * 1000})) + 1


def test_a_half_written_last_line_is_left_for_later(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    write_lines(path, {"kind": "message", "text": "whole"})
    line = json.dumps({"kind": "message", "text": "later"}).encode() + b"\n"
    with open(path, "ab") as fh:
        fh.write(line[:10])
    events = list(read_events(path))
    assert [e.data["text"] for e in events] == ["whole"]
    resume = events[-1].next_pos
    assert list(read_events(path, resume)) == []
    with open(path, "ab") as fh:
        fh.write(line[10:])
    (later,) = read_events(path, resume)
    assert later.data["text"] == "later"
    assert later.pos == resume
    assert later.next_pos == path.stat().st_size


def test_garbage_lines_are_skipped_but_counted_in_the_offsets(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    with open(path, "wb") as fh:
        fh.write(b'{"kind": "message", "text": "a"}\n')
        fh.write(b"{not json\n")
        fh.write(b'["a list", "not an object"]\n')
        fh.write(b"\n")
        fh.write(b'{"kind": "message", "text": "b"}\n')
    events = list(read_events(path))
    assert [e.data["text"] for e in events] == ["a", "b"]
    assert events[1].pos == path.read_bytes().rindex(b'{"kind"')
    assert events[1].next_pos == path.stat().st_size


def test_reading_a_missing_file_yields_nothing(tmp_path: Path) -> None:
    assert list(read_events(tmp_path / "nope.jsonl")) == []
    assert list(read_events(tmp_path / "nope.jsonl", 100)) == []


def test_supervisor_record_round_trips(tmp_path: Path) -> None:
    assert read_supervisor(tmp_path) is None
    write_supervisor(tmp_path, 1234, 99.5)
    assert read_supervisor(tmp_path) == (1234, 99.5)
    assert stat.S_IMODE((tmp_path / "supervisor.json").stat().st_mode) == 0o600
    (tmp_path / "supervisor.json").write_text("{broken")
    assert read_supervisor(tmp_path) is None


# -- the merged output's lines -------------------------------------------------------------


def test_prefixed_lines_prefix_every_line_with_host_and_rank() -> None:
    data = {"kind": "log", "host": "sim1", "rank": 0, "text": "one\ntwo\n"}
    assert prefixed_lines(data) == ["[sim1:0] one", "[sim1:0] two"]


def test_prefixed_lines_of_the_nodes_own_output_have_no_rank() -> None:
    data = {"kind": "log", "host": "sim2", "rank": -1, "text": "torchrun says\n"}
    assert prefixed_lines(data) == ["[sim2] torchrun says"]


def test_prefixed_lines_normalise_crlf_and_keep_a_progress_update() -> None:
    assert prefixed_lines({"host": "h", "rank": 2, "text": "a\r\nb\r\n"}) == [
        "[h:2] a",
        "[h:2] b",
    ]
    # a chunk ending in \r (a progress bar) is one line, its trailing blank stripped
    assert prefixed_lines({"host": "h", "rank": 1, "text": "50%|##   |\r"}) == ["[h:1] 50%|##   |"]


def test_prefixed_lines_of_empty_text_are_none() -> None:
    assert prefixed_lines({"host": "h", "rank": 0, "text": ""}) == []
    assert prefixed_lines({"host": "h", "rank": 0, "text": "\n"}) == ["[h:0] "]


def test_every_written_event_decodes_back_to_its_typed_model(tmp_path: Path) -> None:
    from corral.job.events import (
        AttemptEnded,
        AttemptStarted,
        NodeChanged,
        Progress,
        RankExited,
        decode_event,
    )
    from corral.job.states import NodeState
    from corral.service.eventlog import event_json

    events = [
        Message(job_id="j", text="hello", level="warning", time=1.0),
        StateChanged(job_id="j", old=JobState.PENDING, state=JobState.PREPARING, time=2.0),
        NodeChanged(job_id="j", host="h", state=NodeState.RUNNING, detail="2 ranks", time=3.0),
        RankExited(job_id="j", host="h", rank=1, code=-15, last=True, time=4.0),
        Progress(job_id="j", host="h", rank=0, step=3, total=9, metrics={"loss": 0.5}, time=5.0),
        AttemptStarted(job_id="j", number=1, hosts=["h"], world_size=2, time=6.0),
        AttemptEnded(job_id="j", number=1, record={"cause": "x"}, restart=True, time=7.0),
        LogLines(job_id="j", host="h", rank=0, data=b"line\n", time=8.0),
    ]
    for event in events:
        assert decode_event(json.loads(json.dumps(event_json(event))), "j") == event
    assert decode_event({"kind": "node", "state": "running"}, "j") is None  # no host
    assert decode_event({"kind": "newer"}, "j") is None
