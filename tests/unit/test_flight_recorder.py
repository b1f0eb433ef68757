"""The flight recorder's plumbing: the names the rank's torch reads, dumps asked for
and answered late (the way NCCL answers its pipe), the rank wrapper's own answers,
and a report that always says what the dumps show or why there are none."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path

from corral.agent.events import parse_event
from corral.agent.flight import BUFFER_SIZE, request_file, torch_env, trace_wait
from corral.agent.spawn import flight_recorder_env
from corral.agent.stacks import collect_traces
from corral.diagnose.hangreport import write_hang_report
from corral.diagnose.hangs import FlightFinding, read_flight_recorder, render_markdown
from tests.conftest import require_torch
from tests.unit.test_diagnose_hangs import _entry, _in_all_reduce, _write_dumps

_OLD = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
_NEW = ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE")


def test_the_names_are_the_ones_the_installed_torch_reads(tmp_path: Path) -> None:
    folder = tmp_path / "flight"
    new = torch_env(folder, {}, (2, 13))
    assert new == {
        "TORCH_FR_BUFFER_SIZE": str(BUFFER_SIZE),
        "TORCH_FR_DUMP_TEMP_FILE": f"{folder}/rank_",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{folder}/pipe_",
        "TORCH_INCLUDE_STACK_TRACE": "0",  # the watchdog's dump: no stack symbolisation
    }
    old = torch_env(folder, {}, (2, 7))
    assert set(_OLD) <= old.keys() and not set(_NEW) & old.keys()
    between = torch_env(folder, {}, (2, 9))
    assert {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"} <= between.keys()
    # a variable the user set, under either name, is theirs
    users = torch_env(
        folder, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_INCLUDE_STACK_TRACE": "1"}, (2, 13)
    )
    assert not {"TORCH_FR_BUFFER_SIZE", *_OLD[:1], "TORCH_INCLUDE_STACK_TRACE"} & users.keys()
    assert users["TORCH_FR_DUMP_TEMP_FILE"] == f"{folder}/rank_"


def test_the_torch_version_is_read_without_importing_torch(tmp_path: Path) -> None:
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('torch was imported')\n")
    (package / "version.py").write_text("__version__ = '2.7.1+cu126'\ncuda = '12.6'\n")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from corral.agent.flight import installed_torch_version as v;"
            " print(v(), 'torch' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{os.getcwd()}/src"},
        timeout=60,
    )
    assert done.stdout.split("\n")[0] == "(2, 7) False", done.stdout + done.stderr


def test_the_agent_gives_the_folder_and_torch_names_only_without_the_wrapper(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "flight"
    assert flight_recorder_env(tmp_path, {}) == {"CORRAL_FLIGHT_DIR": str(folder)}
    assert folder.stat().st_mode & 0o777 == 0o700
    wrapped = ["python", "-u", "-m", "corral.agent.worker", "train.py"]
    assert flight_recorder_env(tmp_path, {}, wrapped) == {"CORRAL_FLIGHT_DIR": str(folder)}
    bare = flight_recorder_env(tmp_path, {}, ["bash", "-c", "torchrun train.py"])
    assert bare["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == f"{folder}/pipe_"
    assert {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} & bare.keys()
    assert flight_recorder_env(tmp_path, {"CORRAL_FLIGHT_RECORDER": "0"}) == {}


def test_the_wait_is_the_jobs_and_a_bad_one_is_named() -> None:
    assert trace_wait({}) == 15.0
    assert trace_wait({"CORRAL_TRACE_WAIT": "40"}) == 40.0
    for bad in ("soon", "0", "-3", "nan", "1e9"):
        try:
            trace_wait({"CORRAL_TRACE_WAIT": bad})
        except ValueError as exc:
            assert "CORRAL_TRACE_WAIT" in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")


def _dump(count: int, ranks: str = "[0, 1, 2]") -> bytes:
    return pickle.dumps(
        {
            "version": "2.10",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
            "pg_status": {},
            "entries": [
                _entry(i, i + 1, "completed" if i < 4 else "scheduled") for i in range(count)
            ],
        }
    )


def _fake_nccl_rank(folder: Path, rank: int, data: bytes, delay: float) -> threading.Thread:
    """A rank's ProcessGroupNCCL: it polls its pipe and, asked, writes its dump in two
    parts ``delay`` seconds apart (a symbolising dump is slow and not written whole)."""
    pipe = folder / f"pipe_{rank}.pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)

    def answer() -> None:
        try:
            for _ in range(3000):
                try:
                    if os.read(reader, 16):
                        break
                except BlockingIOError:
                    pass
                threading.Event().wait(0.01)
            else:
                return
            with open(folder / f"rank_{rank}", "wb") as out:
                out.write(data[: len(data) // 2])
                out.flush()
                threading.Event().wait(delay)
                out.write(data[len(data) // 2 :])
        finally:
            os.close(reader)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def test_dumps_answered_late_through_the_pipe_reach_the_report(tmp_path: Path) -> None:
    require_torch()
    folder = tmp_path / "flight"
    folder.mkdir()
    dumps = {0: _dump(5), 1: _dump(5), 2: _dump(4)}  # rank 2 never entered all_reduce #5
    # rank 1 answers later than corral's old 3 s bound, each dump is written in parts
    ranks = [_fake_nccl_rank(folder, r, d, 4.0 if r == 1 else 0.3) for r, d in dumps.items()]
    traces, errors = collect_traces([0, 1, 2], tmp_path)
    for thread in ranks:
        thread.join(10)
    assert errors == {}
    assert {r: base64.b64decode(t) for r, t in traces.items()} == dumps
    report, path = write_hang_report(
        tmp_path / "hang", "m", {("h", 0): _in_all_reduce()}, {}, traces, errors
    )
    assert path is not None and report["flight_recorder_error"] is None
    flight = report["flight_recorder"]
    assert (flight["collective"], flight["sequence"], flight["missing_ranks"]) == (
        "nccl:all_reduce",
        5,
        [2],
    )
    on_disk = json.loads((tmp_path / "hang" / "report.json").read_text())
    assert on_disk["flight_recorder"] == flight
    assert [r["rank"] for r in on_disk["last_collectives"]] == [0, 1, 2]


def test_the_wrapper_answers_for_itself_and_the_report_says_why_there_is_no_dump(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "flight"
    folder.mkdir()
    stale = [folder / "corral_rank_3", folder / "rank_3"]  # an earlier attempt's dumps
    for path in stale:
        path.write_bytes(_dump(2))
    rank = subprocess.Popen(  # a rank under the wrapper's listener that never imported torch
        [
            sys.executable,
            "-c",
            "import sys, time; from corral.agent import flight;"
            " flight.listen(sys.argv[1], 3); print('ready', flush=True); time.sleep(120)",
            str(folder),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "ready\n"
        assert not [path for path in stale if path.exists()]
        traces, errors = collect_traces([3, 4], tmp_path)
    finally:
        rank.kill()
        rank.wait()
    assert traces == {}
    assert errors[3] == "rank 3: the rank never imported torch"
    assert "rank 4 answers no dump request" in errors[4]
    # a listener that never answers: the bound, and how to raise it
    os.mkfifo(request_file(folder, 5))
    silent = os.open(request_file(folder, 5), os.O_RDWR)
    try:
        _, late = collect_traces([5], tmp_path, wait=0.3)
    finally:
        os.close(silent)
    assert late == {
        5: "no flight recorder dump from rank 5 within 0.3 s of the request"
        " (a longer wait: --env CORRAL_TRACE_WAIT=S)"
    }
    _, off = collect_traces([0], tmp_path / "elsewhere")
    assert "CORRAL_FLIGHT_RECORDER=0" in off[0]

    report, _ = write_hang_report(None, "m", {("h", 3): _in_all_reduce()}, {}, {}, errors)
    assert report["flight_recorder"] is None
    assert report["flight_recorder_error"] == (
        "no flight recorder dump arrived: rank 3: the rank never imported torch; " + errors[4]
    )
    assert "- no finding: no flight recorder dump arrived" in render_markdown(report)


def test_matched_dumps_still_show_each_ranks_last_collectives(tmp_path: Path) -> None:
    require_torch()
    traces = {r: base64.b64encode(_dump(4)).decode() for r in (0, 1, 2)}
    report, _ = write_hang_report(tmp_path, "m", {("h", 0): _in_all_reduce()}, {}, traces)
    assert report["flight_recorder"] is None and report["flight_recorder_error"] is None
    last = {r["rank"]: r["entries"] for r in report["last_collectives"]}
    assert sorted(last) == [0, 1, 2]
    assert [(e["op"], e["seq"], e["state"]) for e in last[0][-2:]] == [
        ("nccl:all_reduce", 3, "completed"),
        ("nccl:all_reduce", 4, "completed"),
    ]
    assert last[0][0]["input_sizes"] == [[4]] and last[0][0]["group"] == "0:default_pg"
    markdown = render_markdown(report)
    assert "every recorded collective was entered by every rank of its group" in markdown
    assert "| 2 | 4 | `nccl:all_reduce` | completed | 4 | 4 | `0:default_pg` |" in markdown


def test_a_gloo_dump_with_an_unnamed_group_is_read(tmp_path: Path) -> None:
    """torch 2.13's gloo recorder lists the default group under "" in pg_config."""
    require_torch()
    _write_dumps(tmp_path, {0: 5, 1: 4})
    for path in tmp_path.glob("rank_*"):
        dump = pickle.loads(path.read_bytes())
        dump["pg_config"] = {"": {"name": "", "desc": "", "ranks": "[0, 1]"}}
        path.write_bytes(pickle.dumps(dump))
    finding, last = read_flight_recorder(tmp_path)
    assert finding is not None
    assert (finding.sequence, finding.missing_ranks) == (5, [1])
    assert len(last[0]) == 5 and len(last[1]) == 4


