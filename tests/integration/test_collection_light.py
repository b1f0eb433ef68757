"""Collecting the integration tests imports no heavy library (issue 30).

Every pytest-xdist worker imports every test module while collecting; a module that
imports torch at module level costs each worker ~2 CPU-s before any test runs. Torch
code belongs in a companion module (``_krum_ranks.py``...) or a test's body, and a
module whose tests need torch says so with ``pytestmark = pytest.mark.torch``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import REPO

HEAVY = ("torch", "torchft", "playwright", "mlflow")

# Modules that still import torch at module level (other work in progress on them):
# never imported here, since once one has, torch is in sys.modules for the rest.
STILL_HEAVY = frozenset(
    {
        "test_inplace_local",
        "test_inplace_logs",
        "test_inplace_loss",
        "test_k8s_entrypoint",
        "test_sdk_torchrun",
    }
)

_PROBE = """
import importlib, sys
heavy = {heavy!r}
for name in sys.argv[1:]:
    importlib.import_module(name)
    pulled = sorted(m for m in heavy if m in sys.modules)
    if pulled:
        print(f"{{name}} imports {{', '.join(pulled)}}")
        sys.exit(1)
"""


def light_modules() -> list[str]:
    here = Path(__file__).parent
    names = sorted(p.stem for p in here.glob("test_*.py") if p.stem not in STILL_HEAVY)
    return [f"tests.integration.{name}" for name in names]


def test_importing_the_integration_test_modules_imports_no_heavy_library() -> None:
    modules = light_modules()
    assert "tests.integration.test_krum" in modules and len(modules) > 40
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
