"""corral's built-in calibration workload: training steps of a reference model.

Run on every rank by ``corral calibrate`` when no script is given (the
coordinator never imports this module: it needs torch). Each rank trains its
own copy of a small MLP on a fixed random batch (forward, loss, backward, a plain
SGD update; no process group, so no rank waits for another) and reports the examples
it processed through ``sdk.report(step, examples=n)`` about four times a
second, until corral stops it (or ``--max-seconds`` pass). The model is sized
to the device: wider and with a bigger batch on a GPU, where a small one would
only measure kernel-launch overhead. On a GPU, or under a declared memory cap
(``CORRAL_MEM_CAP_MB``), it first probes the largest micro-batch a training step
fits (``sdk.probe_fit``: doubling, then bisecting, out-of-memory caught), reports
it as ``fits`` and measures its rate at the micro-batch it fits. Also runs by hand::

    python -m corral.calibrate.reference --max-seconds 10
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

try:
    from corral import sdk
except ImportError:  # a host whose corral is not importable from this path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from corral import sdk
from corral.contract import MEM_CAP_ENV

#: (width, depth, batch) per device kind.
SIZES = {"cpu": (512, 3, 64), "mps": (2048, 4, 256), "cuda": (4096, 4, 512)}
REPORT_EVERY = 0.25
#: The reference model's SGD learning rate.
LR = 1e-3
#: The largest micro-batch probed, as a multiple of the device's batch.
PROBE_UP_TO = {"cpu": 16, "mps": 64, "cuda": 128}


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (default: this host's cores over its ranks)",
    )
    parser.add_argument("--max-seconds", type=float, default=3600.0)
    return parser.parse_args(argv)


def _device(torch: Any) -> Any:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local % torch.cuda.device_count())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _zero_grad(params: list[Any]) -> None:
    """Drop the parameters' gradients (``optimizer.zero_grad(set_to_none=True)``)."""
    for param in params:
        param.grad = None


def _sgd_step(torch: Any, params: list[Any]) -> None:
    """Plain SGD (``torch.optim.SGD(lr=LR).step()``, no momentum), written out: a
    ``torch.optim`` step imports ``torch._dynamo``, 1.3 CPU-s more per rank than the
    rest of this workload's start, paid on every host at every calibration."""
    with torch.no_grad():
        for param in params:
            if param.grad is not None:
                param.add_(param.grad, alpha=-LR)


def main(argv: list[str] | None = None) -> int:
    """Train until stopped, reporting examples; prints the overall rate at the end."""
    args = _args(argv)
    import torch
    from torch import nn

    me = sdk.info()
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, me.local_world_size))
    torch.set_num_threads(threads)
    device = _device(torch)
    width, depth, batch = SIZES[device.type]
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, 10)).to(device)
    params = list(model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    fitted: int | None = None
    if device.type == "cuda" or os.environ.get(MEM_CAP_ENV, "").strip():

        def probe(size: int) -> None:
            inputs = torch.randn(size, width, device=device)
            labels = torch.randint(0, 10, (size,), device=device)
            _zero_grad(params)
            loss_fn(model(inputs), labels).backward()
            _sync(torch, device)

        fit = sdk.probe_fit(probe, limit=batch * PROBE_UP_TO[device.type], params=params)
        _zero_grad(params)
        if fit.limited:
            fitted = fit.batch
            batch = min(batch, fit.batch)
        print(
            f"rank {me.rank}: a step fits a micro-batch of "
            + (f"{fit.batch}" if fit.limited else f"{fit.batch} or more"),
            flush=True,
        )
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    started = last = time.monotonic()
    step = pending = 0
    while True:
        _zero_grad(params)
        loss_fn(model(x), y).backward()
        _sgd_step(torch, params)
        step += 1
        pending += batch
        now = time.monotonic()
        if now - last >= REPORT_EVERY:
            _sync(torch, device)
            if fitted is None:
                sdk.report(step, examples=pending)
            else:  # the micro-batch this rank fits, recorded by corral calibrate
                sdk.report(step, examples=pending, fits=fitted)
            pending, last = 0, time.monotonic()
            if last - started >= args.max_seconds:
                break
    rate = step * batch / (time.monotonic() - started)
    print(f"rank {me.rank} ({device.type}, {threads} threads): {rate:.1f} examples/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
