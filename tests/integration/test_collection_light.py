"""Collecting the tests imports no heavy library (issue 30).

Every pytest-xdist worker imports every test module (and conftest) while collecting; a
module that imports torch at module level costs each worker ~2 CPU-s before any test
runs. Torch code belongs in a companion module (``_krum_ranks.py``...) or a test's body,
playwright names used only in annotations under ``TYPE_CHECKING``, and a module whose
tests need torch says so with ``pytestmark = pytest.mark.torch`` (whose check finds
torch without importing it: tests/conftest.py).
"""

from __future__ import annotations

import subprocess
import sys

from .conftest import REPO

HEAVY = ("torch", "torchft", "playwright", "mlflow")

# Each directory pytest collects, with a module that must be among its modules (the
# guard would pass vacuously on an empty list).
PACKAGES = {
    "tests": "tests.conftest",
    "tests/unit": "tests.unit.test_sdk_checkpoint",
    "tests/e2e": "tests.e2e.test_web_weights",
    "tests/integration": "tests.integration.test_krum",
    "tests/integration/netns": "tests.integration.netns.test_faults",
}

# A fresh interpreter (this one may have imported torch) imports them all, as a worker
# does; once a module has imported torch it stays in sys.modules, so the first module
# that pulls a heavy library in is the one named.
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


def collected_modules(package: str) -> list[str]:
    """The modules pytest imports from ``package`` (its conftest, its test modules and,
    for the root, the plugins its conftest names), as dotted names."""
    here = REPO / package
    dotted = package.replace("/", ".")
    stems = sorted(p.stem for p in here.glob("test_*.py"))
    if (here / "conftest.py").exists():
        stems.insert(0, "conftest")
    modules = [f"{dotted}.{stem}" for stem in stems]
    if package == "tests":
        from tests import conftest

        modules += [p for p in conftest.pytest_plugins if p.startswith("tests.")]
    return modules


def test_collecting_imports_no_heavy_library() -> None:
    modules = []
    for package, sentinel in PACKAGES.items():
        found = collected_modules(package)
        assert sentinel in found, found
        modules += found
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
