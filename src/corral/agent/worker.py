"""``python -m corral.agent.worker SCRIPT [ARGS...]``: runs one rank's script.

It runs the script in this interpreter (like ``python SCRIPT``) and adds what
corral needs around it:

* under torchrun (``CORRAL_STREAMS=socket``) its stdout and stderr become
  connections to the node agent, tagged with the global rank that torchrun
  assigned, so every line is attributed to the right ``[host:rank]``;
* an uncaught exception is written to the rank's error file (the traceback of
  the root cause) and reported with the exit code on the control socket;
* PyTorch's flight recorder is turned on under the names the rank's torch reads, and
  the agent's requests for its dump are answered (:mod:`corral.agent.flight`);
* ``SIGUSR1`` dumps every thread's Python stack to
  ``$CORRAL_NODE_DIR/stacks/rank-<RANK>.txt`` (:func:`corral.sdk.enable_stack_dumps`),
  the fallback of hang detection where py-spy cannot attach;
* the process dies with its parent (``PR_SET_PDEATHSIG``), so a killed
  torchrun or agent never leaves ranks behind;
* once the script is done, torch's C++ static destructors are skipped (they
  can abort a finished process, see ``_exit_without_static_destructors``);
* under ``--recovery in-place`` (a Lighthouse in the env) torchft logs warnings only,
  its quorum changes aside (``CORRAL_TORCHFT_LOG=info`` for more:
  :func:`corral.sdk.runtime.quiet_torchft`);
* with ``CORRAL_ACCELERATE=1`` (``--launcher accelerate``, the harness) Accelerate's
  env is prepared and a world size other than the plan's refused
  (:mod:`corral.harness.accelerate`); with ``CORRAL_HARNESS`` the script runs under
  the plugin harness (:mod:`corral.harness.plugin`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import runpy
import signal
import sys

from corral.contract import (
    ACCELERATE_ENV,
    ATTEMPT_ENV,
    CONTROL_ENV,
    ERROR_FILE_ENV,
    FLIGHT_DIR_ENV,
    HARNESS_ENV,
    LIGHTHOUSE_ENV,
    MLX_BACKEND_ENV,
    NODE_DIR_ENV,
    QOS_ENV,
    STREAMS_ENV,
    stack_file,
)
from corral.sdk.runtime import connect_control, flush_reports

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _redirect_streams(address: str, rank: int, local_rank: int) -> None:
    """Point fds 1 and 2 at the agent, announcing which rank they belong to."""
    for name, fd in (("out", 1), ("err", 2)):
        sock = connect_control(address, timeout=None)  # blocking: it becomes fd 1 or 2
        sock.sendall(f"{name} {rank} {local_rank} {os.getpid()}\n".encode())
        os.dup2(sock.fileno(), fd)
        sock.close()


def _report_exit(address: str | None, rank: int, code: int) -> None:
    if not address:
        return
    with contextlib.suppress(OSError):
        sock = connect_control(address, timeout=2.0)
        sock.sendall(
            f"ctl {rank}\n".encode() + json.dumps({"type": "exit", "code": code}).encode() + b"\n"
        )
        sock.close()


def _enable_stack_dumps(node_dir: str, rank: int) -> None:
    """Register the ``SIGUSR1`` stack dump of this rank (:func:`corral.sdk.enable_stack_dumps`)."""
    try:
        from corral.sdk import enable_stack_dumps

        enable_stack_dumps(stack_file(node_dir, rank))
    except Exception as exc:  # never keep the script from running
        print(f"corral: stack dumps disabled: {exc}", file=sys.stderr)


def _flight_recorder(folder: str, rank: int) -> None:
    """Turn on PyTorch's flight recorder under the names this rank's torch reads (before
    the script imports it) and answer the agent's dump requests
    (:mod:`corral.agent.flight`)."""
    try:
        from corral.agent import flight

        os.environ.update(flight.torch_env(folder, os.environ, flight.installed_torch_version()))
        flight.listen(folder, rank)
    except Exception as exc:  # never keep the script from running
        print(f"corral: flight recorder dumps disabled: {exc}", file=sys.stderr)


def error_file(node_dir: str, attempt: str, rank: int) -> str:
    """Where a rank's error file goes: one per attempt, so a rank of a later attempt
    never inherits the traceback of an earlier one (ranks are re-assigned)."""
    return os.path.join(node_dir, "errors", f"attempt-{attempt}-rank-{rank}.json")


_HARNESS_FILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "harness", "plugin.py")


def _trim_traceback(exc: BaseException) -> None:
    """Drop the wrappers' frames (this one's, the harness's, runpy's and importlib's)
    so the traceback starts in the script."""
    tb = exc.__traceback__
    wrappers = {os.path.abspath(__file__), os.path.abspath(_HARNESS_FILE)}
    while tb is not None and tb.tb_next is not None:
        filename = tb.tb_frame.f_code.co_filename
        if (
            os.path.abspath(filename) not in wrappers
            and "runpy" not in filename
            and not filename.startswith("<frozen importlib")
        ):
            break
        tb = tb.tb_next
    exc.__traceback__ = tb


def _run_script(script: str) -> None:
    """Run ``script`` as ``__main__`` (``sys.argv`` already set), with Accelerate's
    rank setup and under the plugin harness when the plan asks for them."""
    env = os.environ
    if env.get(ACCELERATE_ENV) == "1":
        from corral.harness.accelerate import prepare

        prepare(env)
    mode = env.get(HARNESS_ENV)
    if mode:
        from corral.harness.plugin import run

        run(script, mode)
    else:
        runpy.run_path(script, run_name="__main__")


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF  # what the OS reports: sys.exit(-1) is 255, 256 is 0
    print(exc.code, file=sys.stderr)
    return 1


def _report_exception(exc: BaseException) -> int:
    """Print what killed the script (a setup refusal: its message alone; anything
    else: the traceback from the script's frame on), write the error file; 1."""
    from corral.harness.accelerate import SetupError

    _trim_traceback(exc)
    if isinstance(exc, SetupError):
        print(f"corral: {exc}", file=sys.stderr)
    else:
        import traceback  # only for a failed script: a rank's start imports no more than it needs

        traceback.print_exception(exc)
    with contextlib.suppress(Exception):
        from corral.sdk import write_error_file

        write_error_file(exc)
    return 1


def main(argv: list[str]) -> int:
    """Run ``argv[0]`` as ``__main__`` with ``argv[1:]`` as its arguments."""
    if not argv:
        print("usage: python -m corral.agent.worker SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    _die_with_parent()
    env = os.environ
    if "NODE_RANK" not in env and "GROUP_RANK" in env:
        env["NODE_RANK"] = env["GROUP_RANK"]
    rank = int(env.get("RANK", "0"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    node_dir = env.get(NODE_DIR_ENV)
    if node_dir:
        env[ERROR_FILE_ENV] = error_file(node_dir, env.get(ATTEMPT_ENV, "0"), rank)
    control = env.get(CONTROL_ENV)
    if control and env.get(STREAMS_ENV) == "socket":
        try:
            _redirect_streams(control, rank, local_rank)
        except OSError as exc:
            print(f"corral: cannot reach the node agent at {control}: {exc}", file=sys.stderr)
    if node_dir:
        _enable_stack_dumps(node_dir, rank)
    if env.get(FLIGHT_DIR_ENV):
        _flight_recorder(env[FLIGHT_DIR_ENV], rank)
    if env.get(QOS_ENV):  # --qos: the macOS QoS class, before the script's threads
        from corral.sdk.runtime import apply_qos_from_env

        try:
            apply_qos_from_env(env)
        except ValueError as exc:
            print(f"corral: {exc}", file=sys.stderr)
            _report_exit(control, rank, 2)
            return 2
    if env.get(MLX_BACKEND_ENV):  # --launcher mlx: MLX's hostfile and group first
        from corral.agent.mlx_env import prepare

        refused = prepare(env)
        if refused is not None:
            _report_exit(control, rank, refused)
            return refused
    if env.get(LIGHTHOUSE_ENV):  # --recovery in-place: torchft at warnings by default
        from corral.sdk.runtime import quiet_torchft

        quiet_torchft(env)
    script = argv[0]
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        _run_script(script)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:
        code = _report_exception(exc)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    flush_reports()  # the script's last reports reach the agent before its exit code
    _report_exit(control, rank, code)
    # MLX too: its teardown closes the ring's sockets before the process ends, so the
    # neighbours' "connection lost" could be seen as failing before this rank
    if "torch" in sys.modules or "mlx.core" in sys.modules:
        _exit_without_static_destructors(code)
    return code


def _exit_without_static_destructors(code: int) -> None:
    """Finish like a normal interpreter exit (non-daemon threads joined, atexit
    handlers run, streams flushed), then leave with ``os._exit``.

    torch's C++ static destructors can abort a process whose work is done
    ("terminate called without an active exception", SIGABRT) when a collective
    library's threads are still around at exit; the script has finished and its
    status is known, so that teardown is skipped rather than reported as a crash.
    """
    import threading  # loaded already: torch or MLX is

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
