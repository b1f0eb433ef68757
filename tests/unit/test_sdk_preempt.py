"""``sdk.checkpoint_requested()``: the "checkpoint now" request a rank polls, set by
SIGUSR2 (what corral's Slurm script sends before the time limit) or in-process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from corral import sdk
from corral.sdk._preempt import CHECKPOINT_SIGNAL
from corral.slurm.render import CHECKPOINT_SIGNAL as SLURM_SIGNAL

CHILD = """\
import os, signal, sys, time
from corral import sdk
print(sdk.checkpoint_requested(), flush=True)          # installs the handler: False
os.kill(os.getpid(), signal.SIGUSR2)
deadline = time.monotonic() + 30
while not (asked := sdk.checkpoint_requested()) and time.monotonic() < deadline:
    time.sleep(0.01)
print(asked, sdk.checkpoint_requested(), flush=True)   # once per request: True False
"""


def test_sigusr2_asks_for_one_checkpoint() -> None:
    """In a fresh process whose SIGUSR2 is ignored, as the ranks under Slurm start."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "False"]


def test_an_in_process_request_is_answered_once() -> None:
    assert sdk.checkpoint_requested(sync=False) is False
    sdk.request_checkpoint()
    assert sdk.checkpoint_requested() is True  # no process group: nothing to agree on
    assert sdk.checkpoint_requested() is False


def test_the_slurm_script_sends_the_sdk_signal() -> None:
    assert getattr(signal, f"SIG{SLURM_SIGNAL}") == CHECKPOINT_SIGNAL
    assert CHECKPOINT_SIGNAL != signal.SIGUSR1  # corral's stack dumps
    assert os.name == "posix"
