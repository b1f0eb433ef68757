"""The agent's walk of its own process tree (:mod:`corral.agent.procs`) finds what
psutil finds, without psutil, and tells a zombie from a running process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from corral.agent import procs
from corral.agent.__main__ import _Stdin

pytestmark = pytest.mark.skipif(
    not procs.has_children_files(), reason="this kernel lists no children in /proc"
)


def test_the_walk_finds_every_descendant_psutil_finds() -> None:
    # a child, and grandchildren of a shell (started by one of its threads); the test
    # process may have other children (an xdist worker's servers, forkservers), which
    # may come and go meanwhile: the walk lies between psutil's two looks
    script = "sleep 30 & sleep 30 & echo up; wait"
    direct = subprocess.Popen(["sleep", "30"])
    shell = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE)
    try:
        assert shell.stdout is not None and shell.stdout.readline() == b"up\n"
        grandchildren = {p.pid for p in psutil.Process(shell.pid).children(recursive=True)}
        assert len(grandchildren) == 2
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        found = procs.descendants()
        after = {p.pid for p in psutil.Process().children(recursive=True)}
        assert len(found) == len(set(found))
        assert before & after <= set(found) <= before | after
        assert {direct.pid, shell.pid} | grandchildren <= set(found)
        assert set(procs.descendants(shell.pid)) == grandchildren
        assert procs.descendants(direct.pid) == []
        assert procs.descendants(2**22 + 1) == []  # no such process
    finally:
        for proc in psutil.Process(shell.pid).children(recursive=True):
            proc.kill()
        direct.kill()
        shell.kill()
        direct.wait()
        shell.wait()


def test_a_zombie_is_not_running_and_a_reaped_process_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert procs.running(os.getpid())
    deadline = time.monotonic() + 60
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not procs.running(child.pid)  # exited, not yet reaped
    assert child.pid in procs.descendants()  # still the agent's to reap
    child.wait()
    assert not procs.running(child.pid)


def test_stdin_is_read_in_blocks_and_what_follows_a_line_is_kept() -> None:
    read, write = os.pipe()
    os.write(write, b'{"op": "probe"}\n{"op": "start"}\n{"op": "hb"}\n{"op"')
    stdin = _Stdin(read)
    assert stdin.line() == b'{"op": "probe"}\n'
    assert stdin.buffer == b'{"op": "start"}\n{"op": "hb"}\n{"op"'  # one read took it all
    assert stdin.line() == b'{"op": "start"}\n'
    assert stdin.buffer == b'{"op": "hb"}\n{"op"'  # the agent's reader gets it
    os.write(write, b': "stop"}\n')
    assert stdin.line() == b'{"op": "hb"}\n'
    assert stdin.line() == b'{"op": "stop"}\n'
    os.write(write, b"no newline")
    os.close(write)
    assert stdin.line() == b"no newline"
    assert stdin.line() == b""
    os.close(read)
