"""tests/conftest.py: a missing dependency skips locally but fails under CI=true."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import conftest as root_conftest
from tests.conftest import require
from tests.unit.test_test_harness import UNUSED

MISSING = "corral_no_such_module_xyz"

# A test module using the helpers and the marker, run by pytester with the root
# conftest as a plugin (pytester's temporary directory is outside tests/).
MODULE = f"""
import pytest
from tests.conftest import require

def test_needs_missing():
    require({MISSING!r}, "for this test")

@pytest.mark.torch
def test_marked_torch():
    pass

def test_plain_skip():
    pytest.skip("no reason")

def test_runs():
    assert True

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False
"""


def test_require_returns_the_module() -> None:
    assert require("json").dumps([1]) == "[1]"


def test_require_skips_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"needs '{MISSING}' \\(why\\)"):
        require(MISSING, "why")


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes"])
def test_require_fails_under_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="CI=true: a missing dependency fails"):
        require(MISSING)


@pytest.mark.parametrize("value", ["", "false", "0"])
def test_in_ci_only_for_true_values(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert root_conftest.in_ci() is False


@pytest.fixture
def torch_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """``require_torch`` behaves as on a machine without torch (the ``torch`` marker's hook
    looks it up at call time). The inline pytest runs below must not import torch
    itself: pytester drops modules the inner run imported, and torch cannot be
    imported twice in one process."""
    monkeypatch.setattr(root_conftest, "torch_installed", lambda: False)
    monkeypatch.setattr(root_conftest, "require_torch", lambda: require(MISSING, "as torch"))


@pytest.mark.torch
def test_the_torch_marker_imports_no_torch(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With torch installed the marker's check only finds it: a test whose torch runs in
    the processes it starts keeps its own process (an xdist worker) free of ~2 CPU-s of
    import. A fresh process, since this one may have imported torch already."""
    monkeypatch.setenv("PYTHONPATH", str(Path(root_conftest.__file__).parents[1]))
    pytester.makepyfile(
        test_mod="""
import sys
import pytest

@pytest.mark.torch
def test_marked():
    assert "torch" not in sys.modules
"""
    )
    result = pytester.runpytest_subprocess(
        "-p", "tests.conftest", "-p", "no:cacheprovider", *UNUSED
    )  # fmt: skip
    result.assert_outcomes(passed=1)


def test_skips_outside_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, torch_missing: None
) -> None:
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_mod=MODULE)
    result = pytester.runpytest("-p", "tests.conftest", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)
    result.stdout.fnmatch_lines_random(
        [
            f"SKIPPED*test_mod.py:*: needs '{MISSING}' (for this test)*",
            f"SKIPPED*needs '{MISSING}' (as torch)*",
            "SKIPPED*test_mod.py:*no reason",
        ]
    )


def test_every_skip_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, torch_missing: None
) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(test_mod=MODULE)
    result = pytester.runpytest("-p", "tests.conftest", "-p", "no:cacheprovider")
    # The marker's check runs at setup: an error, not a failure.
    result.assert_outcomes(passed=1, failed=2, errors=1, skipped=0, xfailed=1)
    result.stdout.fnmatch_lines_random(
        [
            "*CI=true: tests must run, not skip. Skip reason: no reason*",
            f"*needs '{MISSING}' (for this test)*CI=true: a missing dependency fails*",
            f"*needs '{MISSING}' (as torch)*CI=true: a missing dependency fails*",
        ]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_module_level_skip_fails_under_ci(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(
        test_mod=f"""
import pytest
pytest.importorskip({MISSING!r})

def test_never_collected():
    pass
"""
    )
    result = pytester.runpytest("-p", "tests.conftest", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1, skipped=0)
    result.stdout.fnmatch_lines(["*CI=true: tests must run, not skip*"])
    # A collection error stops the session: pytest exits 2, not 1.
    assert result.ret == pytest.ExitCode.INTERRUPTED
