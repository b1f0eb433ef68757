"""The testbed sizes the kernel's neighbour (ARP) table for its hosts' full mesh.

The table is one for every network namespace of the machine: at 64 hosts gloo's
full mesh needs ~4160 entries, past the default hard limit of 1024, and connects
failed with "No route to host" (issue 23). ``up`` raises the limits, never lowers
them, and ``down`` puts back what it raised.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.errors import LaunchError
from corral.testbed import _system as sysx
from corral.testbed._model import NEIGH_SYSCTLS, TestbedState, neighbour_limits


def _proc(tmp_path: Path, values: dict[str, int]) -> Path:
    for name, value in values.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return tmp_path


def _read(root: Path) -> dict[str, int]:
    return {name: int((root / name).read_text()) for name in NEIGH_SYSCTLS}


def test_the_limits_hold_a_64_host_full_mesh_above_the_defaults() -> None:
    limits = neighbour_limits(64)
    mesh = 64 * 63 + 2 * 64  # host <-> host both ways, host <-> coordinator both ways
    assert set(limits) == set(NEIGH_SYSCTLS)
    # no garbage collection churn while the mesh is up: the soft limit holds it all
    assert limits["net/ipv4/neigh/default/gc_thresh2"] >= mesh + 512
    assert limits["net/ipv4/neigh/default/gc_thresh3"] >= mesh + 1024
    assert limits["net/ipv4/neigh/default/gc_thresh1"] >= mesh
    small = neighbour_limits(2)
    assert all(small[k] >= v for k, v in NEIGH_SYSCTLS.items())


def test_up_raises_the_defaults_and_down_restores_them(tmp_path: Path) -> None:
    root = _proc(tmp_path, NEIGH_SYSCTLS)
    changed = sysx.raise_sysctls(neighbour_limits(64), root)
    assert _read(root) == neighbour_limits(64)
    assert changed["net/ipv4/neigh/default/gc_thresh3"] == [
        1024,
        neighbour_limits(64)["net/ipv4/neigh/default/gc_thresh3"],
    ]
    restored = sysx.restore_sysctls(changed, root)
    assert _read(root) == NEIGH_SYSCTLS
    assert "net.ipv4.neigh.default.gc_thresh3" in restored


def test_higher_settings_are_never_lowered_and_later_changes_stay(tmp_path: Path) -> None:
    limits = neighbour_limits(4)
    high = {name: value * 10 for name, value in limits.items()}
    root = _proc(tmp_path, high)
    assert sysx.raise_sysctls(limits, root) == {}
    assert _read(root) == high

    root = _proc(tmp_path, NEIGH_SYSCTLS)
    changed = sysx.raise_sysctls(limits, root)
    name = "net/ipv4/neigh/default/gc_thresh3"
    (root / name).write_text("99999\n")  # someone else's change after up
    sysx.restore_sysctls(changed, root)
    assert int((root / name).read_text()) == 99999
    assert int((root / "net/ipv4/neigh/default/gc_thresh2").read_text()) == 512


def test_a_setting_that_cannot_be_raised_is_named(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"net\.ipv4\.neigh\.default\.gc_thresh1.*sysctl -w"):
        sysx.raise_sysctls(neighbour_limits(64), tmp_path)  # no such files


def test_the_state_keeps_what_up_raised(tmp_path: Path) -> None:
    state = TestbedState(
        state_dir=str(tmp_path),
        subnet="10.77.0.0/24",
        bridge="crlbr0",
        bridge_address="10.77.0.254",
        slots=1,
        hosts=[],
        sysctls={"net/ipv4/neigh/default/gc_thresh3": [1024, 5184]},
    )
    again = TestbedState.from_json(state.to_json())
    assert again.sysctls == state.sysctls
    old = state.to_json().replace('"sysctls"', '"unused"')  # a state file from before
    assert TestbedState.from_json(old).sysctls == {}
