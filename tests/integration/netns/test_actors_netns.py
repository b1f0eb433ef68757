"""corral.actors over real SSH on the netns testbed: 2 hosts x 2 workers.

The work module lives in the shared ``tmp_path`` (every host sees it at the same
path). Worker processes are found on each host over SSH by the
``CORRAL_JOB_ID`` in their environment (``/proc/*/environ``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.actors import (
    ActorTimeout,
    Cluster,
    RemoteError,
    WorkerDied,
)
from corral.testbed import Testbed
from corral.transport.options import SshOptions

from ..test_actors_local import coordinator, run_main_script

pytestmark = pytest.mark.netns

HOSTS = ("tb1", "tb2")

WORK = textwrap.dedent(
    """
    import hashlib, os, socket, subprocess, time

    def echo(handle):
        while True:
            msg = handle.recv()
            if msg == "where":
                handle.send((socket.gethostname(), os.getpid(), os.environ.get("RANK"),
                             os.environ.get("NCCL_SOCKET_IFNAME"), os.getcwd()))
            elif msg == "child":
                handle.send(subprocess.Popen(["sleep", "600"]).pid)
            elif msg == "quiet child":  # holds none of the worker's pipes
                quiet = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                handle.send(quiet.pid)
            elif msg == "boom":
                raise KeyError("boom on " + socket.gethostname())
            elif msg == "quiet":
                pass
            elif isinstance(msg, bytes):
                handle.send((len(msg), hashlib.sha256(msg).hexdigest()))
            else:
                handle.send((handle.rank, msg))
    """
)


def ssh(testbed: Testbed, host: str, command: str) -> str:
    out = subprocess.run(
        testbed.ssh_argv(host, command), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, (host, out.stderr)
    return out.stdout


def remote_processes(testbed: Testbed, cluster_id: str) -> dict[str, list[str]]:
    """PIDs per host whose environment has ``CORRAL_JOB_ID=cluster_id`` (asked over SSH)."""
    # the testbed's hosts share one PID namespace: keep the processes of this host's netns
    script = (
        "me=$(readlink /proc/self/ns/net); for p in /proc/[0-9]*; do "
        f"if tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx 'CORRAL_JOB_ID={cluster_id}' "
        '&& [ "$(readlink $p/ns/net)" = "$me" ] && [ "$(cut -d" " -f3 $p/stat)" != Z ]; '
        "then echo ${p#/proc/}; fi; done; true"
    )
    found = {}
    for host in HOSTS:
        pids = ssh(testbed, host, script).split()
        if pids:
            found[host] = pids
    return found


def wait_gone(testbed: Testbed, cluster_id: str, within: float) -> dict[str, list[str]]:
    deadline = time.monotonic() + within
    while (left := remote_processes(testbed, cluster_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


@pytest.fixture
def work(tmp_path: Path) -> str:
    """The work module's file form (``path:echo``), in the shared tmp_path."""
    path = tmp_path / "actor_work_ssh.py"
    path.write_text(WORK)
    return f"{path}:echo"


def make_cluster(testbed: Testbed, tmp_path: Path, **options: Any) -> Cluster:
    """tb1 and tb2 with 2 workers each, from a hostfile (two of its styles)."""
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("tb1:2\ntb2 slots=2\n")
    return Cluster.from_hosts(
        hostfile,
        ssh=SshOptions(config=str(testbed.ssh_config)),
        workdir=str(tmp_path),
        run_dir=tmp_path / "runs",
        **options,
    )


@pytest.fixture
def cluster(testbed: Testbed, tmp_path: Path) -> Iterator[Cluster]:
    c = make_cluster(testbed, tmp_path)
    try:
        yield c
    finally:
        c.stop(grace=2)
        assert wait_gone(testbed, c.job_id, 15) == {}


def test_round_trip_over_ssh(cluster: Cluster, work: str, testbed: Testbed, tmp_path: Path) -> None:
    workers = cluster.start(work, wait_time=120)
    assert [(w.host, w.rank, w.local_rank) for w in workers] == [
        ("tb1", 0, 0),
        ("tb1", 1, 1),
        ("tb2", 2, 0),
        ("tb2", 3, 1),
    ]
    where = cluster.call("where", timeout=60)
    assert [w[0] for w in where] == ["tb1", "tb1", "tb2", "tb2"]
    assert [w[1] for w in where] == [w.pid for w in workers]
    assert [w[2] for w in where] == ["0", "1", "2", "3"]
    assert {w[4] for w in where} == {str(tmp_path)}
    for (_, _, _, iface, _), handle in zip(where, workers, strict=True):
        assert iface == testbed.host(handle.host).interface == handle.interface
    configs = cluster.nccl_configs()
    assert [c.interface for c in configs] == [w.interface for w in workers]
    assert {c.master_addr for c in configs} == {"tb1"}
    assert cluster.call({"k": [1, 2]}, timeout=60) == [(r, {"k": [1, 2]}) for r in range(4)]
    # recv with a timeout on a silent worker
    workers[2].send("quiet")
    with pytest.raises(ActorTimeout):
        workers[2].recv(timeout=1)
    # per-worker logs on the coordinator
    assert cluster.log_dir is not None
    assert {p.name for p in cluster.log_dir.glob("*.log")} <= {
        f"{h}.{r}.log" for h, r in (("tb1", 0), ("tb1", 1), ("tb2", 2), ("tb2", 3))
    }


