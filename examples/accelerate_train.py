"""An ordinary Hugging Face Accelerate training script (nothing corral-specific).

Fits y = 3x + 2 with a linear model, data-parallel over however many processes
Accelerate was started with. Run it with ``accelerate launch`` or, across hosts,
``corral run --launcher accelerate --hosts ... -- examples/accelerate_train.py``.
"""

from __future__ import annotations

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    accelerator = Accelerator()
    set_seed(0)
    x = torch.linspace(-1, 1, 256).unsqueeze(1)
    y = 3 * x + 2
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    print(
        f"process {accelerator.process_index} of {accelerator.num_processes} "
        f"({accelerator.distributed_type.value}) on {accelerator.device}",
        flush=True,
    )
    seen = 0
    for epoch in range(args.epochs):
        model.train()
        for inputs, targets in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            seen += len(inputs)
        losses = accelerator.gather(loss.detach().reshape(1))
        accelerator.print(f"epoch {epoch}: mean loss {losses.mean().item():.4f}")

    counts = accelerator.gather(torch.tensor([seen]))
    accelerator.print(f"examples per process: {counts.tolist()}, total {int(counts.sum())}")
    weight = accelerator.unwrap_model(model).weight.item()
    accelerator.print(f"weight {weight:.3f} (target 3)")
    accelerator.end_training()


if __name__ == "__main__":
    main()
