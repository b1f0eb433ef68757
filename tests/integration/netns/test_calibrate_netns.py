"""``corral calibrate`` on two testbed hosts over real SSH, one of them slowed to half
speed by a CPU quota (a cgroup holding its sshd, so every process it starts, the
ranks included): the calibration must show that host slower by about the quota."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.cluster import load_cluster
from corral.testbed import CpuQuota, Testbed
from corral.throughput.model import load_calibration
from corral.throughput.resolve import resolve_weights
from tests.conftest import missing_dependency, require_torch

from ..conftest import run_corral, wait_no_job_processes

pytestmark = pytest.mark.netns

QUOTA = 0.5  # of one CPU


@pytest.fixture
def slowed_tb2(healthy_testbed: Testbed) -> Iterator[CpuQuota]:
    """tb2's sshd (and so everything started over SSH on tb2) in a half-CPU cgroup;
    tb1's in one without a limit, so that both get what they can use however busy
    this machine is with other work."""
    groups: list[CpuQuota] = []
    try:
        for host, quota in (("tb1", None), ("tb2", QUOTA)):
            group = CpuQuota(f"corral-test-{os.getpid()}-{host}", quota)
            groups.append(group)
            group.add(healthy_testbed.sshd_pid(host))
    except OSError as exc:
        for group in groups:
            group.close()
        missing_dependency(f"cannot make a CPU-quota cgroup: {exc}")
    try:
        yield groups[1]
    finally:
        for group in groups:
            group.close()


def test_a_host_at_half_cpu_measures_about_half_as_fast(
    healthy_testbed: Testbed, slowed_tb2: CpuQuota, tmp_path: Path, run_dir: Path
) -> None:
    require_torch()
    hostfile = tmp_path / "hosts"
    hostfile.write_text("tb1 slots=1\ntb2 slots=1\n")
    done = run_corral(
        "calibrate",
        "--hosts",
        str(hostfile),
        "--ssh-config",
        str(healthy_testbed.ssh_config),
        "--seconds",
        "3",  # the ranks compute flat out for the window: the quota (enforced every
        # 100 ms) shows in 3 s as in 10
        "--threads",
        "1",  # one thread per rank: the quota caps it at half its speed
        "--run-dir",
        str(run_dir),
        "--job-id",
        "cal-netns",
        "--json",
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    cal = json.loads(done.stdout)["hardware_calibration"]
    share = cal["workload_distribution"]
    rate = cal["measured_performance"]
    assert share["tb2"] < 0.42 and share["tb1"] > 0.58, cal
    ratio = rate["tb2"] / rate["tb1"]
    assert 0.25 < ratio < 0.75, f"tb2/tb1 = {ratio:.2f}, expected about {QUOTA}"
    assert "Throughput differs" in cal["calibration_notes"]
    saved = load_calibration(run_dir / "cal-netns" / "calibration.json")
    assert saved.hosts == ["tb1", "tb2"] and saved.workload == "reference"
    weights = resolve_weights(saved, load_cluster(str(hostfile)), None)
    assert weights[0] > weights[1] and sum(weights) == pytest.approx(1.0, abs=1e-5)
    # the reference workload went to each host's own home, owner-only
    for host in ("tb1", "tb2"):
        shipped = list(healthy_testbed.host_path(host, "/root/.corral/calibrate").glob("*.py"))
        assert len(shipped) == 1 and shipped[0].stat().st_mode & 0o077 == 0, shipped
    assert not wait_no_job_processes("cal-netns", within=30)
    sshd = healthy_testbed.sshd_pid("tb2")
    deadline = time.monotonic() + 15
    while slowed_tb2.pids() != [sshd] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert slowed_tb2.pids() == [sshd]  # no SSH session or rank left behind on tb2
