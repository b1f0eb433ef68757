"""How fast the ``corral`` command starts: ``--version``, ``--help`` and one verb's help.

Each command runs ``--rounds`` times as a new process (``python -m corral ...``,
the commands interleaved so that a busy spell of the machine hits all of them
alike); the figure is the median wall time from start to exit. Baseline: ``python
-c pass`` with the same interpreter, measured in the same rounds. The verbs are
loaded lazily, so ``--version`` and ``--help`` import no verb module (target:
<= 0.3 s); ``corral run --help`` imports the ``run`` verb and the job engine (info).

    python benchmarks/bench_cli_start.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from typing import Any

from benchlib import PYTHON, bench_env, corral_cli, finish, log, median, metric, ratio

NAME = "cli_start"
TARGET_S = 0.3
COMMANDS: dict[str, list[str]] = {
    "python -c pass": [PYTHON, "-c", "pass"],
    "corral --version": [*corral_cli()[0], "--version"],
    "corral --help": [*corral_cli()[0], "--help"],
    "corral run --help": [*corral_cli()[0], "run", "--help"],
}


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds from starting ``argv`` to its exit (which must be 0)."""
    started = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    """Time every command, write ``results/cli_start.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    env = {**bench_env(), "COLUMNS": "100"}
    for command in COMMANDS.values():  # warm the file cache and the bytecode
        timed(command, env)
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for round_no in range(args.rounds):
        for name, command in COMMANDS.items():
            samples[name].append(timed(command, env))
        log(f"round {round_no + 1}: " + ", ".join(f"{n} {s[-1]:.3f} s" for n, s in samples.items()))
    medians = {name: median(values) for name, values in samples.items()}
    base = medians["python -c pass"]
    metrics: list[dict[str, Any]] = []
    for name in ("corral --version", "corral --help"):
        value = medians[name]
        metrics.append(
            metric(
                f"`{name}`, start to exit (median of {args.rounds})",
                value,
                "s",
                f"<= {TARGET_S:g} s",
                value is not None and value <= TARGET_S,
                baseline=base,
                baseline_desc="python -c pass",
                ratio_value=ratio(value, base),
            )
        )
    value = medians["corral run --help"]
    metrics.append(
        metric(
            "`corral run --help` (imports the run verb and the job engine; info)",
            value,
            "s",
            "-",
            None,
            baseline=base,
            baseline_desc="python -c pass",
            ratio_value=ratio(value, base),
        )
    )
    met = all(m["met"] for m in metrics[:2])
    status_code = finish(
        NAME,
        {
            "title": "CLI start-up time",
            "status": "ok",
            "config": {"rounds": args.rounds, "commands": COMMANDS},
            "samples": samples,
            "medians": medians,
            "metrics": metrics,
            "ratio": ratio(medians["corral --version"], base),
            "target": f"<= {TARGET_S:g} s",
            "met": met,
        },
    )
    print(", ".join(f"{name}: {value} s" for name, value in medians.items()))
    return status_code


if __name__ == "__main__":
    sys.exit(main())
