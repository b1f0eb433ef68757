"""examples/actors_fsdp.py over real SSH on the netns testbed: tb1 and tb2, 2 workers each.

The coordinator runs here (in the shared ``tmp_path``, which every host sees at
the same path); the workers load the example from the repository, rendezvous
with gloo at tb1:29500, train with FSDP2 and write their checkpoint shards.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from corral.testbed import Testbed
from tests.conftest import require_torch

from ..conftest import REPO
from .test_actors_netns import wait_gone

pytestmark = [pytest.mark.netns, pytest.mark.torch]

EXAMPLE = REPO / "examples" / "actors_fsdp.py"
STEPS = 8


def test_the_example_trains_on_two_hosts_and_leaves_no_worker(
    testbed: Testbed, tmp_path: Path
) -> None:
    require_torch()
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("tb1 slots=2\ntb2 slots=2\n")
    ckpt = tmp_path / "ckpt"
    args = ["--hosts", str(hostfile), "--ssh-config", str(testbed.ssh_config)]
    args += ["--steps", str(STEPS), "--checkpoint-dir", str(ckpt), "--device", "cpu"]
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}"
    job = re.search(r"^Cluster (actors-\S+): 4 workers on tb1, tb2$", done.stdout, re.M)
    assert job, done.stdout
    losses = [float(x) for x in re.findall(r"^Step \d+: loss=([\d.]+),", done.stdout, re.M)]
    assert len(losses) == STEPS and losses[-1] < 0.75 * losses[0], losses
    assert "[tb2:3] rank 3/4: fsdp on cpu" in done.stderr
    saved = ckpt / f"step_{STEPS:08d}"
    assert sorted(p.name for p in saved.iterdir()) == [f"rank_{r:05d}" for r in range(4)]
    assert wait_gone(testbed, job[1], 15) == {}
