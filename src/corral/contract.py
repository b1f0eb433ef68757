"""The env/file contract between corral and the ranks it starts.

One public, standard-library-only leaf module: the names of the ``CORRAL_*``
variables the plan (and the Kubernetes and Slurm renders) set for the ranks and
the node agents, and the helpers both sides need to agree on the files they
share (checkpoints, error files, stack dumps, the control socket's first line,
the job config's world-size adjustment). The SDK (on the nodes) and corral's
host side both import it; it imports nothing of corral, so it can be shipped to
a host on its own (:mod:`corral.remote.python`).
"""

from __future__ import annotations

import math
import os
import signal
import struct
import warnings
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # json, re and pathlib are imported where used: the entry point and
    # every node agent import this module before they start what waits for them
    from collections.abc import Mapping
    from pathlib import Path

__all__ = [
    "ACCELERATE_ENV",
    "ACTOR_ENV",
    "AGENT_VARS",
    "ATTEMPT_ENV",
    "BACKEND_ENV",
    "CALIBRATE_ENV",
    "CALIBRATE_SECONDS_ENV",
    "CHECKPOINT_DIR_ENV",
    "CHECKPOINT_REPLICA_ENV",
    "CONTRACT_VARS",
    "CONTROL_ENV",
    "CONTROL_TOKEN_ENV",
    "DIST_TIMEOUT_ENV",
    "DUMP_SIGNAL",
    "ERROR_FILE_ENV",
    "FLIGHT_DIR_ENV",
    "FLIGHT_RECORDER_ENV",
    "FT_QUORUM_RETRIES_DEFAULT",
    "FT_QUORUM_RETRIES_ENV",
    "FT_QUORUM_TIMEOUT_DEFAULT",
    "FT_QUORUM_TIMEOUT_ENV",
    "FT_SYNC_ENV",
    "FT_SYNC_EVERY_ENV",
    "FT_SYNC_MODES",
    "FT_TIMEOUT_DEFAULT",
    "FT_TIMEOUT_ENV",
    "HARNESS_ENV",
    "HOST_ENV",
    "JOB_CONFIG_ENV",
    "JOB_ID_ENV",
    "LAUNCH_DIR_ENV",
    "LIGHTHOUSE_ENV",
    "MEM_CAP_ENV",
    "MICRO_BATCH_FITS_ENV",
    "MIN_REPLICAS_ENV",
    "MLX_BACKEND_ENV",
    "MLX_HOSTS_ENV",
    "MLX_INIT_TIMEOUT_ENV",
    "NAMES",
    "NODE_DIR_ENV",
    "PLAN_NODE_ENV",
    "PLAN_NPROCS_ENV",
    "QOS_CLASSES",
    "QOS_ENV",
    "RDZV_TIMEOUT_ENV",
    "REPLICA_GROUPS_ENV",
    "REPLICA_GROUP_ENV",
    "SERVER_TOKEN_ENV",
    "SHARED_DATA_PATH_ENV",
    "STATE_MISMATCH",
    "STEP_OVERHEADS_ENV",
    "STREAMS_ENV",
    "TORCHELASTIC_ERROR_FILE_ENV",
    "TORCHFT_LOG_ENV",
    "TORCHFT_REPLICA_GROUPS_ENV",
    "TORCHFT_REPLICA_GROUP_ENV",
    "TRACE_WAIT_ENV",
    "WORKLOAD_WEIGHTS_ENV",
    "ScaleBy",
    "ScaleRule",
    "adjust_config",
    "auth_line",
    "checkpoint_files",
    "error_file_path",
    "fsync_dir",
    "is_complete_checkpoint",
    "is_env_name",
    "positive_numbers",
    "read_error_file",
    "scale",
    "stack_file",
]

