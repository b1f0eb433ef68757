"""Helpers for integration tests that run real corral jobs on this machine."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

SCRIPTS = Path(__file__).parent / "scripts"
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def corral_argv(*args: str) -> list[str]:
    """The corral command line, run with this interpreter."""
    return [sys.executable, "-m", "corral", *args]


def spawn_ranks(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs)``, with each rank forked from a
    server that imported torch once for this pytest process (a forkserver with those
    modules preloaded): a spawned rank imports torch itself (~1.5 CPU-s) and
    ``torch._dynamo`` at its first optimizer step (~1.2 more). As a spawned rank, each
    starts with this process's environment and working directory of now. ``fn`` lives
    at module level (pickled by name), in a module that the test imports lazily."""
    import importlib
    import multiprocessing

    mp = importlib.import_module("torch.multiprocessing")  # untyped: start_processes
    multiprocessing.set_forkserver_preload(
        ["torch", "torch._dynamo", "torch.nn.parallel", __name__, fn.__module__]
    )  # the first call in this process starts the server: later ones reuse it
    context = (fn, dict(os.environ), os.getcwd(), args)
    mp.start_processes(_rank, args=context, nprocs=nprocs, join=True, start_method="forkserver")


def _rank(
    rank: int, fn: Callable[..., None], env: dict[str, str], cwd: str, args: tuple[Any, ...]
) -> None:
    """One rank of :func:`spawn_ranks`, in the caller's environment and directory."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    fn(rank, *args)


def job_processes(job_id: str) -> list[psutil.Process]:
    """Live processes (not zombies) whose environment carries CORRAL_JOB_ID=job_id."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("CORRAL_JOB_ID") == job_id:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_no_job_processes(job_id: str, within: float) -> list[psutil.Process]:
    """Poll until no process of the job is left (or ``within`` seconds pass)."""
    deadline = time.monotonic() + within
    left = job_processes(job_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = job_processes(job_id)
    return left


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    """A run dir for one test; any process of its jobs is killed afterwards."""
    path = tmp_path / "runs"
    yield path
    for job in path.glob("*") if path.exists() else []:
        for proc in job_processes(job.name):
            proc.kill()


def run_corral(
    *args: str, cwd: Path, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run corral to completion, capturing stdout and stderr as text (``env``: extra
    variables)."""
    full = {**os.environ, "COLUMNS": "200", **(env or {})}  # env may hold COLUMNS too
    return subprocess.run(
        corral_argv(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full
    )


def wait_for_output(proc: subprocess.Popen[str], pattern: str, timeout: float = 120) -> str:
    """Read ``proc``'s stdout until ``pattern`` matches what was read; return it."""
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
        if re.search(pattern, seen):
            return seen
    raise AssertionError(f"{pattern!r} not seen in output:\n{seen[-2000:]}")
