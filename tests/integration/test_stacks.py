"""Stack dumps of real ranks: py-spy, and the faulthandler fallback the SDK registers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from corral.agent import stacks
from corral.agent.stacks import StackDump, dump_event, dump_stack, dump_stacks, hang_file
from corral.recovery.hang import classify, parse_stack, top_frames

SLEEPER = """\
import sys
import time
{setup}

def step():
    time.sleep(3600)  # SLEEP_LINE


def main():
    open(sys.argv[1], "w").close()
    step()


main()
"""
SDK_SETUP = "from corral import sdk\nprint('registered', sdk.enable_stack_dumps(), flush=True)"

Start = Callable[..., subprocess.Popen[bytes]]


def _sleep_line(script: Path) -> int:
    lines = script.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if "SLEEP_LINE" in line)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start a sleeping script (under corral's worker, or plain python); kill it after."""
    procs: list[subprocess.Popen[bytes]] = []

    def _start(
        rank: int, *, worker: bool = True, setup: str = "", name: str = "train.py"
    ) -> subprocess.Popen[bytes]:
        script = tmp_path / name
        script.write_text(SLEEPER.format(setup=setup))
        ready = tmp_path / f"ready-{rank}"
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="8")
        env["CORRAL_NODE_DIR"] = str(tmp_path / "node")
        env.pop("CORRAL_CONTROL", None)
        prefix = [sys.executable, "-m", "corral.agent.worker"] if worker else [sys.executable]
        proc = subprocess.Popen(
            [*prefix, str(script), str(ready)],
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        procs.append(proc)
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, f"the script exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the script never got to step()"
            time.sleep(0.05)
        # From the ready file into time.sleep: its main thread blocks (state S) only there.
        main_thread = psutil.Process(proc.pid)
        while main_thread.status() != psutil.STATUS_SLEEPING:
            assert proc.poll() is None, f"the script exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the script never blocked in step()"
            time.sleep(0.01)
        return proc

    yield _start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture
def no_py_spy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacks, "find_py_spy", lambda: None)


def node_dir(tmp_path: Path) -> Path:
    return tmp_path / "node"


def assert_in_step(dump: StackDump, script: Path) -> None:
    frames = parse_stack(dump.text)
    assert frames, dump
    assert frames[0].function == "step"
    assert frames[0].line == _sleep_line(script)
    assert Path(frames[0].file).name == script.name
    assert frames[1].function == "main"


def test_py_spy_dumps_a_worker_rank(tmp_path: Path, start: Start) -> None:
    assert stacks.find_py_spy() is not None, "py-spy is a dependency of corral"
    proc = start(3)
    dump = dump_stack(proc.pid, 3, node_dir(tmp_path))
    assert dump.method == "py-spy", dump.error
    assert dump.error is None and dump.rank == 3 and dump.pid == proc.pid
    assert_in_step(dump, tmp_path / "train.py")
    line = _sleep_line(tmp_path / "train.py")
    assert top_frames(dump.text, 1) == [f"step (train.py:{line})"]
    assert proc.poll() is None  # py-spy let it run on


def test_faulthandler_fallback_without_py_spy(
    tmp_path: Path, start: Start, no_py_spy: None
) -> None:
    proc = start(3)
    stack_file = node_dir(tmp_path) / "stacks" / "rank-3.txt"
    assert stack_file.exists()  # registered by the worker at start
    first = dump_stack(proc.pid, 3, node_dir(tmp_path))
    assert first.method == "faulthandler", first.error
    assert first.error == "py-spy not found"
    assert_in_step(first, tmp_path / "train.py")
    assert first.text.count("most recent call first") == 1
    # A second dump returns only what the handler wrote this time.
    second = dump_stack(proc.pid, 3, node_dir(tmp_path))
    assert second.method == "faulthandler" and second.text == first.text
    assert proc.poll() is None  # the signal did not kill it