# --- what every rank gets -------------------------------------------------------------
#: The job's id (also torchrun's ``--rdzv-id``).
JOB_ID_ENV = "CORRAL_JOB_ID"
#: The attempt number (0 first, +1 per restart).
ATTEMPT_ENV = "CORRAL_ATTEMPT"
#: The host's name as the cluster knows it.
HOST_ENV = "CORRAL_HOST"
#: The node's own directory: error files, stack dumps, rank logs, the agent's state.
NODE_DIR_ENV = "CORRAL_NODE_DIR"
#: The node agent's control socket (``unix:/path`` or ``unix:@name``) and its token.
CONTROL_ENV = "CORRAL_CONTROL"
CONTROL_TOKEN_ENV = "CORRAL_CONTROL_TOKEN"
#: The variables only the node agent sets (never a plan's or the user's).
AGENT_VARS = (CONTROL_ENV, CONTROL_TOKEN_ENV)
#: ``socket``: the rank wrapper sends the rank's stdout/stderr over the control socket.
STREAMS_ENV = "CORRAL_STREAMS"
#: The rank's JSON error file (the rank wrapper sets it from the node dir).
ERROR_FILE_ENV = "CORRAL_ERROR_FILE"
#: torchrun's name for it (read when corral's is unset).
TORCHELASTIC_ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
#: Seconds the SDK waits for the master, and the process group's timeout.
RDZV_TIMEOUT_ENV = "CORRAL_RDZV_TIMEOUT"
DIST_TIMEOUT_ENV = "CORRAL_DIST_TIMEOUT"
#: The collective backend the ranks use, as the user declares it in the job's env
#: (``--env CORRAL_BACKEND=nccl|gloo|auto``): ``sdk.init_distributed()`` uses it for
#: ``backend="auto"``, and the pre-flight judges ranks sharing a GPU by it (fatal
#: only for NCCL).
BACKEND_ENV = "CORRAL_BACKEND"

# --- what some jobs get -----------------------------------------------------------------
#: ``--checkpoint-dir``: where ``sdk.resume()`` looks.
CHECKPOINT_DIR_ENV = "CORRAL_CHECKPOINT_DIR"
#: ``wait``: a rank-0 save waits until the coordinator's replica holds it.
CHECKPOINT_REPLICA_ENV = "CORRAL_CHECKPOINT_REPLICA"
#: On ``local:N``: the job's working directory, against which the SDK resolves
#: a relative checkpoint path.
LAUNCH_DIR_ENV = "CORRAL_LAUNCH_DIR"
#: ``--shared-data-path``: a directory every node sees.
SHARED_DATA_PATH_ENV = "CORRAL_SHARED_DATA_PATH"
#: Per-node workload weights (comma separated), and the node's place in a weighted plan.
WORKLOAD_WEIGHTS_ENV = "CORRAL_WORKLOAD_WEIGHTS"
PLAN_NODE_ENV = "CORRAL_PLAN_NODE"
PLAN_NPROCS_ENV = "CORRAL_PLAN_NPROCS"
#: ``--qos``: the macOS QoS class of the rank's main thread.
QOS_ENV = "CORRAL_QOS"
#: The job's config (JSON) submitted through ``corral serve``.
JOB_CONFIG_ENV = "CORRAL_JOB_CONFIG"
#: ``--harness``: the rank wrapper runs the script under the plugin harness (its mode).
HARNESS_ENV = "CORRAL_HARNESS"
#: ``1``: the rank wrapper does Accelerate's rank setup (``--launcher accelerate``).
ACCELERATE_ENV = "CORRAL_ACCELERATE"
#: ``1`` under ``corral calibrate``, and the seconds it measures.
CALIBRATE_ENV = "CORRAL_CALIBRATE"
CALIBRATE_SECONDS_ENV = "CORRAL_CALIBRATE_SECONDS"
#: A node's declared memory cap in MiB (its host's env, or ``corral calibrate
#: --mem-cap HOST=MB``): a calibration step whose measured peak exceeds it is out of memory.
MEM_CAP_ENV = "CORRAL_MEM_CAP_MB"
#: The largest micro-batch each rank fits (plan order, ``0``: no limit found), from the
#: calibration: the weighted split gives a rank whose share exceeds it gradient accumulation.
MICRO_BATCH_FITS_ENV = "CORRAL_MICRO_BATCH_FITS"
#: Each rank's fixed per-step cost from the calibration, in examples (plan order, ``0``:
#: none measured): ``r_i * f_i``, the examples the rank could process in the time its
#: step costs whatever its batch. The split then equalises ``f_i + b_i / r_i``.
STEP_OVERHEADS_ENV = "CORRAL_STEP_OVERHEADS"
#: ``--launcher mlx``: the backend, the hosts and the group's init timeout.
MLX_BACKEND_ENV = "CORRAL_MLX_BACKEND"
MLX_HOSTS_ENV = "CORRAL_MLX_HOSTS"
MLX_INIT_TIMEOUT_ENV = "CORRAL_MLX_INIT_TIMEOUT"
#: ``1`` in an actor worker's environment.
ACTOR_ENV = "CORRAL_ACTOR"
#: The node's flight folder (:mod:`corral.agent.flight`): the rank wrapper turns
#: PyTorch's flight recorder on with it and answers dump requests there.
FLIGHT_DIR_ENV = "CORRAL_FLIGHT_DIR"

