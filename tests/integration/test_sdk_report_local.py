"""``sdk.report`` and ``sdk.section`` in a fast loop, through a real node agent
(``local:2``, stdlib ranks): every step reaches the coordinator, in order,
the last ones as the rank exits (before the rank's exit is known)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from corral.cluster.hostfile import load_cluster
from corral.job.engine import Job
from corral.job.events import JobEvent, Progress, RankExited
from corral.job.options import CheckPolicy
from corral.job.states import JobState
from corral.plan.spec import JobSpec

STEPS = 3000

SCRIPT = """
import sys
from corral import sdk

steps = int(sys.argv[1])
for step in range(1, steps + 1):
    with sdk.section("compute"):
        pass
    sdk.report(step, steps, loss=step / steps)
"""


def test_every_step_of_a_fast_loop_reaches_the_coordinator(tmp_path: Path) -> None:
    script = tmp_path / "fast.py"
    script.write_text(SCRIPT)
    spec = JobSpec(
        script=str(script),
        args=(str(STEPS),),
        launcher="python",
        job_id="fastreports",
        master_port=0,
        workdir=str(tmp_path),
        run_dir=str(tmp_path / "runs"),
    )
    job = Job(spec, load_cluster("local:2"), checks=CheckPolicy(enabled=False))
    events: list[JobEvent] = []
    job.subscribe(events.append)
    result = asyncio.run(asyncio.wait_for(job.run(), 300))
    assert result.state == JobState.SUCCEEDED, result.reason
    for rank in (0, 1):
        mine = [e for e in events if isinstance(e, Progress) and e.rank == rank]
        assert [e.step for e in mine] == list(range(1, STEPS + 1))  # nothing lost, in order
        assert mine[-1].metrics == {"loss": 1.0}  # the last one too, sent as the rank exited
        assert all(e.total == STEPS for e in mine)
        exited = next(e for e in events if isinstance(e, RankExited) and e.rank == rank)
        assert events.index(mine[-1]) < events.index(exited)  # flushed before the exit code
    records = [r for node in result.nodes for r in node.ranks.values()]
    assert sorted((r.rank, (r.progress or {}).get("step")) for r in records) == [
        (0, STEPS),
        (1, STEPS),
    ]