def test_a_rank_in_another_collective_is_named_with_it() -> None:
    finding = FlightFinding(
        "gloo:all_reduce",
        12,
        "0:default_pg",
        "scheduled",
        [],
        [0, 1, 2],
        mismatched=[{"rank": 2, "collective": "gloo:barrier"}],
    )
    assert finding.message() == (
        "gloo:all_reduce #12 (group 0:default_pg, scheduled): rank 2 was in gloo:barrier #12"
        " instead"
    )


def test_the_agents_event_carries_the_dump_and_why_there_is_none() -> None:
    event = {
        "event": "stacks",
        "time": 1.0,
        "stacks": [
            {"rank": 0, "pid": 5, "method": "py-spy", "text": "x", "trace": "AAEC"},
            {"rank": 1, "pid": 6, "method": "none", "text": "", "trace_error": "rank 1: off"},
        ],
    }
    parsed = parse_event(json.dumps(event))
    assert parsed["stacks"][0]["trace"] == "AAEC"
    assert parsed["stacks"][1]["trace_error"] == "rank 1: off"


def test_torchs_analyser_runs_without_loading_libtorch(tmp_path: Path) -> None:
    """The analysis (its own process) loads torch's analyser files, not libtorch:
    seconds of a busy coordinator's CPU before the report otherwise."""
    require_torch()
    _write_dumps(tmp_path, {0: 5, 1: 5, 2: 4})
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys; from corral.diagnose.frtrace import analyse;"
            " print(json.dumps([analyse(sys.argv[1])['finding'], 'torch._C' in sys.modules]))",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    finding, loaded = json.loads(done.stdout)
    assert (finding["sequence"], finding["missing_ranks"], loaded) == (5, [2], False)


def test_a_job_with_a_bad_wait_is_refused_before_it_starts() -> None:
    from corral.errors import ConfigError
    from corral.job.build import job_spec
    from corral.job.describe import JobOptions

    assert job_spec(JobOptions(command=("t.py",), env={"CORRAL_TRACE_WAIT": "30"}))
    try:
        job_spec(JobOptions(command=("t.py",), env={"CORRAL_TRACE_WAIT": "soon"}))
    except ConfigError as exc:
        assert "CORRAL_TRACE_WAIT='soon'" in str(exc) and exc.option == "--env"
    else:
        raise AssertionError("a bad CORRAL_TRACE_WAIT was accepted")