#: ``--recovery in-place`` (torchft): each node is one replica group with its own
#: torchrun store (its MASTER_ADDR/MASTER_PORT; RANK and WORLD_SIZE are the group's).
#: The group's id (0 to groups - 1, the node's index in the plan), the configured
#: number of groups, and the fewest groups that may commit a step.
REPLICA_GROUP_ENV = "CORRAL_REPLICA_GROUP"
REPLICA_GROUPS_ENV = "CORRAL_REPLICA_GROUPS"
MIN_REPLICAS_ENV = "CORRAL_MIN_REPLICAS"
#: torchft's own name for the Lighthouse's address (``http://host:port``).
LIGHTHOUSE_ENV = "TORCHFT_LIGHTHOUSE"
#: torchft's conventional names for the group's id and the number of groups (its
#: README, ``train_ddp.py`` and TorchX component read them): set beside corral's own,
#: with the same values, unless the job's or the host's env sets them.
TORCHFT_REPLICA_GROUP_ENV = "REPLICA_GROUP_ID"
TORCHFT_REPLICA_GROUPS_ENV = "NUM_REPLICA_GROUPS"
#: torchft's own overrides of the process-group (collectives, healing) and quorum
#: timeouts, in seconds, and ``sdk.fault_tolerant``'s defaults for them (the
#: pre-flight checks their order against ``--hang-timeout``: corral.checks.timeouts).
FT_TIMEOUT_ENV = "TORCHFT_TIMEOUT_SEC"
FT_QUORUM_TIMEOUT_ENV = "TORCHFT_QUORUM_TIMEOUT_SEC"
FT_TIMEOUT_DEFAULT = 30.0
FT_QUORUM_TIMEOUT_DEFAULT = 60.0
#: torchft's retries of a quorum whose Lighthouse call failed: what lets the groups
#: reconnect to a Lighthouse corral restarted at the same address; set for every
#: group unless the job's env sets it (``0``: a lost Lighthouse means a restart from disk).
FT_QUORUM_RETRIES_ENV = "TORCHFT_QUORUM_RETRIES"
FT_QUORUM_RETRIES_DEFAULT = 20
#: The name of the SDK's error when the replica groups' states differ after a heal
#: (``corral.sdk.StateMismatch``): in a rank's error file it tells an in-place job
#: that restarting groups would only heal the same way again.
STATE_MISMATCH = "StateMismatch"

# --- set by the user --------------------------------------------------------------------
#: In a job's ``--env``: ``0`` turns off PyTorch's flight recorder, which the node
#: agent turns on for its ranks (default: on).
FLIGHT_RECORDER_ENV = "CORRAL_FLIGHT_RECORDER"
#: In a job's ``--env``: the seconds a hang's dump waits for every rank's flight
#: recorder dump (default 15).
TRACE_WAIT_ENV = "CORRAL_TRACE_WAIT"
#: In a job's ``--env``: how much torchft logs in an in-place job's ranks, ``warning``
#: (the default: its quorum and healing changes only), ``info`` or ``debug``.
TORCHFT_LOG_ENV = "CORRAL_TORCHFT_LOG"
#: In a job's ``--env``: how ``sdk.fault_tolerant`` synchronises the replica groups,
#: ``ddp`` (every step, the default), ``diloco`` or ``localsgd``, and for the last two
#: the steps between syncs (``auto`` or unset: chosen from the measured sync and step
#: times, see ``sdk.fault_tolerant``). The script's own ``sync=``/``every=`` win.
FT_SYNC_ENV = "CORRAL_FT_SYNC"
FT_SYNC_EVERY_ENV = "CORRAL_FT_SYNC_EVERY"
FT_SYNC_MODES: tuple[str, ...] = ("ddp", "diloco", "localsgd")
"""The values of ``CORRAL_FT_SYNC`` (``corral run --ft-sync``)."""
#: ``corral serve``'s API token for its clients (``corral job``, ``corral machine``); a
#: job's supervisor and ranks never inherit it.
SERVER_TOKEN_ENV = "CORRAL_TOKEN"

#: Every variable corral itself sets on a rank (DESIGN.md §5); the user's ``--env``
#: may not override these. All but :data:`AGENT_VARS` are in the plan.
CONTRACT_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "NNODES",
    "MASTER_ADDR",
    "MASTER_PORT",
    JOB_ID_ENV,
    ATTEMPT_ENV,
    *AGENT_VARS,
)

