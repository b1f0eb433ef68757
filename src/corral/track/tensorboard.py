"""``--track tensorboard:DIR``: the job's scalars and text in ``DIR/<job id>``.

Written with TensorBoard's own event-file writer and summary protos (no torch,
no TensorFlow): one scalar series per metric name (``simple_value``, as every
reader and TensorBoard's Scalars tab take it), the parameters and the final state
as text (the Text tab), the exit code as a scalar.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from corral.track.base import FinalState, ParamValue, Point, RunInfo
from corral.track.targets import TrackTarget


def scalar(tag: str, value: float) -> summary_pb2.Summary:
    """A scalar summary as the classic ``simple_value``."""
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])


def _table(values: Mapping[str, ParamValue]) -> str:
    """``values`` as a Markdown table (what the Text tab renders)."""
    rows = [f"| {k} | {str(v).replace('|', '/')} |" for k, v in values.items()]
    return "\n".join(["| name | value |", "| --- | --- |", *rows])


class TensorBoardTracker:
    """Event files of one job under the target's directory."""

    def __init__(self, target: TrackTarget) -> None:
        self.target = target
        self._writer: EventFileWriter | None = None
        self._last_step = 0

    @property
    def writer(self) -> EventFileWriter:
        """The open writer (after :meth:`start`)."""
        if self._writer is None:
            raise RuntimeError("the run is not started")
        return self._writer

    def start(self, run: RunInfo) -> None:
        """Create ``DIR/<job id>`` and write the parameters."""
        directory = Path(self.target.where).expanduser() / run.job_id
        directory.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(directory))
        self._write(text_pb("params", _table(run.params)), 0)

    def log(self, points: Sequence[Point]) -> None:
        """One scalar event per point."""
        for point in points:
            self._write(scalar(point.name, point.value), point.step, point.time)
            self._last_step = max(self._last_step, point.step)
        self.writer.flush()

    def finish(self, final: FinalState) -> None:
        """The final state as text (at the last step), the exit code as a scalar."""
        values: dict[str, ParamValue] = {
            "state": final.state,
            "exit_code": final.exit_code,
            "attempts": final.attempts,
        }
        if final.reason:
            values["reason"] = final.reason
        values.update(final.summary)
        self._write(text_pb("final_state", _table(values)), self._last_step)
        self._write(scalar("exit_code", final.exit_code), self._last_step)
        self.writer.close()

    def _write(self, summary: object, step: int, wall_time: float | None = None) -> None:
        wall = time.time() if wall_time is None else wall_time
        self.writer.add_event(event_pb2.Event(wall_time=wall, step=step, summary=summary))