def test_a_100_mb_message_to_a_testbed_worker(cluster: Cluster, work: str) -> None:
    workers = cluster.start(work, wait_time=120)
    payload = os.urandom(1 << 20) * 100
    workers[3].send(payload)
    assert workers[3].recv(timeout=300) == (len(payload), hashlib.sha256(payload).hexdigest())


def test_sigkill_of_a_remote_worker_and_stop_leaves_nothing(
    cluster: Cluster, work: str, testbed: Testbed
) -> None:
    workers = cluster.start(work, wait_time=120)
    for handle in workers:
        handle.send("child")
        handle.recv(timeout=60)
    assert sum(len(p) for p in remote_processes(testbed, cluster.job_id).values()) == 8
    victim = workers[2]
    victim.send("quiet child")
    victim.recv(timeout=60)
    start = time.monotonic()
    ssh(testbed, "tb2", f"kill -KILL {victim.pid}")
    with pytest.raises(WorkerDied) as info:
        victim.recv(timeout=60)
    assert time.monotonic() - start < 10
    assert (info.value.host, info.value.rank, info.value.signal_name) == ("tb2", 2, "SIGKILL")
    assert "[tb2:2]" in str(info.value)
    # what it left (a child on its stderr, one on nothing) goes too; rank 3 lives on
    deadline = time.monotonic() + 15
    while len(remote_processes(testbed, cluster.job_id).get("tb2", [])) > 2:
        assert time.monotonic() < deadline, remote_processes(testbed, cluster.job_id)
        time.sleep(0.5)
    workers[3].send("still here")
    assert workers[3].recv(timeout=60) == (3, "still here")
    cluster.stop(grace=2)
    assert wait_gone(testbed, cluster.job_id, 15) == {}


def test_work_fn_raising_is_a_remote_error(cluster: Cluster, work: str) -> None:
    workers = cluster.start(work, wait_time=120)
    workers[1].send("boom")
    with pytest.raises(RemoteError) as info:
        workers[1].recv(timeout=60)
    assert (info.value.host, info.value.rank, info.value.type_name) == ("tb1", 1, "KeyError")
    assert "boom on tb1" in info.value.remote_message
    assert 'raise KeyError("boom on " + socket.gethostname())' in info.value.traceback


COORDINATOR = textwrap.dedent(
    """
    import sys
    from corral.actors import Cluster, NodeConfig
    from corral.transport.options import SshOptions

    ssh_config, work, workdir = sys.argv[1:4]
    cluster = Cluster([NodeConfig(h, 2, workdir=workdir) for h in ("tb1", "tb2")],
                      ssh=SshOptions(config=ssh_config), run_dir=None)
    for w in cluster.start(work, wait_time=120):
        w.send("child")
        w.recv(timeout=60)
    print(cluster.job_id, flush=True)
    sys.stdin.read()
    """
)


def test_a_sigkilled_coordinator_leaves_no_remote_worker(
    testbed: Testbed, work: str, tmp_path: Path
) -> None:
    script = tmp_path / "coordinator.py"
    script.write_text(COORDINATOR)
    with coordinator(script, str(testbed.ssh_config), work, str(tmp_path)) as job_id:
        assert sum(len(p) for p in remote_processes(testbed, job_id).values()) == 8
    assert wait_gone(testbed, job_id, 20) == {}


def test_a_lost_host_is_a_worker_death_and_its_workers_exit(
    healthy_testbed: Testbed, work: str, tmp_path: Path
) -> None:
    testbed = healthy_testbed
    cluster = make_cluster(testbed, tmp_path, host_timeout=6.0)
    try:
        workers = cluster.start(work, wait_time=120)
        testbed.cut_link("tb2")
        start = time.monotonic()
        with pytest.raises(WorkerDied) as info:
            workers[2].recv(timeout=120)
        assert time.monotonic() - start < 6.0 + 20  # host_timeout + margin, never a hang
        assert info.value.host == "tb2" and info.value.lost
        assert "lost" in str(info.value)
        workers[0].send("ok")
        assert workers[0].recv(timeout=60) == (0, "ok")
    finally:
        cluster.stop(grace=1)
        testbed.repair()
    # cut off, the workers on tb2 stop hearing heartbeats and exit (2 x host_timeout)
    assert wait_gone(testbed, cluster.job_id, 30) == {}


def test_the_main_function_form_over_ssh(testbed: Testbed, tmp_path: Path) -> None:
    """``"__main__.work"``: the coordinator's script, at the same path on the hosts."""
    assert run_main_script(tmp_path, "tb1,tb2", str(testbed.ssh_config)) == "[40, 41, 42, 43]"
