"""PyTorch's flight recorder for a node's ranks: its variables, and a dump on request.

PyTorch records the collectives each rank issues in a ring buffer, the *flight
recorder*: NCCL's process groups for long, gloo's too in recent CPU builds. On
a hang corral asks every rank for that record; torch's own analyser then names
the first collective some rank never entered (:mod:`corral.diagnose.hangs`).

The node agent turns it on (unless the job's ``CORRAL_FLIGHT_RECORDER=0``) by
giving the ranks the node's flight folder, ``<node_dir>/flight/``
(:data:`~corral.contract.FLIGHT_DIR_ENV`). corral's rank wrapper then, before the
script imports torch:

* sets the variables the *installed* torch reads (:func:`torch_env`): the
  ``TORCH_FR_*`` names where that torch has them, the older ``TORCH_NCCL_*`` ones
  before (an old name on a new torch logs a deprecation warning, a new name on
  an old torch is ignored). The version comes from ``torch/version.py``'s text:
  nothing is imported. A variable the user set (under either name) is kept;
* listens on ``dump_<rank>.fifo`` (:func:`listen`): a write asks for a dump, which a
  thread of the rank takes through torch's dump API without C++/Python stack
  symbolisation (py-spy already gives the stacks; symbolising took NCCL's own
  pipe-triggered dump 5 s) and writes whole (renamed into place) to
  ``corral_rank_<rank>``, or writes why there is none to ``corral_rank_<rank>.error``.
  It works for any backend with a recorder (NCCL's ``_dump_nccl_trace``, the
  generic ``_dump_fr_trace`` of gloo) and needs only that the rank's main thread
  let go of the GIL, which torch's collectives do while they wait.

NCCL's own triggers stay as the fallback for ranks started without the wrapper
(``--launcher command``): its dump on the watchdog's timeout
(``<folder>/rank_<rank>``) and its request pipe (``<folder>/pipe_<rank>.pipe``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from corral.contract import TRACE_WAIT_ENV

__all__ = [
    "BUFFER_SIZE",
    "FOLDER",
    "TRACE_WAIT",
    "WRAPPER",
    "dump_file",
    "error_file",
    "installed_torch_version",
    "listen",
    "nccl_dump_file",
    "nccl_pipe",
    "request_file",
    "take_dump",
    "torch_env",
    "trace_wait",
]

#: Collectives the flight recorder keeps per rank (a ring buffer).
BUFFER_SIZE = 1000
#: The node's flight folder, under its directory.
FOLDER = "flight"
#: How long a hang's dump waits for the ranks' flight recorder dumps (seconds), unless
#: the job's ``CORRAL_TRACE_WAIT`` says otherwise (:func:`trace_wait`).
TRACE_WAIT = 15.0
#: The rank wrapper's module (a node whose argv runs it needs no torch names from the agent).
WRAPPER = "corral.agent.worker"

# (torch's current name, its older name, the first torch version with the current one)
_RENAMED = (
    ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", (2, 8)),
    ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", (2, 10)),
)
_VERSION = re.compile(r"""^__version__\s*=\s*['"](\d+)\.(\d+)""", re.M)


def request_file(folder: str | os.PathLike[str], rank: int) -> Path:
    """The FIFO a write to which asks rank ``rank`` (under corral's wrapper) for a dump."""
    return Path(folder) / f"dump_{rank}.fifo"


def dump_file(folder: str | os.PathLike[str], rank: int) -> Path:
    """Where the wrapper puts rank ``rank``'s dump (always whole: renamed into place)."""
    return Path(folder) / f"corral_rank_{rank}"


def error_file(folder: str | os.PathLike[str], rank: int) -> Path:
    """Where the wrapper says why rank ``rank`` has no dump."""
    return Path(folder) / f"corral_rank_{rank}.error"


def nccl_dump_file(folder: str | os.PathLike[str], rank: int) -> Path:
    """Where ProcessGroupNCCL writes its own dump (on its watchdog's timeout, on request)."""
    return Path(folder) / f"rank_{rank}"


def nccl_pipe(folder: str | os.PathLike[str], rank: int) -> Path:
    """ProcessGroupNCCL's request pipe (it makes it; a write asks for a dump)."""
    return Path(folder) / f"pipe_{rank}.pipe"


def installed_torch_version() -> tuple[int, int] | None:
    """(major, minor) of the torch this interpreter would import, read from
    ``torch/version.py`` without importing torch; None without torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        with contextlib.suppress(OSError):
            found = _VERSION.search(Path(location, "version.py").read_text(errors="replace"))
            if found:
                return int(found[1]), int(found[2])
    return None


def torch_env(
    folder: str | os.PathLike[str], env: Mapping[str, str], version: tuple[int, int] | None
) -> dict[str, str]:
    """The flight recorder's variables for torch ``version`` (None: the newest names),
    dumps and NCCL's request pipes in ``folder``; none the user set in ``env``."""
    base = str(Path(folder))
    wanted = {
        "TORCH_FR_BUFFER_SIZE": str(BUFFER_SIZE),
        "TORCH_FR_DUMP_TEMP_FILE": f"{base}/rank_",
    }
    values: dict[str, str] = {}
    for current, older, since in _RENAMED:
        if current in env or older in env:
            continue
        name = current if version is None or version >= since else older
        values[name] = wanted[current]
    plain = {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{base}/pipe_",
        # the watchdog's dump on a timeout without symbolised stacks (py-spy has them)
        "TORCH_INCLUDE_STACK_TRACE": "0",
    }
    values.update({key: value for key, value in plain.items() if key not in env})
    return values


def trace_wait(env: Mapping[str, str]) -> float:
    """The job's ``CORRAL_TRACE_WAIT`` (seconds, more than 0, at most an hour), else
    :data:`TRACE_WAIT`; ValueError naming the variable for anything else."""
    text = env.get(TRACE_WAIT_ENV, "").strip()
    if not text:
        return TRACE_WAIT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:
        raise ValueError(
            f"{TRACE_WAIT_ENV}={text!r}: the flight recorder wait must be seconds, more than 0"
            " and at most 3600"
        )
    return value


class NoDump(Exception):
    """Why a rank has no flight recorder dump to give."""


def take_dump() -> bytes:
    """This process's flight recorder dump (torch's pickle), without stack traces.

    Raises :class:`NoDump` saying why there is none: torch not imported, no
    process group, no recorder for the backend, or torch's own error."""
    torch = sys.modules.get("torch")
    if torch is None:
        raise NoDump("the rank never imported torch")
    dist = sys.modules.get("torch.distributed")
    try:
        initialised = dist is not None and dist.is_available() and dist.is_initialized()
    except Exception as exc:
        raise NoDump(f"torch.distributed cannot say whether it is initialised: {exc}") from None
    if not initialised:
        raise NoDump("the rank has no torch.distributed process group")
    assert dist is not None
    c10d = getattr(torch._C, "_distributed_c10d", None)
    try:
        backend = str(dist.get_backend())
    except Exception as exc:
        backend = f"unknown ({exc})"
    for name, fits in (("_dump_nccl_trace", "nccl" in backend), ("_dump_fr_trace", True)):
        dump = getattr(c10d, name, None)
        if dump is not None and fits:
            try:
                data = dump(True, False, False)  # collectives, no stack traces, all entries
            except Exception as exc:
                raise NoDump(f"torch's {name} failed: {exc}") from None
            return bytes(data)
    raise NoDump(
        f"torch {getattr(torch, '__version__', '?')} has no flight recorder dump for the"
        f" {backend} backend"
    )


def _write_whole(path: Path, data: bytes) -> None:
    temporary = path.with_name(f"{path.name}.tmp{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


def _answer(folder: Path, rank: int) -> None:
    """Take the dump and write it (or why not), replacing the previous answer."""
    try:
        data = take_dump()
    except NoDump as exc:
        _write_whole(error_file(folder, rank), f"{exc}\n".encode())
        with contextlib.suppress(OSError):
            dump_file(folder, rank).unlink()
        return
    _write_whole(dump_file(folder, rank), data)
    with contextlib.suppress(OSError):
        error_file(folder, rank).unlink()


def _serve(fd: int, folder: Path, rank: int) -> None:
    while True:
        try:
            request = os.read(fd, 64)
        except OSError:
            return
        if not request:
            continue
        with contextlib.suppress(Exception):  # never take the rank down
            _answer(folder, rank)


def listen(folder: str | os.PathLike[str], rank: int) -> bool:
    """Make ``dump_<rank>.fifo`` in ``folder`` and answer its requests from a daemon
    thread (see the module doc), removing the rank's dumps of an earlier attempt;
    False when the FIFO cannot be made."""
    where = Path(folder)
    path = request_file(where, rank)
    for stale in (dump_file(where, rank), error_file(where, rank), nccl_dump_file(where, rank)):
        with contextlib.suppress(OSError):  # an earlier attempt's answers are not this one's
            stale.unlink()
    try:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # an earlier attempt's
        os.mkfifo(path, 0o600)
        # read-write: the read end never sees EOF, reads block until a request comes
        fd = os.open(path, os.O_RDWR)
    except (OSError, AttributeError):  # AttributeError: no mkfifo on this platform
        return False
    thread = threading.Thread(
        target=_serve, args=(fd, where, rank), name="corral-flight-recorder", daemon=True
    )
    thread.start()
    return True
