"""Several netns testbeds side by side on one machine (issue 30: one per test worker).

Each *instance* has its own namespaces, links, bridge, subnet, registry and lock, and
the same host names; instance 0 is the testbed by hand, unchanged. The kernel's
neighbour table is the machine's one: sized for every testbed up, and put back by the
last one down. The pure parts, no root needed.
"""

from __future__ import annotations

import ipaddress
import itertools
from pathlib import Path

import pytest

from corral.errors import ConfigError
from corral.testbed import MAX_INSTANCES, Testbed, default_state_dir, default_subnet
from corral.testbed import _system as sysx
from corral.testbed._model import (
    NEIGH_SYSCTLS,
    InstanceNames,
    TestbedState,
    hand_over_sysctls,
    neighbour_limits,
    new_state,
    peer_ifname,
    plan_network,
)
from corral.testbed._registry import EXCLUSIVE_LOCK, REGISTRY, exclusive, lock_path, registry_path
from tests.parallel import NETNS_COST, netns_groups, worker_instance
from tests.unit.test_test_harness import UNUSED

IFNAMSIZ = 15  # the kernel's limit on an interface name (16 bytes with the NUL)


def _state(tmp_path: Path, instance: int, n: int = 3) -> TestbedState:
    return new_state(tmp_path, plan_network(default_subnet(instance), n), 1, instance)


def test_instance_zero_keeps_the_names_of_the_testbed_by_hand(tmp_path: Path) -> None:
    state = _state(tmp_path, 0)
    assert [(h.name, h.address, h.netns, h.veth) for h in state.hosts] == [
        ("tb1", "10.77.0.1", "corral-tb1", "crl-tb1"),
        ("tb2", "10.77.0.2", "corral-tb2", "crl-tb2"),
        ("tb3", "10.77.0.3", "corral-tb3", "crl-tb3"),
    ]
    assert (state.bridge, state.bridge_address, state.subnet) == (
        "crlbr0",
        "10.77.0.254",
        "10.77.0.0/24",
    )
    assert (registry_path(), lock_path()) == (REGISTRY, EXCLUSIVE_LOCK)
    assert Path("/run/corral/testbed.json") == REGISTRY
    assert default_state_dir(0) == default_state_dir()
    assert Testbed(tmp_path).instance == 0


def test_another_instance_has_its_own_names_subnet_registry_and_lock(tmp_path: Path) -> None:
    state = _state(tmp_path, 1)
    assert [(h.name, h.address, h.netns, h.veth) for h in state.hosts] == [
        ("tb1", "10.77.1.1", "corral1-tb1", "crl1-tb1"),
        ("tb2", "10.77.1.2", "corral1-tb2", "crl1-tb2"),
        ("tb3", "10.77.1.3", "corral1-tb3", "crl1-tb3"),
    ]
    assert (state.bridge, state.bridge_address, state.instance) == ("crlbr1", "10.77.1.254", 1)
    assert registry_path(1) == REGISTRY.with_name("testbed-1.json")
    assert lock_path(1) == EXCLUSIVE_LOCK.with_name("corral-testbed-1.lock")
    assert default_state_dir(1).name == "testbed-1"
    tb = Testbed(tmp_path, instance=1)
    assert (tb.instance, repr(tb)) == (1, f"Testbed({str(tmp_path)!r}, instance=1)")
    assert Testbed(instance=2).state_dir == default_state_dir(2)


def test_no_two_instances_share_a_name_route_or_lock(tmp_path: Path) -> None:
    states = [_state(tmp_path, i, 250) for i in range(MAX_INSTANCES)]
    kernel_names = [
        {s.bridge, *(h.netns for h in s.hosts), *(h.veth for h in s.hosts)} for s in states
    ]
    assert sum(len(n) for n in kernel_names) == len(set().union(*kernel_names))
    for a, b in itertools.combinations(states, 2):
        assert not ipaddress.ip_network(a.subnet).overlaps(ipaddress.ip_network(b.subnet))
    links = [name for s in states for name in (s.bridge, *(h.veth for h in s.hosts))]
    links += [peer_ifname(h.name) for h in states[-1].hosts]
    assert max(len(name) for name in links) <= IFNAMSIZ
    # the host names are the same in every instance (each host resolves its own)
    assert {tuple(h.name for h in s.hosts) for s in states} == {
        tuple(f"tb{k}" for k in range(1, 251))
    }
    paths = {registry_path(i) for i in range(MAX_INSTANCES)}
    paths |= {lock_path(i) for i in range(MAX_INSTANCES)}
    assert len(paths) == 2 * MAX_INSTANCES
    # an instance's leftover check looks for its own namespaces only: no prefix is a
    # prefix of another instance's names
    prefixes = [InstanceNames(i).netns_prefix for i in range(MAX_INSTANCES)]
    for i, prefix in enumerate(prefixes):
        assert [j for j, s in enumerate(states) if s.hosts[0].netns.startswith(prefix)] == [i]


