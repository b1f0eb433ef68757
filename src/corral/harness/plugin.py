"""Rank-time side of the harness: run an unmodified plugin in distributed mode.

What seed 002's ``plugin_harness.py --distributed_mode`` does, in corral's rank
wrapper: make the ``Accelerator`` (``find_unused_parameters=True``, so any
plugin's model works under DDP), hand it over as ``sys.modules['__main__']
.accelerator`` and :func:`corral.sdk.get_accelerator`, set the detection variables
(``DISTRIBUTED_TRAINING=true``, ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``,
``IS_MAIN_PROCESS``), write this rank's config (the plan's adjusted config plus
:func:`corral.sdk.job_config`'s per-rank fields) to the node dir and point the
plugin's ``--config_file`` at it; then import the plugin's ``main`` (and call its
``main()``), or run the script as ``__main__``.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from corral.contract import ATTEMPT_ENV, NODE_DIR_ENV
from corral.harness.config import replace_config
from corral.private import private_dir, write_private
from corral.sdk import job_config
from corral.sdk.runtime import set_accelerator


def make_accelerator() -> Any:
    """The job's Accelerator, as seed 002's harness makes it."""
    from accelerate import Accelerator, DistributedDataParallelKwargs

    return Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])


def expose(accelerator: Any) -> None:
    """Hand ``accelerator`` to the plugin and set the detection variables."""
    main = sys.modules.get("__main__")
    if main is not None:
        main.accelerator = accelerator  # type: ignore[attr-defined]
    set_accelerator(accelerator)
    os.environ.update(
        DISTRIBUTED_TRAINING="true",
        WORLD_SIZE=str(accelerator.num_processes),
        RANK=str(accelerator.process_index),
        LOCAL_RANK=str(accelerator.local_process_index),
        IS_MAIN_PROCESS=str(accelerator.is_main_process),
    )


def rank_config_file(node_dir: str, attempt: str, rank: int) -> Path:
    """Where this rank's adjusted config is written (private to the user)."""
    return Path(node_dir) / "harness" / f"attempt-{attempt}-rank-{rank}.json"


def write_rank_config(args: list[str]) -> tuple[list[str], str | None]:
    """Write this rank's config and point ``--config_file`` at it: the new args and
    the file (None when the job has no config)."""
    config = job_config()
    if config is None:
        return args, None
    node_dir = os.environ.get(NODE_DIR_ENV) or "."
    path = rank_config_file(node_dir, os.environ.get(ATTEMPT_ENV, "0"), config["rank"])
    private_dir(path.parent)
    write_private(path, json.dumps(config, indent=2) + "\n")
    return replace_config(args, str(path)), str(path)


def run(script: str, mode: str) -> None:
    """Run the plugin (``mode`` ``plugin``) or script with ``sys.argv[1:]`` as its
    arguments, under the harness."""
    accelerator = make_accelerator()
    expose(accelerator)
    args, config = write_rank_config(sys.argv[1:])
    sys.argv = [script, *args]
    print(
        f"corral harness: rank {accelerator.process_index}/{accelerator.num_processes} "
        f"({accelerator.distributed_type.value}), config {config or '-'}",
        flush=True,
    )
    if mode == "plugin":
        plugin = importlib.import_module(Path(script).stem)
        entry = getattr(plugin, "main", None)
        if callable(entry):
            entry()
    else:
        runpy.run_path(script, run_name="__main__", init_globals={"accelerator": accelerator})
