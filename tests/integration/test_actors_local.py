"""corral.actors with real worker processes on this machine (``local:N``).

The work functions live in a module written to ``tmp_path`` (as a user's code
would be a file of their own); processes are found by the job id
every worker (and its children) carries in its environment (``CORRAL_JOB_ID``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from corral.actors import (
    ActorGroupError,
    ActorStartError,
    ActorTimeout,
    Cluster,
    NodeConfig,
    RemoteError,
    Worker,
    WorkerDied,
    WorkerRestarted,
    _cluster,
)
from corral.job.states import JobState
from corral.recovery.restart import RestartPolicy

from .conftest import job_processes, wait_no_job_processes

WORK = textwrap.dedent(
    """
    import hashlib, os, subprocess, sys, time

    def echo(handle):
        while True:
            msg = handle.recv()
            if msg == "env":
                keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                        "MASTER_ADDR", "MASTER_PORT", "CORRAL_ACTOR", "NCCL_SOCKET_IFNAME")
                handle.send({k: os.environ.get(k) for k in keys})
            elif isinstance(msg, tuple) and msg[0] == "getenv":
                handle.send(os.environ.get(msg[1]))
            elif msg == "pid":
                handle.send(os.getpid())
            elif isinstance(msg, tuple) and msg[0] == "busy":  # ("busy", die, fast, seconds)
                if handle.rank == msg[1]:
                    os.kill(os.getpid(), 9)
                if handle.rank != msg[2]:
                    time.sleep(msg[3])
                handle.send(("busy", handle.rank))
            elif msg == "boom":
                raise ValueError("boom from rank %d" % handle.rank)
            elif msg == "child":
                child = subprocess.Popen(["sleep", "600"])
                handle.send(child.pid)
            elif msg == "forge":  # another process on the host, without the token
                import socket
                name = os.environ["CORRAL_CONTROL"].split("@", 1)[1]
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect("\\0" + name)
                    s.sendall(b"auth wrong-token\\n")
                    s.sendall(b'{"kind": "progress", "step": 666, "total": 667}\\n')
                handle.send("forged")
            elif msg == "report":
                from corral import sdk
                sdk.report(7, 10, loss=0.5)
                handle.send("reported")
            elif isinstance(msg, bytes):
                handle.send((len(msg), hashlib.sha256(msg).hexdigest(), msg))
            else:
                print("got", msg, flush=True)
                handle.send((handle.rank, msg))

    def silent(handle):
        time.sleep(600)

    def returns(handle):
        detached = subprocess.Popen(["sleep", "600"], start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return {"rank": handle.rank, "child": detached.pid}
    """
)


def gone(pid: int, within: float) -> bool:
    """Whether process ``pid`` is gone (or a zombie) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The work module, imported here from ``tmp_path`` (workers load it by its path)."""
    name = f"actor_work_{os.getpid()}_{int(time.monotonic() * 1e6)}"
    (tmp_path / f"{name}.py").write_text(WORK)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    yield module
    sys.modules.pop(name, None)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """``local:2`` with 2 workers per node; stopped (and checked empty) afterwards."""
    c = Cluster.from_hosts("local:2", workers_per_host=2, run_dir=tmp_path / "runs")
    try:
        yield c
    finally:
        c.stop(grace=1)
        assert wait_no_job_processes(c.job_id, 10) == []


def test_round_trip_ranks_and_env(cluster: Cluster, work: ModuleType, tmp_path: Path) -> None:
    workers = cluster.start(work.echo, wait_time=60)
    assert [(w.host, w.rank, w.local_rank, w.node_rank) for w in workers] == [
        ("local-0", 0, 0, 0),
        ("local-0", 1, 1, 0),
        ("local-1", 2, 0, 1),
        ("local-1", 3, 1, 1),
    ]
    assert all(w.alive for w in workers)
    assert cluster.call("hi", timeout=30) == [(r, "hi") for r in range(4)]
    envs = cluster.call("env", timeout=30)
    port = str(cluster.nccl_configs()[0].master_port)
    for rank, env in enumerate(envs):
        assert env["RANK"] == str(rank)
        assert env["LOCAL_RANK"] == str(rank % 2)
        assert env["NODE_RANK"] == str(rank // 2)
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("4", "2")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", port)
        assert env["CORRAL_ACTOR"] == "1"
        assert env["NCCL_SOCKET_IFNAME"] == "lo"  # detected toward 127.0.0.1
    workers[3].send({"n": 1})
    assert workers[3].recv(timeout=30) == (3, {"n": 1})
    assert not workers[0].poll()
    # stderr is streamed to per-worker log files, private to the user
    log_dir = cluster.log_dir
    assert log_dir is not None
    log = log_dir / "local-1.3.log"
    deadline = time.monotonic() + 10
    while "got {'n': 1}" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "worker output never reached its log file"
        time.sleep(0.1)
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_100_mb_message_both_ways(work: ModuleType) -> None:
    payload = os.urandom(1 << 20) * 100
    with Worker(work.echo) as worker:
        worker.send(payload)
        size, digest, back = worker.recv(timeout=120)
    assert size == len(payload) == 100 << 20
    assert digest == hashlib.sha256(payload).hexdigest()
    assert back == payload


def test_sigkill_of_a_worker_is_named_at_once_and_stop_leaves_nothing(
    cluster: Cluster, work: ModuleType
) -> None:
    workers = cluster.start(work.echo, wait_time=60)
    pids = cluster.call("pid", timeout=30)
    assert [w.pid for w in workers] == pids
    workers[1].send("child")
    child = workers[1].recv(timeout=30)
    start = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(WorkerDied) as info:
        workers[1].recv(timeout=30)
    assert time.monotonic() - start < 2.0
    err = info.value
    assert (err.host, err.rank, err.signal_name) == ("local-0", 1, "SIGKILL")
    assert "[local-0:1]" in str(err) and "SIGKILL" in str(err)
    assert not workers[1].alive
    with pytest.raises(WorkerDied):  # it stays dead, and sending says so too
        workers[1].send("x")
    assert gone(child, 5)
    with pytest.raises(ActorGroupError) as group:
        cluster.call("again", timeout=30)
    assert list(group.value.errors) == [1]
    assert group.value.results == {0: (0, "again"), 2: (2, "again"), 3: (3, "again")}
    assert "[local-0:1]" in str(group.value)
    cluster.stop(grace=5)
    assert wait_no_job_processes(cluster.job_id, 5) == []


def test_a_late_answer_to_a_failed_call_never_answers_a_later_request(
    cluster: Cluster, work: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers busy in a call, one SIGKILLed: the call fails naming it first with the
    time really waited, and the others' late answers reach no later ``recv``."""
    monkeypatch.setattr(_cluster, "GROUP_GRACE", 0.2)  # the survivors' grace, shortened
    workers = cluster.start(work.echo, wait_time=60)
    with pytest.raises(ActorGroupError) as info:
        cluster.call(("busy", 1, 3, 3.0), timeout=60)  # rank 1 dies, 3 answers at once
    error = info.value
    assert (error.host, error.rank) == ("local-0", 1)
    headline = str(error).splitlines()[0]
    assert (
        headline == "[local-0:1] call failed on 3 worker(s): [local-0:1], [local-0:0], [local-1:2]"
    )
    assert error.results == {3: ("busy", 3)}
    assert isinstance(error.errors[0], ActorTimeout) and error.errors[0].waited < 60
    assert "within 60" not in str(error) and "after [local-0:1] failed" in str(error)
    for rank in (0, 2):  # still busy with the call; their answer to it must be dropped
        workers[rank].send("pid")
        assert workers[rank].recv(timeout=30) == workers[rank].pid
    workers[3].send("hi")  # the one that answered in time has nothing left over either
    assert workers[3].recv(timeout=30) == (3, "hi")


STDIN_COORDINATOR = textwrap.dedent(
    """
    from corral.actors import Cluster
    from corral.errors import ConfigError

    def work(handle):
        handle.send("never")

    cluster = Cluster.from_hosts("local:1", run_dir=None)
    try:
        cluster.start(work, wait_time=60)
    except ConfigError as exc:
        print("refused:", exc)
    print("started:", bool(cluster.workers))
    """
)


def test_a_work_fn_read_from_stdin_is_refused_before_anything_starts() -> None:
    proc = subprocess.run(
        [sys.executable, "-"], input=STDIN_COORDINATOR, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused: work_fn: <function work" in proc.stdout
    assert "no file (its code came from '<stdin>'" in proc.stdout
    assert "define it in a module" in proc.stdout
    assert "started: False" in proc.stdout


COORDINATOR = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, sys.argv[1])
    from corral.actors import Cluster
    from {module} import echo

    cluster = Cluster.from_hosts("local:2", workers_per_host=2, run_dir=None)
    workers = cluster.start(echo, wait_time=60)
    for w in workers:
        w.send("child")
        w.recv(timeout=30)
    print(cluster.job_id, flush=True)
    sys.stdin.read()
    """
)


@contextlib.contextmanager
def coordinator(script: Path, *args: str) -> Iterator[str]:
    """Run a coordinator script that prints its cluster's job id once its workers are
    up; yields the id, then SIGKILLs the coordinator."""
    errors = script.with_suffix(".stderr")
    with errors.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        assert proc.stdout is not None
        job_id = proc.stdout.readline().strip()
        assert job_id, f"the coordinator did not start its workers: {errors.read_text()}"
        yield job_id
    finally:
        proc.kill()
        proc.wait()


def test_a_sigkilled_coordinator_leaves_no_worker(tmp_path: Path, work: ModuleType) -> None:
    script = tmp_path / "coordinator.py"
    script.write_text(COORDINATOR.format(module=work.__name__))
    with coordinator(script, str(tmp_path)) as job_id:
        assert len(job_processes(job_id)) == 8  # 4 workers, 4 children
    assert wait_no_job_processes(job_id, 20) == []


def test_an_exception_in_work_fn_is_a_remote_error(cluster: Cluster, work: ModuleType) -> None:
    workers = cluster.start(work.echo, wait_time=60)
    workers[2].send("boom")
    with pytest.raises(RemoteError) as info:
        workers[2].recv(timeout=30)
    err = info.value
    assert (err.host, err.rank, err.type_name) == ("local-1", 2, "ValueError")
    assert err.remote_message == "boom from rank 2"
    assert "Traceback (most recent call last)" in err.traceback
    assert 'raise ValueError("boom from rank %d" % handle.rank)' in err.traceback
    assert "boom from rank 2" in str(err)
    with pytest.raises(WorkerDied) as died:
        workers[2].recv(timeout=30)
    assert died.value.exit_code == 1
    assert "ValueError: boom from rank 2" in died.value.stderr_tail
    workers[0].send("ok")
    assert workers[0].recv(timeout=30) == (0, "ok")


def test_recv_timeout_on_a_silent_worker(work: ModuleType) -> None:
    with Worker(work.silent) as worker:
        start = time.monotonic()
        with pytest.raises(ActorTimeout) as info:
            worker.recv(timeout=1)
        assert 0.9 <= time.monotonic() - start < 5
        assert (info.value.host, info.value.rank) == ("local", 0)
        assert worker.alive


def test_stop_wakes_a_worker_waiting_in_recv(work: ModuleType) -> None:
    worker = Worker(work.echo)
    pid = worker.pid
    start = time.monotonic()
    worker.stop(grace=30)
    assert time.monotonic() - start < 10  # it stopped on request, not at the kill
    assert not worker.alive
    with pytest.raises(WorkerDied) as info:
        worker.recv(timeout=1)
    assert info.value.exit_code == 0
    assert pid is not None and gone(pid, 5)


def test_work_fn_forms(tmp_path: Path, work: ModuleType) -> None:
    name = work.__name__
    file_form = f"{tmp_path / (name + '.py')}:echo"
    for form in (work.echo, f"{name}.echo", f"{name}:echo", file_form):
        with Worker(form, workdir=str(tmp_path), echo=False) as worker:
            worker.send("x")
            assert worker.recv(timeout=30) == (0, "x"), form


def test_work_fn_return_value_and_clean_exit(work: ModuleType) -> None:
    worker = Worker(work.returns)
    with pytest.raises(WorkerDied) as info:
        worker.recv(timeout=30)
    assert info.value.exit_code == 0 and "returned" in str(info.value)
    assert worker.result["rank"] == 0
    assert gone(worker.result["child"], 10)  # in a session of its own, yet reaped
    worker.stop()


def test_a_missing_work_fn_fails_start_naming_every_worker(tmp_path: Path) -> None:
    cluster = Cluster.from_hosts("local:2", run_dir=None, echo=False)
    with pytest.raises(ActorStartError) as info:
        cluster.start("no_such_module_xyz.work", wait_time=60)
    assert sorted(info.value.errors) == [0, 1]
    assert "[local-0:0]" in str(info.value) and "[local-1:1]" in str(info.value)
    assert "ModuleNotFoundError" in str(info.value)
    assert wait_no_job_processes(cluster.job_id, 10) == []


def test_restart_after_a_worker_death(work: ModuleType) -> None:
    with Worker(work.echo, max_restarts=1) as worker:
        first = worker.pid
        assert first is not None
        worker.send(("getenv", "CORRAL_ATTEMPT"))
        assert worker.recv(timeout=30) == "0"
        os.kill(first, signal.SIGKILL)
        with pytest.raises(WorkerRestarted) as info:
            worker.recv(timeout=30)
        assert info.value.restarts == 1 and info.value.signal_name == "SIGKILL"
        worker.send(("getenv", "CORRAL_ATTEMPT"))  # the next attempt, as the engine counts
        assert worker.recv(timeout=30) == "1"
        assert worker.restarted and worker.restarts == 1
        # told once the new process said hello: the handle already shows it (it showed
        # the dead one's pid until the hello came, a race lost on a busy machine)
        second = worker.pid
        assert second is not None and second != first
        worker.send("pid")
        assert worker.recv(timeout=30) == second
        os.kill(second, signal.SIGKILL)
        with pytest.raises(WorkerDied) as final:  # the budget is spent
            worker.recv(timeout=30)
        assert not isinstance(final.value, WorkerRestarted)


def test_a_restart_that_fails_before_its_hello_is_told_first_and_shows_no_pid(
    work: ModuleType, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with Worker(work.echo, workdir=str(home), max_restarts=1) as worker:
        first = worker.pid
        assert first is not None
        home.rmdir()  # the new process fails in it before its hello, with a start error
        os.kill(first, signal.SIGKILL)
        with pytest.raises(WorkerRestarted):
            worker.recv(timeout=30)
        assert worker.pid is None  # not the dead one's: no process said hello since
        with pytest.raises(RemoteError) as error:  # then what the new process said
            worker.recv(timeout=30)
        assert error.value.phase == "start" and "FileNotFoundError" in str(error.value)
        with pytest.raises(WorkerDied) as final:  # and its end (the budget is spent)
            worker.recv(timeout=30)
        assert not isinstance(final.value, WorkerRestarted)


def test_a_restart_policy_waits_its_backoff_and_a_stop_cancels_the_restart(
    work: ModuleType,
) -> None:
    worker = Worker(work.echo, max_restarts=RestartPolicy(max_restarts=1, backoff=60.0))
    assert worker.state.value == "running"
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while worker.state != JobState.RESTARTING:  # waiting out the backoff
        assert time.monotonic() < deadline, worker.state
        time.sleep(0.05)
    worker.stop(grace=30)  # cuts the backoff short: the worker ends with its own cause
    assert worker.state.value == "cancelled" and worker.restarts == 1
    with pytest.raises(WorkerDied) as info:  # it never came back
        worker.recv(timeout=1)
    assert info.value.signal_name == "SIGKILL" and not isinstance(info.value, WorkerRestarted)


def test_sdk_report_reaches_the_coordinator(work: ModuleType) -> None:
    reports: list[tuple[int, dict[str, object]]] = []
    cluster = Cluster(
        [NodeConfig("n0", 1)],
        local=True,
        run_dir=None,
        on_report=lambda rank, r: reports.append((rank, r)),
    )
    with cluster:
        (worker,) = cluster.start(work.echo, wait_time=60)
        worker.send("forge")
        assert worker.recv(timeout=30) == "forged"
        worker.send("report")
        assert worker.recv(timeout=30) == "reported"
        deadline = time.monotonic() + 10
        while worker.last_report is None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert worker.last_report is not None
    assert (worker.last_report["step"], worker.last_report["total"]) == (7, 10)
    assert worker.last_report["metrics"] == {"loss": 0.5}
    assert reports and reports[0][0] == 0
    # the report sent without the token never reached the coordinator
    assert all(r.get("step") != 666 for _, r in reports), reports


MAIN_SCRIPT = textwrap.dedent(
    """
    import sys
    from dataclasses import dataclass
    from corral.actors import Cluster
    from corral.transport.options import SshOptions

    @dataclass
    class Point:
        x: int

    def work(handle):
        p = handle.recv()
        handle.send(Point(p.x + handle.rank))

    if __name__ == "__main__":
        print("main block ran", file=sys.stderr)
        hosts, ssh_config = sys.argv[1], (sys.argv[2:] or [None])[0]
        ssh = SshOptions(config=ssh_config)
        with Cluster.from_hosts(hosts, workers_per_host=2, ssh=ssh, run_dir=None) as cluster:
            cluster.start("__main__.work", wait_time=60)
            print([p.x for p in cluster.call(Point(40), timeout=60)])
    """
)


def run_main_script(folder: Path, *args: str) -> str:
    """Run :data:`MAIN_SCRIPT` (``"__main__.work"``) as a program; its stdout. Its
    ``__main__`` block must have run once: in the coordinator, never in a worker."""
    script = folder / "train_main.py"
    script.write_text(MAIN_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("main block ran") == 1
    return out.stdout.strip()


def test_main_function_form_does_not_run_the_main_block(tmp_path: Path) -> None:
    assert run_main_script(tmp_path, "local:1") == "[40, 41]"


def test_only_the_asked_environment_reaches_a_worker(
    work: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_TEST_SECRET", "not for workers")
    with Worker(work.echo, env={"FOO": "bar"}, echo=False) as worker:
        worker.send(("getenv", "FOO"))
        assert worker.recv(timeout=30) == "bar"
        worker.send(("getenv", "CORRAL_TEST_SECRET"))
        assert worker.recv(timeout=30) is None


def test_a_missing_interpreter_fails_start_with_the_reason(work: ModuleType) -> None:
    with pytest.raises(ActorStartError) as info:
        Worker(work.echo, python="/nonexistent/python3", echo=False)
    assert "no python interpreter found (tried: /nonexistent/python3)" in str(info.value)
    assert "[local:0] exited with code 127" in str(info.value)


def test_a_version_mismatch_fails_start(work: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import corral

    monkeypatch.setattr(corral, "__version__", "0.0.0-other")
    with pytest.raises(ActorStartError) as info:
        Worker(work.echo, echo=False)
    assert "the coordinator 0.0.0-other: install the same version on every host" in str(info.value)


def test_the_package_example_runs(tmp_path: Path) -> None:
    import corral.actors

    assert corral.actors.__doc__ is not None
    example = corral.actors.__doc__.split("```python\n")[1].split("```")[0]
    (tmp_path / "example.py").write_text(example)
    out = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    ready, echoed = out.stdout.splitlines()
    assert ready == str([{"status": "ready", "rank": r} for r in range(4)])
    assert echoed == str([{"echo": 1}] * 4)