@pytest.mark.parametrize("instance", [-1, MAX_INSTANCES])
def test_an_instance_out_of_range_is_refused(tmp_path: Path, instance: int) -> None:
    with pytest.raises(ConfigError, match=f"instance must be 0 to {MAX_INSTANCES - 1}"):
        Testbed(tmp_path, instance=instance)
    text = _state(tmp_path, 0).to_json().replace('"instance": 0', f'"instance": {instance}')
    with pytest.raises(ConfigError, match=r"unreadable testbed state.*instance"):
        TestbedState.from_json(text)


def test_the_state_keeps_its_instance(tmp_path: Path) -> None:
    state = _state(tmp_path, 7)
    assert TestbedState.from_json(state.to_json()) == state
    old = _state(tmp_path, 0).to_json().replace('"instance": 0', '"unused": 0')  # from before
    assert TestbedState.from_json(old).instance == 0


def test_neighbour_limits_cover_every_testbed_up() -> None:
    both = neighbour_limits(3, 64)
    for name, default in NEIGH_SYSCTLS.items():
        assert both[name] == default + 3 * 4 + 64 * 65
    assert neighbour_limits(3) == neighbour_limits(3, *())


def _proc(tmp_path: Path) -> Path:
    for name, value in NEIGH_SYSCTLS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"{value}\n")
    return tmp_path


@pytest.mark.parametrize("first_down", ["a", "b"])
def test_the_last_testbed_down_puts_the_neighbour_table_back(
    tmp_path: Path, first_down: str
) -> None:
    """Two testbeds up, then down in either order: the table stays large enough while
    one is up, and is back at its defaults when both are down (not at the first's)."""
    root = _proc(tmp_path)
    a = sysx.raise_sysctls(neighbour_limits(64), root)
    b = sysx.raise_sysctls(neighbour_limits(3, 64), root)  # b counts a's hosts too
    assert a and b
    records = {"a": a, "b": b}
    going, staying = first_down, "b" if first_down == "a" else "a"
    names = [*records[going], *records[staying]]
    heir = hand_over_sysctls(records[going], records[staying], sysx.read_sysctls(names, root))
    assert sysx.read_sysctls(NEIGH_SYSCTLS, root) == neighbour_limits(3, 64)  # untouched
    sysx.restore_sysctls(heir, root)  # the last one down
    assert sysx.read_sysctls(NEIGH_SYSCTLS, root) == NEIGH_SYSCTLS


def test_a_setting_changed_by_someone_else_is_not_handed_over() -> None:
    name = "net/ipv4/neigh/default/gc_thresh3"
    mine, theirs = {name: [1024, 5184]}, {name: [1000, 1024]}
    assert hand_over_sysctls(mine, theirs, {name: 9000}) == theirs
    assert hand_over_sysctls(mine, {}, {name: 5184}) == mine
    assert hand_over_sysctls(mine, theirs, {name: 5184}) == {name: [1000, 5184]}


def test_an_instance_lock_can_be_tried_without_waiting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("corral.testbed._registry.EXCLUSIVE_LOCK", tmp_path / "corral-testbed.lock")
    with exclusive(3) as held:
        assert held
        with exclusive(3, wait=False) as again:  # a second open file: a second holder
            assert not again
        with exclusive(4, wait=False) as other:
            assert other
    with exclusive(3, wait=False) as free:
        assert free


# ---------------------------------------------------------------- the test run's groups


def test_the_netns_modules_are_split_in_two_groups_of_about_equal_cost() -> None:
    modules = [f"tests/integration/netns/{m}.py" for m in NETNS_COST]
    groups = netns_groups(modules)
    assert set(groups.values()) == {"netns-0", "netns-1"}
    cost = {
        g: sum(NETNS_COST[Path(m).stem] for m in groups if groups[m] == g)
        for g in ("netns-0", "netns-1")
    }
    assert abs(cost["netns-0"] - cost["netns-1"]) <= 0.05 * sum(NETNS_COST.values()), cost
    assert netns_groups(list(reversed(modules))) == groups  # every worker finds the same
    unknown = netns_groups(["tests/integration/netns/test_new.py", modules[0]])
    assert set(unknown.values()) == {"netns-0", "netns-1"}


