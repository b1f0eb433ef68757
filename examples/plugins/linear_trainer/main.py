"""A training plugin in the style of seed 002's TransformerLab plugins: it reads its
JSON config from ``--config_file`` and, in distributed mode, uses the accelerator
the harness gives it (``sys.modules['__main__'].accelerator``). Nothing in it is
specific to corral except the optional ``corral.sdk.get_accelerator`` fallback.

    corral run --harness --hosts HOSTS -- examples/plugins/linear_trainer \
        --config_file examples/plugins/linear_trainer/config.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset


def _accelerator():  # type: ignore[no-untyped-def]
    given = getattr(sys.modules["__main__"], "accelerator", None)
    if given is not None:
        return given
    from corral.sdk import get_accelerator  # outside the harness: make one

    return get_accelerator()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config_file", required=True)
    args, _ = parser.parse_known_args()
    with open(args.config_file, encoding="utf-8") as handle:
        config = json.load(handle)

    accelerator = _accelerator()
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 256).unsqueeze(1)
    loader = DataLoader(TensorDataset(x, 3 * x + 2), batch_size=config["batch_size"])
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["learning_rate"])
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    print(
        f"plugin: rank {accelerator.process_index}/{accelerator.num_processes} "
        f"batch_size={config['batch_size']} learning_rate={config['learning_rate']:g} "
        f"output_dir={config['output_dir']} steps/epoch={len(loader)}",
        flush=True,
    )
    for _ in range(config.get("epochs", 1)):
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
    losses = accelerator.gather(loss.detach().reshape(1))
    if accelerator.is_main_process:
        os.makedirs(config["output_dir"], exist_ok=True)
        with open(os.path.join(config["output_dir"], "result.json"), "w") as out:
            json.dump({"loss": losses.mean().item(), "world": accelerator.num_processes}, out)
        print(f"plugin: saved to {config['output_dir']}", flush=True)


if __name__ == "__main__":
    main()
