"""`corral check --links` on the testbed: a healthy testbed passes, and a host whose
link is throttled by tc (tbf on its bridge-side veth: traffic into it) is named
as the host behind the slow links."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.testbed import Testbed

from ..conftest import run_corral

pytestmark = pytest.mark.netns

#: tc's rate for the throttled host: far below any healthy veth, even on a busy machine.
THROTTLE = "8mbit"
THROTTLE_BYTES_S = 8e6 / 8


def check_links(testbed: Testbed, cwd: Path, *args: str) -> dict[str, Any]:
    """The links check's JSON result (the rest of the checklist is not looked at)."""
    proc = run_corral(
        "check",
        "--hosts",
        str(testbed.hostfile),
        "--ssh-config",
        str(testbed.ssh_config),
        "--no-smoke-test",
        "--links",
        "--json",
        *args,
        cwd=cwd,
        timeout=180,
    )
    assert proc.stdout.strip(), proc.stderr
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    result: dict[str, Any] = checks["links"]
    return result


@pytest.fixture
def throttled(healthy_testbed: Testbed) -> Iterator[str]:
    """tb2's link throttled to :data:`THROTTLE` (traffic into tb2), removed after."""
    veth = healthy_testbed.host("tb2").veth
    tbf = ["tc", "qdisc", "replace", "dev", veth, "root", "tbf", "rate", THROTTLE]
    subprocess.run([*tbf, "burst", "16kb", "latency", "100ms"], check=True)
    try:
        yield "tb2"
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)


def test_a_healthy_testbed_passes(testbed: Testbed, tmp_path: Path) -> None:
    links = check_links(testbed, tmp_path)
    assert links["status"] == "pass", links
    data = links["data"]
    assert data["hosts"] == ["tb1", "tb2", "tb3"]
    assert len(data["pairs"]) == 3 and data["rounds"] == 3
    assert all(p["error"] is None and p["gbs"] > 0 and p["rtt_ms"] > 0 for p in data["pairs"])
    assert data["ring"]["busbw_gbs"] > 0
    assert data["interfaces"] == {h: testbed.host(h).interface for h in data["hosts"]}
    assert data["score"]["culprits"] == [] and data["score"]["slow_pairs"] == []


def test_the_throttled_host_is_named(throttled: str, tmp_path: Path, testbed: Testbed) -> None:
    links = check_links(testbed, tmp_path)
    assert links["status"] == "fail", links
    assert links["data"]["score"]["culprits"] == [throttled]
    assert links["error"].startswith(f"slow links point at {throttled}")
    assert links["hosts"][throttled]["status"] == "fail"
    assert {h for h, v in links["hosts"].items() if v["status"] != "pass"} == {throttled}
    into = [
        p["ab_gbs"] if p["b"] == throttled else p["ba_gbs"]
        for p in links["data"]["pairs"]
        if throttled in (p["a"], p["b"])
    ]
    # what tc lets through, within a factor 2 (TCP, the bucket's burst)
    assert all(THROTTLE_BYTES_S / 2 < v * 1e9 < THROTTLE_BYTES_S * 2 for v in into), into
    warned = check_links(testbed, tmp_path, "--links-warn-only")
    assert warned["status"] == "warn" and warned["data"]["score"]["culprits"] == [throttled]
