"""The agent's own process tree, read from ``/proc`` without psutil.

The agent walks its descendants every second (to record their process groups)
and every few tens of milliseconds while it tears the node down. psutil's
``children(recursive=True)`` reads ``/proc/*/stat`` of every process on the host
to find them (milliseconds on a busy host, each time); Linux lists each thread's
children in ``/proc/PID/task/TID/children``, so the walk here reads the agent's
own subtree only. Where that file is missing (not Linux, or a kernel built
without it) psutil does the walk, imported then.
"""

from __future__ import annotations

import os

_PROC = "/proc"
_HAS_CHILDREN: bool | None = None


def _children_file(pid: int) -> str:
    return f"{_PROC}/{pid}/task/{pid}/children"


def has_children_files() -> bool:
    """Whether this host lists each thread's children in ``/proc`` (Linux with
    ``CONFIG_PROC_CHILDREN``); looked up once."""
    global _HAS_CHILDREN
    if _HAS_CHILDREN is None:
        _HAS_CHILDREN = os.path.exists(_children_file(os.getpid()))
    return _HAS_CHILDREN


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's), none when it is gone."""
    try:
        tids = os.listdir(f"{_PROC}/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    for tid in tids:
        try:
            with open(f"{_PROC}/{pid}/task/{tid}/children", "rb") as fh:
                kids.extend(int(k) for k in fh.read().split())
        except (OSError, ValueError):
            continue
    return kids


def descendants(pid: int | None = None) -> list[int]:
    """The pids of every descendant of ``pid`` (this process by default), parents
    before their children."""
    root = os.getpid() if pid is None else pid
    if not has_children_files():
        return _psutil_descendants(root)
    found: list[int] = []
    seen = {root}
    todo = [root]
    while todo:
        for kid in _children(todo.pop()):
            if kid not in seen:  # a reused pid cannot loop the walk
                seen.add(kid)
                found.append(kid)
                todo.append(kid)
    return found


def _psutil_descendants(root: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(root).children(recursive=True)]
    except psutil.Error:
        return []


def running(pid: int) -> bool:
    """True unless the process is gone or a zombie (exited, not yet reaped)."""
    if not has_children_files():
        return _psutil_running(pid)
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except FileNotFoundError:
        return False
    except OSError:
        return _psutil_running(pid)
    # "PID (COMM) STATE ...": COMM may hold spaces and parentheses
    state = stat[stat.rfind(b")") + 2 :][:1]
    return state not in (b"Z", b"X", b"")


def _psutil_running(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False
