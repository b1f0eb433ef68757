"""How a calibration shows on the terminal (``corral calibrate`` and ``corral run
--calibration auto``): its job's output while it measures, then its table."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from corral.calibrate.measure import Calibrator
from corral.cluster.model import Cluster
from corral.job.events import Finished, JobEvent, Message
from corral.job.output import TerminalOutput
from corral.job.states import JobState
from corral.job.summary import print_finished
from corral.throughput.model import Calibration

_BAR = 30


def _bar(share: float, top: float) -> str:
    return "█" * max(1, round(_BAR * share / top)) if top > 0 else ""


def print_calibration(calibration: Calibration, console: Console) -> None:
    """The table (host, rank, examples/s, share, the micro-batch it fits, the step's
    fixed cost where measured, bar), a total row per host with several ranks, then
    the notes."""
    what = "script " + " ".join(calibration.script) if calibration.script else "built-in workload"
    table = Table(
        title=f"calibration {calibration.job_id} ({calibration.seconds:g} s, {what})",
        title_justify="left",
    )
    table.add_column("host")
    fixed = any(r.step_fixed_s is not None for r in calibration.ranks)  # a step's fixed cost
    for column in ("rank", "ex/s", "share", "fits", *(("fixed ms",) if fixed else ())):
        table.add_column(column, justify="right")
    table.add_column("", no_wrap=True)
    top = max(r.share for r in calibration.ranks)
    for host in calibration.hosts:
        ranks = calibration.host_ranks(host)
        for rank in ranks:
            table.add_row(
                host,
                str(rank.rank),
                f"{rank.examples_per_s:.1f}",
                f"{rank.share:.3f}",
                "-" if rank.fits is None else str(rank.fits),
                *(
                    ("-" if rank.step_fixed_s is None else f"{rank.step_fixed_s * 1000:.1f}",)
                    * fixed
                ),
                _bar(rank.share, top),
            )
        if len(ranks) > 1:
            table.add_row(
                f"{host} total",
                "",
                f"{calibration.measured_performance.get(host, 0.0):.1f}",
                f"{calibration.workload_distribution.get(host, 0.0):.3f}",
                "",
                *(("",) * fixed),
                "",
                style="bold",
            )
    console.print(table)
    console.print(calibration.calibration_notes, markup=False, soft_wrap=True)


class CalibrationTerminal:
    """A calibration job's output on the terminal (stderr with ``to_stderr``), quiet
    about the stop that ends every measurement; :meth:`watch` a calibrator, then
    :meth:`close`."""

    def __init__(self, cluster: Cluster, console: Console, *, to_stderr: bool = False) -> None:
        self.console = console
        self.output = TerminalOutput(
            [h.name for h in cluster.hosts], stream=sys.stderr.buffer if to_stderr else None
        )

    def watch(self, calibrator: Calibrator) -> None:
        """Show ``calibrator``'s job events."""

        def on_event(event: JobEvent) -> None:
            if calibrator.stopping and isinstance(event, Message):
                return  # the teardown that ends every calibration is not news
            if isinstance(event, Finished):
                self.output.close()
                if event.state == JobState.FAILED and not calibrator.stopping:
                    print_finished(event, self.console)
                return
            self.output.on_event(event)

        calibrator.subscribe(on_event)

    def close(self) -> None:
        """End the output (flushes what is pending)."""
        self.output.close()
