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


def _python(code: str, cwd: Path | None = None) -> str:
    """What a fresh interpreter running ``code`` prints (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(corral.__file__).parents[1])},
    )
    return done.stdout


def _loaded_by(*imported: str) -> set[str]:
    """Every module a fresh interpreter has loaded after importing ``imported``."""
    code = f"import json, sys\nimport {', '.join(imported)}\nprint(json.dumps(sorted(sys.modules)))"
    return set(json.loads(_python(code)))


def test_the_run_verb_imports_no_plan_printing_and_no_in_place_machinery() -> None:
    # the builder loads the engine only when it makes a job (after the agents started)
    modules = _loaded_by("corral.cli.run", "corral.job.build", "corral.job.engine")
    assert "corral.job.engine" in modules
    assert sorted(m for m in modules if m.startswith(NOT_AT_START)) == []


def test_the_coordinator_reads_agent_probes_without_psutil_or_pydantic() -> None:
    # the coordinator checks each agent's probe answer (corral.agent.probe) before the
    # launch; psutil is the agents' and the host checks' business, and pydantic (the
    # later agent events, the server's models) is imported once the launch is on its way
    modules = _loaded_by("corral.cli.run", "corral.job.agents", "corral.job.engine")
    assert "corral.agent.probe" in modules
    assert {"psutil", "pydantic", "corral.agent.events"} & modules == set()


def test_corral_plan_parses_its_options_without_pydantic(tmp_path: Path) -> None:
    # every option of `corral run`/`plan` is a plain value (corral.cli.coerce), so
    # neither typer's pydantic adapters nor pydantic are imported to parse them
    code = (
        "import json, sys\n"
        "from corral.cli.main import main\n"
        "sys.argv = ['corral', 'plan', '--hosts', 'local:2', '--nproc-per-node', '2',\n"
        "            '--master-port', '0', '--rdzv-timeout', '30.5', '--env', 'A=1',\n"
        "            '--', 'train.py', '--lr', '0.1']\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    (tmp_path / "train.py").write_text("print('step')\n")
    out = _python(code, cwd=tmp_path)
    plan, modules = out.rsplit("\n", 2)[0], set(json.loads(out.splitlines()[-1]))
    assert "train.py --lr 0.1" in plan and "nproc-per-node=2" in plan
    assert "join_timeout=30.5" in plan
    assert {"typer._adapters", "pydantic"} & modules == set()
