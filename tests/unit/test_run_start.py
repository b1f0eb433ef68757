"""``corral run`` starts on every launch's path: its verb module and the engine
import what a launch uses, not what only ``corral plan``, a calibration or
in-place recovery print or start (behaviour, not time: which modules load)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import corral

#: Loaded only where used: plan printing, in-place recovery (torchft), calibration.
NOT_AT_START = (
    "corral.plan.display",
    "corral.plan.inplace",
    "corral.job.inplace",
    "corral.recovery.lighthouse",
    "corral.calibrate",
    "httpx",
    "torch",
)


def _loaded_by(*imported: str) -> set[str]:
    """Every module a fresh interpreter has loaded after importing ``imported``."""
    code = f"import json, sys\nimport {', '.join(imported)}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(corral.__file__).parents[1])},
    )
    return set(json.loads(done.stdout))


def test_the_run_verb_imports_no_plan_printing_and_no_in_place_machinery() -> None:
    modules = _loaded_by("corral.cli.run")
    assert "corral.job.engine" in modules
    assert sorted(m for m in modules if m.startswith(NOT_AT_START)) == []


def test_the_coordinator_reads_agent_probes_without_psutil() -> None:
    # the coordinator validates each agent's probe (corral.agent.events) before the
    # launch; psutil is the agents' and the host checks' business, not its own
    modules = _loaded_by("corral.cli.run", "corral.job.agents", "corral.agent.events")
    assert "corral.agent.events" in modules
    assert "psutil" not in modules
