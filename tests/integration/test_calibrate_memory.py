"""Issue 33 item 5 on ``local:2``: a calibration with a declared memory cap on one
node records the micro-batch that node fits, and the run weighed by it gives that
node gradient accumulation instead of a share it cannot hold (stdlib ranks, no torch)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

from corral.throughput.model import load_calibration

from .conftest import run_corral, wait_no_job_processes

# Each rank probes a "training step" that allocates 10 kB per example (measured by
# tracemalloc); local-1 is declared to have 1 MiB, so it fits 104 examples; local-0
# has no cap and probes nothing it could run out of.
PROBING = """
import time
from corral import sdk

def step(batch):
    return len(bytearray(batch * 10_000))

fit = sdk.probe_fit(step, start=8, limit=256)
fits = {"fits": fit.batch} if fit.limited else {}
step_no = 0
while True:
    time.sleep(0.05)
    step_no += 1
    sdk.report(step_no, examples=8, **fits)
"""

# The run: every rank prints its part of a global batch of 512 as the SDK splits it.
SHOW = """
from corral import sdk

me = sdk.info()
split = sdk.memory_split(512, sdk.workload_weights(), sdk.micro_batch_fits())[me.rank]
print(f"rank {me.rank}: batch {split.batch} micro {split.micro} "
      f"accumulation {split.accumulation} sizes {list(split.sizes)}", flush=True)
"""


def test_a_capped_node_records_its_fit_and_accumulates_its_share(tmp_path: Path) -> None:
    probing = tmp_path / "probing.py"
    probing.write_text(textwrap.dedent(PROBING))
    show = tmp_path / "show.py"
    show.write_text(textwrap.dedent(SHOW))
    runs = str(tmp_path / "runs")
    done = run_corral(
        "calibrate", "--hosts", "local:2", "--run-dir", runs, "--job-id", "cal-mem",
        "--seconds", "2", "--mem-cap", "local-1=1", "--", str(probing),
        cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"local-1\s.*\s104\s", done.stdout), done.stdout  # the "fits" column
    cal = load_calibration(tmp_path / "runs" / "cal-mem" / "calibration.json")
    assert [(r.host, r.fits) for r in cal.ranks] == [("local-0", None), ("local-1", 104)]
    assert "Memory caps the micro-batch of local-1:1 at 104" in cal.calibration_notes
    assert not wait_no_job_processes("cal-mem", within=15)

    path = tmp_path / "runs" / "cal-mem" / "calibration.json"
    run = run_corral(
        "run", "--hosts", "local:2", "--launcher", "python", "--run-dir", runs,
        "--job-id", "run-mem", "--no-preflight", "--master-port", "0",
        "--calibration", str(path), "--", str(show),
        cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:] + run.stdout[-3000:]
    assert "micro-batch fits (host:local rank): local-1:0 104;" in run.stdout
    lines = dict(re.findall(r"rank (\d): (batch .*)", run.stdout))
    weights = json.loads(path.read_text())["hardware_calibration"]["ranks"]
    b1 = round(512 * weights[1]["share"])
    accumulation = -(-b1 // 104)
    assert lines["1"].startswith(f"batch {b1} micro {-(-b1 // accumulation)} ")
    assert f"accumulation {accumulation} " in lines["1"] and accumulation >= 2, lines
    assert lines["0"] == f"batch {512 - b1} micro {512 - b1} accumulation 1 sizes [{512 - b1}]"