@pytest.mark.parametrize(("worker", "instance"), [("gw0", 0), ("gw1", 1), ("gw13", 13), ("", 0)])
def test_a_worker_brings_up_the_testbed_of_its_own_number(
    monkeypatch: pytest.MonkeyPatch, worker: str, instance: int
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    assert worker_instance() == instance


NETNS_MODULE = """
import os
from pathlib import Path
import pytest
from tests.parallel import worker_instance

pytestmark = pytest.mark.netns

@pytest.mark.parametrize("n", range(3))
def test_on_a_testbed(n):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    out = Path(os.environ["HARNESS_OUT"]) / f"{__name__}-{n}"
    out.write_text(f"{worker} {worker_instance()}")
"""


def test_two_workers_run_the_netns_modules_each_on_its_own_testbed_instance(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = pytester.mkdir("records")
    monkeypatch.setenv("HARNESS_OUT", str(out))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    pytester.makepyfile(test_net_a=NETNS_MODULE, test_net_b=NETNS_MODULE)
    result = pytester.runpytest_subprocess(
        "-p", "tests.parallel", "-p", "no:cacheprovider", *UNUSED, "-n", "2", "--dist", "loadgroup"
    )
    assert result.ret == 0, result.stdout.str()
    ran = {p.name: p.read_text().split() for p in out.iterdir()}
    assert len(ran) == 6, ran
    workers = {
        m: {w for name, (w, _) in ran.items() if name.startswith(m)}
        for m in ("test_net_a", "test_net_b")
    }
    assert all(len(w) == 1 for w in workers.values()), workers  # a module stays on its worker
    assert workers["test_net_a"] != workers["test_net_b"], workers  # the two groups: two workers
    assert all(instance == worker.removeprefix("gw") for worker, instance in ran.values()), ran


class _Leftover:
    def __init__(self, instance: int, downed: list[int]) -> None:
        self.instance, self._downed = instance, downed

    def down(self) -> None:
        self._downed.append(self.instance)


def test_a_session_takes_down_what_a_killed_run_left_in_any_instance_nobody_holds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tests.integration.netns.conftest import take_down_leftovers

    monkeypatch.setattr("corral.testbed._registry.EXCLUSIVE_LOCK", tmp_path / "corral-testbed.lock")
    downed: list[int] = []
    left = [_Leftover(i, downed) for i in (0, 1, 2)]
    monkeypatch.setattr(Testbed, "all_running", classmethod(lambda cls: left))
    with exclusive(1), exclusive(2):  # ours (1), and another live session's (2)
        take_down_leftovers(1)
    assert downed == [0, 1]


BUSY_MODULE = """
import os, time
from pathlib import Path
import pytest

@pytest.fixture(scope="module")
def shared():
    return None

@pytest.mark.parametrize("n", range({count}))
def test_busy(n, shared):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    (Path(os.environ["HARNESS_OUT"]) / f"{{__name__}}-{{n}}").write_text(f"{{worker}} -")
    time.sleep({sleep})
"""


def test_the_netns_groups_start_first_each_on_a_worker_of_its_own(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """xdist alone hands out the groups with the most tests first: here the two busy
    modules, after which the worker done first (test_quick's) would take both netns
    modules while the other still sleeps through test_slow."""
    out = pytester.mkdir("records")
    monkeypatch.setenv("HARNESS_OUT", str(out))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    pytester.makepyfile(
        test_net_a=NETNS_MODULE,
        test_net_b=NETNS_MODULE,
        test_slow=BUSY_MODULE.format(count=8, sleep=0.5),
        test_quick=BUSY_MODULE.format(count=4, sleep=0.0),
    )
    result = pytester.runpytest_subprocess(
        "-p", "tests.parallel", "-p", "no:cacheprovider", *UNUSED, "-n", "2", "--dist", "loadgroup"
    )
    assert result.ret == 0, result.stdout.str()
    ran = {p.name: p.read_text().split()[0] for p in out.iterdir()}
    assert len(ran) == 3 + 3 + 8 + 4, ran
    workers = {
        m: {w for name, w in ran.items() if name.startswith(m)}
        for m in ("test_net_a", "test_net_b")
    }
    assert all(len(w) == 1 for w in workers.values()), workers
    assert workers["test_net_a"] != workers["test_net_b"], ran


def test_a_testbed_down_while_another_is_up_leaves_it_the_machine_wide_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The neighbour table limits and the mount point directories ``up`` made are the
    machine's: the first testbed down hands them to the one still up (whose hosts use
    them), and the last one down puts them all back."""
    import functools

    from corral.testbed import _registry
    from corral.testbed._testbed import _write_state

    monkeypatch.setattr(_registry, "REGISTRY", tmp_path / "run" / "testbed.json")
    monkeypatch.setattr(sysx, "RUN_DIR", tmp_path / "run")
    root = _proc(tmp_path / "proc")
    for name in ("read_sysctls", "restore_sysctls"):
        monkeypatch.setattr(sysx, name, functools.partial(getattr(sysx, name), root=root))
    made = tmp_path / "srv"
    made.mkdir()
    first, second = _state(tmp_path / "a", 0), _state(tmp_path / "b", 1)
    first.sysctls = sysx.raise_sysctls(neighbour_limits(3), root)
    first.created_paths = [str(made)]
    second.sysctls = sysx.raise_sysctls(neighbour_limits(3, 3), root)
    for state in (first, second):
        _write_state(state)

    left = Testbed._release_shared(first)
    assert left and all("left to the testbed in" in line for line in left), left
    registry_path(0).unlink()  # what the rest of down does
    assert made.is_dir() and sysx.read_sysctls(NEIGH_SYSCTLS) == neighbour_limits(3, 3)
    heir = _registry.read_registry(1)
    assert heir is not None and heir.created_paths == [str(made)]

    done = Testbed._release_shared(heir)
    assert str(made) in done and not made.exists()
    assert sysx.read_sysctls(NEIGH_SYSCTLS) == NEIGH_SYSCTLS