def test_fallback_when_py_spy_fails(
    tmp_path: Path, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = tmp_path / "py-spy"
    failing.write_text(
        "#!/bin/sh\necho 'Error: Operation not permitted (os error 1)' >&2\nexit 1\n"
    )
    failing.chmod(0o755)
    monkeypatch.setattr(stacks, "find_py_spy", lambda: str(failing))
    proc = start(0)
    dump = dump_stack(proc.pid, 0, node_dir(tmp_path))
    assert dump.method == "faulthandler"
    assert dump.error == "py-spy: Operation not permitted (os error 1)"
    assert_in_step(dump, tmp_path / "train.py")


def test_sdk_registration_without_the_worker(tmp_path: Path, start: Start, no_py_spy: None) -> None:
    proc = start(5, worker=False, setup=SDK_SETUP, name="plain.py")
    assert "torch" not in (tmp_path / "plain.py").read_text()
    dump = dump_stack(proc.pid, 5, node_dir(tmp_path))
    assert dump.method == "faulthandler", dump.error
    assert_in_step(dump, tmp_path / "plain.py")


def test_a_process_without_a_handler_is_not_signalled(
    tmp_path: Path, start: Start, no_py_spy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = start(1, worker=False)  # plain python: SIGUSR1 would kill it
    sent: list[tuple[int, int]] = []
    real_kill = os.kill

    def kill(pid: int, signum: int) -> None:
        sent.append((pid, signum))
        real_kill(pid, signum)

    monkeypatch.setattr(os, "kill", kill)
    dump = dump_stack(proc.pid, 1, node_dir(tmp_path))
    assert dump.method == "none" and dump.text == ""
    assert dump.error is not None and "SIGUSR1 not caught" in dump.error
    assert (proc.pid, signal.SIGUSR1) not in sent
    assert proc.poll() is None


def test_a_dead_process(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dump = dump_stack(proc.pid, 0, tmp_path)
    assert dump.method == "none" and "not running" in (dump.error or "")


def test_dump_stacks_keeps_files_on_the_node(tmp_path: Path, start: Start) -> None:
    procs = {rank: start(rank).pid for rank in (0, 1)}
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    procs[2] = gone.pid
    dumps = dump_stacks(procs, node_dir(tmp_path), timeout=30)
    assert [d.rank for d in dumps] == [0, 1, 2]
    assert [d.method for d in dumps] == ["py-spy", "py-spy", "none"]
    for dump in dumps[:2]:
        kept = hang_file(node_dir(tmp_path), dump.rank).read_text()
        assert parse_stack(kept)[0].function == "step"
    kept = hang_file(node_dir(tmp_path), 2).read_text()
    assert kept.startswith("# corral: no stack dump of rank 2: process ")
    assert classify({("h", d.rank): d.text for d in dumps}) == ([("h", 0), ("h", 1)], [])


def test_dump_event(tmp_path: Path, start: Start, no_py_spy: None) -> None:
    proc = start(4)
    event = asyncio.run(dump_event({4: proc.pid}, node_dir(tmp_path), 10.0))
    assert list(event) == ["stacks"]
    (entry,) = json.loads(json.dumps(event))["stacks"]
    assert set(entry) == {"rank", "pid", "method", "text", "error", "trace", "trace_error"}
    assert entry["trace"] is None  # this node has no flight folder: the report says why
    assert entry["trace_error"].startswith("the flight recorder is off on this node")
    assert entry["rank"] == 4 and entry["pid"] == proc.pid and entry["method"] == "faulthandler"
    back = StackDump.from_json(entry)
    assert parse_stack(back.text)[0].function == "step"


def test_dump_event_cuts_long_texts(
    tmp_path: Path, start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = start(0)
    monkeypatch.setattr(stacks, "EVENT_TEXT_LIMIT", 40)
    event = asyncio.run(dump_event({0: proc.pid}, node_dir(tmp_path), 10.0))
    text = event["stacks"][0]["text"]
    assert text.startswith("Process ") and "cut to 40 characters" in text
    assert str(hang_file(node_dir(tmp_path), 0)) in text
    assert "step" in hang_file(node_dir(tmp_path), 0).read_text()


def test_enable_stack_dumps_is_idempotent(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import os, signal, sys
        from corral import sdk
        first = sdk.enable_stack_dumps()
        assert sdk.enable_stack_dumps() == first, "same path twice"
        other = sdk.enable_stack_dumps(os.path.join(os.environ["CORRAL_NODE_DIR"], "x.txt"))
        signal.raise_signal(signal.SIGUSR1)  # handled (the dump written) before it returns
        print(first, other, os.path.getsize(first), os.path.getsize(other))
        """
    )
    env = dict(os.environ, RANK="2", CORRAL_NODE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    first, other, first_size, other_size = done.stdout.split()
    assert first == str(tmp_path / "stacks" / "rank-2.txt")
    assert other == str(tmp_path / "x.txt")
    assert first_size == "0" and int(other_size) > 0  # the handler moved to the new file

    env.pop("CORRAL_NODE_DIR")
    code = "from corral import sdk; print(sdk.enable_stack_dumps())"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "None"  # not under corral: nothing registered
