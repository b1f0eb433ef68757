"""Every rank imports the rank wrapper: it loads only the SDK modules it uses.

:mod:`corral.sdk` and :mod:`corral.sdk.runtime` export their names lazily
(PEP 562), so ``python -m corral.agent.worker`` does not import the checkpoint,
torchft, sampler or chunking modules (nor ``zipfile`` for the checkpoint check)
before the script runs; every public name still resolves, ``from corral.sdk
import *`` included.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import corral.sdk
import corral.sdk.runtime

_PROBE = """
import json, sys
{code}
sys.stdout.write(json.dumps(sorted(sys.modules)))
"""

#: SDK modules a rank needs only when its script uses them.
NOT_FOR_THE_WRAPPER = (
    "corral.sdk._checkpoint",
    "corral.sdk._ft",
    "corral.sdk._ftsplit",
    "corral.sdk._sampler",
    "corral.sdk._chunks",
    "corral.sdk._krum",
    "corral.sdk._resume",
    "corral.sdk._dist",
    "corral.sdk._qos",
    "corral.sdk._accelerate",
    "zipfile",
    "torch",
)


def _modules(code: str) -> set[str]:
    """The modules a new interpreter has imported after running ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(code=code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(corral.sdk.__file__).parents[2])},
    )
    return set(json.loads(done.stdout))


def test_the_rank_wrapper_imports_only_what_it_uses() -> None:
    modules = _modules("import corral.agent.worker")
    assert "corral.sdk._report" in modules  # its streams and exit go to the agent
    assert sorted(m for m in modules if m.startswith(NOT_FOR_THE_WRAPPER)) == []
    assert "traceback" not in modules  # a failed script's alone (with linecache, tokenize)


def test_importing_the_sdk_loads_no_private_module() -> None:
    modules = _modules("from corral import sdk")
    assert sorted(m for m in modules if m.startswith("corral.sdk._")) == []


def test_a_name_loads_its_own_module() -> None:
    modules = _modules("from corral.sdk import latest_checkpoint")
    assert "corral.sdk._checkpoint" in modules
    assert "corral.sdk._ft" not in modules and "corral.sdk._sampler" not in modules


def test_every_public_name_resolves_to_its_module_object() -> None:
    for package in (corral.sdk, corral.sdk.runtime):
        table: dict[str, str] = vars(package)["_LAZY"]
        assert sorted(table) == sorted(package.__all__)
        for name, module in table.items():
            assert getattr(package, name) is getattr(importlib.import_module(module), name)
        assert set(package.__all__) <= set(dir(package))
    star: dict[str, object] = {}
    exec("from corral.sdk import *", star)
    assert set(corral.sdk.__all__) <= set(star)


def test_an_unknown_name_is_an_attribute_error() -> None:
    for package in (corral.sdk, corral.sdk.runtime):
        with pytest.raises(AttributeError, match="no_such_name"):
            vars(package)["__getattr__"]("no_such_name")
        assert not hasattr(package, "no_such_name")


def test_chunks_and_resume_in_a_script_without_torch_never_import_it(tmp_path: Path) -> None:
    """A standard-library rank's ``sdk.chunks()`` and ``sdk.resume()`` have no process
    group to agree through: they never import torch (1.5 CPU-s and seconds a rank)."""
    where = str(tmp_path)
    code = (
        "import contextlib, io\n"
        "from corral import sdk\n"
        "with contextlib.redirect_stdout(io.StringIO()):  # its progress lines\n"
        f"    done = [c.index for c in sdk.chunks(60000, 30000, checkpoint_dir={where!r})]\n"
        "assert done == [0, 1], done\n"
        f"assert sdk.resume({str(tmp_path / 'ckpt')!r}) is None\n"
    )
    (tmp_path / "ckpt").mkdir()
    assert "torch" not in _modules(code)