#: Every name above (the layout test keeps them out of string literals elsewhere).
NAMES: frozenset[str] = frozenset(
    value
    for key, value in dict(globals()).items()
    if key.endswith("_ENV") and isinstance(value, str) and value.startswith("CORRAL_")
)


def is_env_name(name: str) -> bool:
    """Whether ``name`` may name an environment variable everywhere corral sets one
    (a POSIX shell's ``export``, ``env``, Kubernetes, Slurm): ASCII letters, digits
    and ``_``, not starting with a digit."""
    return name.isascii() and name.isidentifier()


# --- files ------------------------------------------------------------------------------
#: The signal that makes a rank registered for stack dumps write them.
DUMP_SIGNAL: int = int(getattr(signal, "SIGUSR1", 10))
#: ``QOS_CLASS_*`` of macOS's ``<sys/qos.h>`` (the values ``--qos`` accepts).
QOS_CLASSES: dict[str, int] = {
    "user_interactive": 0x21,
    "user_initiated": 0x19,
    "utility": 0x11,
    "background": 0x09,
}

_CKPT_NAME = r"ckpt-(\d+)(?:-rank(\d+))?\.pt"
_LOCAL_HEADER = b"PK\x03\x04"


def stack_file(node_dir: str | os.PathLike[str], rank: int) -> Path:
    """Where rank ``rank`` writes its faulthandler stack dumps under ``node_dir``."""
    from pathlib import Path

    return Path(node_dir) / "stacks" / f"rank-{rank}.txt"


def error_file_path(env: Mapping[str, str] | None = None) -> str | None:
    """Where a rank's error file goes, from the environment (None: nowhere)."""
    e = os.environ if env is None else env
    return e.get(ERROR_FILE_ENV) or e.get(TORCHELASTIC_ERROR_FILE_ENV) or None


def read_error_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None if it is missing or not a JSON object."""
    import json

    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def auth_line(token: str) -> bytes:
    """The first line of every connection to the node agent's control socket."""
    return b"auth " + token.encode("ascii", "replace") + b"\n"


def checkpoint_files(
    directory: str | os.PathLike[str], rank: int | None = None
) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint-named file of this rank family, oldest first.

    ``rank=None`` means the rank-0 files (``ckpt-N.pt``), an integer the
    ``ckpt-N-rankR.pt`` ones. Temp files never match; completeness is not checked
    (see :func:`is_complete_checkpoint`).
    """
    import re
    from pathlib import Path

    found: list[tuple[int, Path]] = []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for entry in entries:
        m = re.fullmatch(_CKPT_NAME, entry.name)
        if m is None:
            continue
        file_rank = None if m.group(2) is None else int(m.group(2))
        if file_rank == rank and entry.is_file():
            found.append((int(m.group(1)), Path(entry.path)))
    found.sort()
    return found


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename in ``directory`` durable; filesystems that refuse it are ignored."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory
    finally:
        os.close(fd)


def is_complete_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Cheap structural check that ``path`` is a whole ``torch.save`` archive."""
    import zipfile  # here: every rank imports this module, few read an archive

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh, zipfile.ZipFile(fh) as archive:
            entries = archive.infolist()
            if not any(e.filename.endswith("data.pkl") for e in entries):
                return False
            last = max(entries, key=lambda e: e.header_offset)
            if any(e.header_offset + e.compress_size > size for e in entries):
                return False
            fh.seek(last.header_offset)
            header = fh.read(30)
            if len(header) < 30 or header[:4] != _LOCAL_HEADER:
                return False
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            end = last.header_offset + 30 + int(name_len) + int(extra_len) + last.compress_size
            return end <= size
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, struct.error):
        return False


# --- the job config's adjustment ----------------------------------------------------------
ScaleRule = Literal["linear", "sqrt", "none"]
ScaleBy = Literal["global_batch", "world_size"]

