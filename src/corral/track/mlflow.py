"""``--track mlflow:URI``: one MLflow run per job, through MLflow's client.

The run is named after the job's ``--name`` (its id when it has none; tags
``corral.job_id``, ``corral.owner`` and MLflow's own ``mlflow.user``: who submitted
it) in the experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``corral``); parameters are logged once,
metrics in batches, and the run ends FINISHED, FAILED or KILLED with the tags
``corral.state`` and ``corral.reason`` and the metric ``exit_code``. Credentials
come from MLflow's own variables (``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``/
``_TOKEN``), never from the URI. A ``file:`` store (which MLflow 3 keeps in
maintenance mode) is used as asked: ``MLFLOW_ALLOW_FILE_STORE`` is set for it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from urllib.parse import urlsplit

from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from corral.track.base import FinalState, Point, RunInfo
from corral.track.targets import TrackTarget

EXPERIMENT = "corral"
BATCH = 1000  # MLflow's limit of metrics per log_batch
MAX_PARAM = 6000  # MLflow's limit of a param value's length
_STATUS = {"succeeded": "FINISHED", "cancelled": "KILLED"}


def _file_store(uri: str) -> bool:
    return urlsplit(uri).scheme in ("", "file")


class MlflowTracker:
    """One MLflow run of one job."""

    def __init__(self, target: TrackTarget) -> None:
        self.target = target
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # not its table creation
        if _file_store(target.where):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=target.where)
        self.run_id = ""

    def _experiment(self) -> str:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except MlflowException:  # another job created it meanwhile
            again = self.client.get_experiment_by_name(name)
            if again is None:
                raise
            return str(again.experiment_id)

    def start(self, run: RunInfo) -> None:
        """Create the run and log the job's parameters."""
        tags = {"corral.job_id": run.job_id}
        if run.owner:
            tags.update({"corral.owner": run.owner, "mlflow.user": run.owner})
        created = self.client.create_run(self._experiment(), run_name=run.title, tags=tags)
        self.run_id = created.info.run_id
        params = [Param(k, str(v)[:MAX_PARAM]) for k, v in run.params.items()]
        self.client.log_batch(self.run_id, params=params)

    def log(self, points: Sequence[Point]) -> None:
        """Log ``points`` in batches of at most :data:`BATCH`."""
        metrics = [Metric(p.name, p.value, int(p.time * 1000), p.step) for p in points]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + BATCH])

    def finish(self, final: FinalState) -> None:
        """Tag the final state, log the exit code and end the run."""
        self.client.set_tag(self.run_id, "corral.state", final.state)
        if final.reason:
            self.client.set_tag(self.run_id, "corral.reason", final.reason[:MAX_PARAM])
        self.client.log_metric(self.run_id, "exit_code", final.exit_code)
        self.client.log_metric(self.run_id, "attempts", final.attempts)
        for key, value in final.summary.items():
            self.client.set_tag(self.run_id, f"corral.{key}", str(value)[:MAX_PARAM])
        self.client.set_terminated(self.run_id, _STATUS.get(final.state, "FAILED"))
