"""Workload of bench_sdk.py: what ``sdk.report`` and ``sdk.section`` cost a training
step, measured inside a live job (the rank's real control socket and node agent).

Runs the same loop body in four modes, ``plain`` (no SDK call), ``report``
(``sdk.report(step, total, loss=...)`` every step), ``section`` (the body inside
``with sdk.section("compute")``) and ``both``, round after round in a rotating
order. Steps run in timed blocks of ``--block`` steps, paced to ``--rate`` steps
per second (a fast GPU step is ~1-2 ms). Per mode it records:

* ``cpu``: this process's CPU seconds (every thread: the reporter's sends too)
  over the mode, and a pause after it in which the last reports are sent;
* ``blocks``: the wall seconds of each block of steps (what the training thread
  itself spends).

Steps are numbered across the modes that report, so the benchmark can check that
every report reached the coordinator. Writes the samples as JSON to ``--out``.

usage: sdk_overhead.py --out FILE [--steps 6000] [--rounds 5] [--block 100] [--rate 2000]
"""

from __future__ import annotations

import argparse
import json
import time

from corral import sdk

MODES = ("plain", "report", "section", "both")


def run_mode(mode: str, steps: int, block: int, rate: float, first: int) -> dict[str, object]:
    """One mode: ``steps`` steps from step number ``first``; its samples."""
    report = mode in ("report", "both")
    timed = mode in ("section", "both")
    blocks: list[float] = []
    value = 0.0
    step = first
    pause = block / rate
    cpu0 = time.process_time()
    next_block = time.perf_counter()
    for _ in range(steps // block):
        began = time.perf_counter()
        if report and timed:
            for _ in range(block):
                with sdk.section("compute"):
                    value += 1.0
                step += 1
                sdk.report(step, None, loss=1.0 / value)  # 17 digits, as a loss has
        elif report:
            for _ in range(block):
                value += 1.0
                step += 1
                sdk.report(step, None, loss=1.0 / value)  # 17 digits, as a loss has
        elif timed:
            for _ in range(block):
                with sdk.section("compute"):
                    value += 1.0
        else:
            for _ in range(block):
                value += 1.0
        blocks.append(time.perf_counter() - began)
        next_block += pause
        wait = next_block - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
    time.sleep(0.5)  # the reporter sends what is left (every 0.2 s)
    return {"cpu": time.process_time() - cpu0, "blocks": blocks, "last_step": step}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--rate", type=float, default=2000.0)
    args = parser.parse_args()
    samples: dict[str, list[dict[str, object]]] = {mode: [] for mode in MODES}
    step = 0
    sdk.report(step)  # the connection is made before anything is timed
    time.sleep(0.5)
    for index in range(args.rounds):
        order = MODES[index % len(MODES) :] + MODES[: index % len(MODES)]
        for mode in order:
            result = run_mode(mode, args.steps, args.block, args.rate, step)
            step = int(result["last_step"])  # type: ignore[call-overload]
            samples[mode].append(result)
    with open(args.out, "w") as out:
        json.dump({"samples": samples, "reported": step, "config": vars(args)}, out)


if __name__ == "__main__":
    main()