_RULES: tuple[str, ...] = ("linear", "sqrt", "none")
_SCALE_BY: tuple[str, ...] = ("global_batch", "world_size")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def scale(
    *,
    batch_size: int,
    lr: float,
    world_size: int,
    rule: ScaleRule = "linear",
    base_batch_size: int | None = None,
    scale_by: ScaleBy = "global_batch",
    stacklevel: int = 2,
) -> dict[str, Any]:
    """The batch split and learning-rate scaling of ``sdk.scale_config`` (which
    documents the rules), without the rank's own fields: ``batch_size`` (per
    device), ``lr``, ``global_batch_size``, ``base_batch_size``, ``base_lr``,
    ``lr_scale``, ``lr_scale_rule``, ``lr_scale_by``, ``world_size``."""
    batch_size = _positive_int("batch_size", batch_size)
    world = _positive_int("world_size", world_size)
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if rule not in _RULES:
        raise ValueError(f"unknown lr scaling rule {rule!r} (use 'linear', 'sqrt' or 'none')")
    if scale_by not in _SCALE_BY:
        raise ValueError(f"unknown scale_by {scale_by!r} (use 'global_batch' or 'world_size')")
    if base_batch_size is not None:
        base_batch_size = _positive_int("base_batch_size", base_batch_size)
        if scale_by == "world_size":
            raise ValueError(
                "base_batch_size applies to scale_by='global_batch'; with "
                "scale_by='world_size' the lr is taken as tuned at the per-device batch"
            )
    if batch_size < world:
        raise ValueError(
            f"global batch_size {batch_size} is smaller than world_size {world}: "
            "every rank needs at least one example per step"
        )
    per_device = batch_size // world
    if per_device * world != batch_size:
        warnings.warn(
            f"batch_size {batch_size} is not divisible by world_size {world}; "
            f"using {per_device} per device (global {per_device * world})",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )
    global_batch = per_device * world
    if scale_by == "world_size":
        reference = per_device
    else:
        reference = batch_size if base_batch_size is None else base_batch_size
    ratio = global_batch / reference
    if rule == "linear":
        factor = ratio
    elif rule == "sqrt":
        factor = math.sqrt(ratio)
    else:
        factor = 1.0
    return {
        "batch_size": per_device,
        "lr": lr * factor,
        "global_batch_size": global_batch,
        "base_batch_size": reference,
        "base_lr": lr,
        "lr_scale": factor,
        "lr_scale_rule": rule,
        "lr_scale_by": scale_by,
        "world_size": world,
    }


def adjust_config(
    config: Mapping[str, Any],
    world_size: int,
    *,
    rule: ScaleRule = "linear",
    batch_size_key: str = "batch_size",
    lr_key: str = "learning_rate",
    output_dir_key: str = "output_dir",
    require: bool = True,
) -> dict[str, Any]:
    """A whole job's config adjusted once for ``world_size`` (the seed's adjustments,
    used by ``corral serve`` and the plugin harness): the batch divided by the world
    size, the learning rate scaled by it (:func:`scale` with
    ``scale_by="world_size"``), and the distributed metadata under ``distributed``
    (which ``sdk.job_config`` reads on each rank for the rank-0-only output rule).

    With ``require`` a missing batch size or learning rate is a ``ValueError`` (as
    is a bad value); without it, what is missing is left alone.
    """
    out = dict(config)
    batch, lr = out.get(batch_size_key), out.get(lr_key)
    if require and (batch is None or lr is None):
        raise ValueError(f"needs config[{batch_size_key!r}] and config[{lr_key!r}]")
    meta: dict[str, Any] = {"world_size": world_size}
    if batch is not None:
        scaled = scale(
            batch_size=batch, lr=1.0, rule=rule, scale_by="world_size", world_size=world_size
        )
        out[batch_size_key] = scaled["batch_size"]
        meta["global_batch_size"] = scaled["global_batch_size"]
    if lr is not None:
        # with no batch size, a global batch of one example per rank: the factor is
        # the world size's (linear), its square root or 1, as with one
        scaled = scale(
            batch_size=batch if batch is not None else world_size,
            lr=lr,
            rule=rule,
            scale_by="world_size",
            world_size=world_size,
        )
        out[lr_key] = scaled["lr"]
        meta.update(
            base_lr=scaled["base_lr"],
            lr_scale=scaled["lr_scale"],
            lr_scale_rule=scaled["lr_scale_rule"],
        )
    meta.update(output_dir_key=output_dir_key, rank0_only_output=output_dir_key in out)
    out["distributed"] = meta
    return out


def positive_numbers(raw: str, source: str, *, zero: bool = False) -> list[float]:
    """The entries of the comma-separated ``raw`` (a weight list: ``--workload-weights``,
    the SDK's env variables); ValueError naming ``source`` and the entry when one is not
    a finite positive number (``zero``: or 0)."""
    values: list[float] = []
    for position, part in enumerate(p.strip() for p in raw.split(",")):
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            what = "a number >= 0" if zero else "a positive number"
            raise ValueError(f"{source}={raw!r}: entry {position} ({part!r}) is not {what}")
        values.append(value)
    return values
