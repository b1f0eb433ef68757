"""``corral ping`` and ``fleet.ping`` across the netns testbed's real sshd hosts."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from pathlib import Path

import asyncssh
import pytest

from corral.cluster import load_cluster
from corral.fleet.ping import KILL_GRACE, PingResult, failed_hosts, ping_hosts
from corral.testbed import Testbed
from corral.transport.options import SshOptions
from corral.transport.ssh import SshTransport

from ..conftest import REPO, run_corral

pytestmark = pytest.mark.netns

HOSTS = ("tb1", "tb2", "tb3")
#: Seconds allowed past a deadline (process start-up, teardown), generous for a loaded
#: 2-core machine; still far below what a host without a deadline costs (TCP retries).
MARGIN = 20.0
# Deadlines: a host that answers must answer within them even on a loaded, shared CI box
# (SSH round trips of 2.5 s were seen there); a cut link is only detected by them.
HEALTHY = "60"
SHORT = 8.0


def corral_ping(
    tb: Testbed, *args: str, config: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``corral ping`` on the testbed; returns the result and its wall time."""
    started = time.monotonic()
    result = run_corral(
        "ping",
        "--hosts",
        str(tb.hostfile),
        "--ssh-config",
        str(config or tb.ssh_config),
        *args,
        cwd=REPO,
        timeout=120,
    )
    return result, time.monotonic() - started


def row(stderr: str, host: str) -> str:
    """The table row of ``host`` in corral ping's stderr."""
    return next(line for line in stderr.splitlines() if line.split()[:1] == [host])


def ping_with(
    tb: Testbed, *, timeout: float, rounds: int = 1, cut: str | None = None
) -> tuple[list[dict[str, PingResult]], float]:
    """Ping the testbed ``rounds`` times over one SshTransport (connections kept between
    rounds); ``cut`` is cut off before the last round. Returns the results and the last
    round's duration."""

    async def main() -> tuple[list[dict[str, PingResult]], float]:
        hosts = list(load_cluster(str(tb.hostfile)).hosts)
        transport = SshTransport.from_options(SshOptions(config=str(tb.ssh_config)))
        results: list[dict[str, PingResult]] = []
        try:
            for i in range(rounds):
                if cut is not None and i == rounds - 1:
                    tb.cut_link(cut)
                started = time.monotonic()
                results.append(await ping_hosts(transport, hosts, timeout=timeout))
                took = time.monotonic() - started
        finally:
            if cut is not None:
                tb.restore_link(cut)
            await transport.close()
        return results, took

    return asyncio.run(main())


def no_ping_left(tb: Testbed) -> None:
    for h in HOSTS:
        assert "corral-ping-" not in tb.run_on(h, ["ps", "-eo", "args"]).stdout


def test_all_hosts_answer(testbed: Testbed) -> None:
    result, _ = corral_ping(testbed, "--timeout", HEALTHY)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    for h in HOSTS:
        assert re.fullmatch(rf"{h}\s+ok\s+\d+\.\d ms\s*", row(result.stderr, h))
    assert "3/3 hosts answered" in result.stderr
    no_ping_left(testbed)


def test_json_output(testbed: Testbed) -> None:
    result, _ = corral_ping(testbed, "--json", "--timeout", HEALTHY)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == {"hosts", "failed", "ok"}
    assert doc["failed"] == [] and doc["ok"] == list(HOSTS)
    assert list(doc["hosts"]) == list(HOSTS)
    for entry in doc["hosts"].values():
        assert entry["ok"] is True and entry["error"] is None and entry["cause"] is None
        assert entry["rtt_ms"] > 0


def test_library_api_reuses_connections(testbed: Testbed) -> None:
    rounds, _ = ping_with(testbed, timeout=float(HEALTHY), rounds=2)
    assert len(rounds) == 2
    for results in rounds:
        assert list(results) == list(HOSTS)
        assert failed_hosts(results) == []


def test_stopped_sshd_is_refused(healthy_testbed: Testbed) -> None:
    tb = healthy_testbed
    tb.kill_sshd("tb2")
    result, _ = corral_ping(tb, "--timeout", HEALTHY)
    assert result.returncode == 1, result.stderr
    assert result.stdout == "tb2\n"
    assert "failed" in row(result.stderr, "tb2")
    assert "connection refused" in row(result.stderr, "tb2")
    assert "ok" in row(result.stderr, "tb1").split()
    assert "2/3 hosts answered" in result.stderr


def test_stopped_sshd_json(healthy_testbed: Testbed) -> None:
    tb = healthy_testbed
    tb.kill_sshd("tb3")
    result, _ = corral_ping(tb, "--json", "--timeout", HEALTHY)
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["failed"] == ["tb3"] and doc["ok"] == ["tb1", "tb2"]
    tb3 = doc["hosts"]["tb3"]
    assert tb3["ok"] is False and tb3["rtt_ms"] is None
    assert tb3["cause"] == "connection refused"
    assert "tb3: " in tb3["error"] and "refused" in tb3["error"]


def test_cut_link_times_out_within_the_deadline(healthy_testbed: Testbed) -> None:
    tb = healthy_testbed
    tb.cut_link("tb3")
    result, took = corral_ping(tb, "--timeout", f"{SHORT:g}")
    assert took < SHORT + MARGIN  # the bound is the behaviour (process start-up included)
    assert result.returncode == 1, result.stderr
    assert result.stdout == "tb3\n"
    assert f"timed out after {SHORT:g}s" in row(result.stderr, "tb3")
    assert "2/3 hosts answered" in result.stderr


def test_cut_link_on_an_open_connection_returns_by_the_deadline(
    healthy_testbed: Testbed,
) -> None:
    # the second round finds a cached connection whose link is dead: the channel
    # open never gets an answer, and the deadline must still hold
    rounds, took = ping_with(healthy_testbed, timeout=SHORT, rounds=2, cut="tb3")
    assert failed_hosts(rounds[0]) == []
    last = rounds[1]
    assert took < SHORT + KILL_GRACE + MARGIN  # the bound is the behaviour
    assert failed_hosts(last) == ["tb3"]
    assert last["tb3"].cause == f"timed out after {SHORT:g}s"
    assert last["tb1"].ok and last["tb2"].ok


def test_auth_failure_is_named(testbed: Testbed, tmp_path: Path) -> None:
    key = tmp_path / "stranger_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(key))
    result, _ = corral_ping(testbed, "--ssh-key", str(key), "--timeout", HEALTHY)
    assert result.returncode == 1
    assert result.stdout.split() == list(HOSTS)
    for h in HOSTS:
        assert "auth failed" in row(result.stderr, h)


def test_host_key_mismatch_is_named(testbed: Testbed, tmp_path: Path) -> None:
    forged = tmp_path / "known_hosts"
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode()
    lines = testbed.known_hosts.read_text().splitlines()
    forged.write_text(
        "".join(
            f"{line.split()[0]} {other.strip()}\n" if line.startswith("tb1,") else line + "\n"
            for line in lines
        )
    )
    text = re.sub(
        r"(?m)^(\s*UserKnownHostsFile)\s+\S+", rf"\1 {forged}", testbed.ssh_config.read_text()
    )
    config = tmp_path / "ssh_config"
    config.write_text(text)
    result, _ = corral_ping(testbed, "--timeout", HEALTHY, config=config)
    assert result.returncode == 1, result.stderr
    assert result.stdout == "tb1\n"
    assert "host key mismatch" in row(result.stderr, "tb1")
