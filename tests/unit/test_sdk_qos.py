"""corral.sdk.set_qos: a no-op off macOS; on macOS the libSystem call (faked at the ctypes seam)."""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Any

import pytest

from corral import sdk
from corral.sdk import _qos
from corral.sdk._qos import LIBSYSTEM, QOS_ENV, apply_qos_from_env


class FakeFunction:
    """Stands in for ``libSystem.pthread_set_qos_class_self_np``."""

    def __init__(self, result: int) -> None:
        self.result = result
        self.calls: list[tuple[int, int]] = []
        self.argtypes: list[Any] | None = None
        self.restype: Any = None

    def __call__(self, qos_class: int, relative_priority: int) -> int:
        self.calls.append((qos_class, relative_priority))
        return self.result


class FakeLibSystem:
    def __init__(self, result: int) -> None:
        self.pthread_set_qos_class_self_np = FakeFunction(result)


@pytest.fixture
def no_nice(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(increment: int) -> int:
        raise AssertionError("macOS ignores nice() for scheduling: never call it")

    monkeypatch.setattr(os, "nice", refuse)


def darwin(monkeypatch: pytest.MonkeyPatch, result: int = 0) -> tuple[FakeLibSystem, list[str]]:
    """Pretend to be macOS; the libraries loaded (paths) and the fake libSystem."""
    lib = FakeLibSystem(result)
    loaded: list[str] = []

    def cdll(path: str, use_errno: bool = False) -> FakeLibSystem:
        loaded.append(path)
        return lib

    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(ctypes, "CDLL", cdll)
    return lib, loaded


@pytest.mark.usefixtures("no_nice")
def test_off_macos_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library(*args: object, **kwargs: object) -> None:
        raise AssertionError("no library may be loaded off macOS")

    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    for name in _qos.QOS_CLASSES:
        assert sdk.set_qos(name) is False


@pytest.mark.usefixtures("no_nice")
@pytest.mark.parametrize(
    ("name", "value"),
    [("user_interactive", 0x21), ("user_initiated", 0x19), ("utility", 0x11), ("background", 0x09)],
)
def test_on_macos_the_thread_qos_class_is_set(
    monkeypatch: pytest.MonkeyPatch, name: str, value: int
) -> None:
    lib, loaded = darwin(monkeypatch)
    assert sdk.set_qos(name) is True
    call = lib.pthread_set_qos_class_self_np
    assert call.calls == [(value, 0)]
    assert loaded == [LIBSYSTEM]
    assert call.argtypes == [ctypes.c_uint, ctypes.c_int]
    assert call.restype is ctypes.c_int


def test_a_refusal_is_false_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    darwin(monkeypatch, result=1)  # EPERM
    assert sdk.set_qos("background") is False
    assert "pthread_set_qos_class_self_np(background) failed: Operation not permitted" in (
        capsys.readouterr().err
    )


def test_a_missing_library_is_false_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    darwin(monkeypatch)

    def missing(path: str, use_errno: bool = False) -> None:
        raise OSError(f"dlopen({path}): image not found")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert sdk.set_qos("utility") is False
    assert "cannot set QoS class utility: dlopen" in capsys.readouterr().err


@pytest.mark.parametrize("system", ["Darwin", "Linux"])
def test_an_unknown_class_names_the_valid_ones(
    monkeypatch: pytest.MonkeyPatch, system: str
) -> None:
    monkeypatch.setattr(platform, "system", lambda: system)
    with pytest.raises(ValueError, match="unknown QoS class 'fast'") as caught:
        sdk.set_qos("fast")
    assert "user_interactive, user_initiated, utility, background" in str(caught.value)


def test_the_rank_wrapper_applies_corral_qos(monkeypatch: pytest.MonkeyPatch) -> None:
    lib, _ = darwin(monkeypatch)
    assert apply_qos_from_env({}) is False
    assert apply_qos_from_env({QOS_ENV: " "}) is False
    assert lib.pthread_set_qos_class_self_np.calls == []
    monkeypatch.setenv(QOS_ENV, "utility")
    assert apply_qos_from_env() is True
    assert lib.pthread_set_qos_class_self_np.calls == [(0x11, 0)]
    with pytest.raises(ValueError, match=f"{QOS_ENV}='turbo': use one of user_interactive"):
        apply_qos_from_env({QOS_ENV: "turbo"})


def test_the_real_call_on_this_machine() -> None:
    # Linux (CI, the testbed): False and nothing done; a Mac sets its own thread's class
    assert sdk.set_qos("user_interactive") is (platform.system() == "Darwin")
