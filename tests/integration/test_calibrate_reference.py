"""corral's built-in calibration workload (``corral.calibrate.reference``) run by hand:
it trains with a plain SGD update written out, so its ranks never import
``torch._dynamo`` (a ``torch.optim`` step does: 1.3 CPU-s more per rank, on every
host at every calibration), and that update is ``torch.optim.SGD``'s. One
interpreter, real torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch

SCRIPT = """
import json, runpy, sys
sys.argv = ["reference", "--max-seconds", "0.5"]
try:
    runpy.run_module("corral.calibrate.reference", run_name="__main__")
except SystemExit as exc:
    code = exc.code
dynamo = "torch._dynamo" in sys.modules
import torch
from corral.calibrate.reference import LR, _sgd_step, _zero_grad
torch.manual_seed(1)
ours, theirs = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
theirs.load_state_dict(ours.state_dict())
optimizer = torch.optim.SGD(theirs.parameters(), lr=LR)
x = torch.randn(8, 4)
for _ in range(3):
    _zero_grad(list(ours.parameters()))
    ours(x).square().sum().backward()
    _sgd_step(torch, list(ours.parameters()))
    optimizer.zero_grad(set_to_none=True)
    theirs(x).square().sum().backward()
    optimizer.step()
same = all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))
print(json.dumps({"code": code, "dynamo": dynamo, "same": same}))
"""


def test_the_reference_workload_trains_with_sgd_without_importing_dynamo() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "examples/s" in done.stdout  # it measured
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"code": 0, "dynamo": False, "same": True}
