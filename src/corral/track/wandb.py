"""``--track wandb:PROJECT``: one Weights & Biases run per job.

Offline by default (``WANDB_MODE=offline`` unless the environment sets another
mode): no network, the run's files under ``<run_dir>/<job id>/wandb``, to upload
later with ``wandb sync``. Every point is logged with the job's ``step`` as its
x-axis (``define_metric``), so reports of several ranks, and steps that go back
after a restart, are all kept.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

import wandb

from corral.track.base import FinalState, Point, RunInfo
from corral.track.targets import TrackTarget

STEP = "step"


class WandbTracker:
    """One W&B run of one job."""

    def __init__(self, target: TrackTarget) -> None:
        self.target = target
        self.run: Any = None

    def start(self, run: RunInfo) -> None:
        """Open the run (offline unless WANDB_MODE says otherwise) with the params as config."""
        entity, _, project = self.target.where.rpartition("/")
        run.job_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            entity=entity or None,
            name=run.title,
            id=re.sub(r"[^A-Za-z0-9_.-]", "-", run.job_id),
            dir=str(run.job_dir),
            mode=os.environ.get("WANDB_MODE") or "offline",  # type: ignore[arg-type]
            config=dict(run.params),
            reinit="create_new",
            settings=wandb.Settings(
                silent=True, console="off", disable_git=True, disable_code=True
            ),
        )
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)

    def log(self, points: Sequence[Point]) -> None:
        """One ``log`` call per step of the batch (the step as a value, not W&B's own)."""
        by_step: dict[int, dict[str, float]] = {}
        for point in points:
            by_step.setdefault(point.step, {})[point.name] = point.value
        for step, values in by_step.items():
            self.run.log({STEP: step, **values})

    def finish(self, final: FinalState) -> None:
        """The final state in the run's summary; the run ends with the job's exit code."""
        self.run.summary["state"] = final.state
        self.run.summary["exit_code"] = final.exit_code
        self.run.summary["attempts"] = final.attempts
        if final.reason:
            self.run.summary["reason"] = final.reason
        for key, value in final.summary.items():
            self.run.summary[key] = value
        self.run.finish(exit_code=final.exit_code)
