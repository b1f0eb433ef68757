"""The netns testbed itself: hosts, names, sshd, private /srv, /tmp and home, faults, up/down."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import corral
from corral.cli.testbed import register
from corral.errors import ConfigError, LaunchError
from corral.testbed import SRV_DIR, Testbed

pytestmark = pytest.mark.netns

HOSTS = ["tb1", "tb2", "tb3"]


def ssh(
    tb: Testbed,
    host: str,
    *command: str,
    env: dict[str, str] | None = None,
    opts: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` on ``host`` with the real OpenSSH client."""
    argv = ["ssh", "-F", str(tb.ssh_config), "-o", "BatchMode=yes", *opts, host, *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, env=env, check=False)


def connect_error(address: str, port: int = 22, timeout: float = 1.0) -> type[OSError] | None:
    """None when a TCP connect succeeds, else the exception type it failed with."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return None
    except OSError as exc:
        return type(exc)


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def link_names() -> set[str]:
    out = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True)
    return {link["ifname"] for link in json.loads(out.stdout)}


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def recorded_pids(tb: Testbed) -> list[int]:
    state = json.loads(tb.state_file.read_text())
    return [h[k]["pid"] for h in state["hosts"] for k in ("holder", "sshd") if h[k]]


def daemon_pids(tb: Testbed) -> dict[tuple[str, str], int]:
    """{(host, "holder" | "sshd"): pid} of the daemons the state records."""
    state = json.loads(tb.state_file.read_text())
    return {(h["name"], k): h[k]["pid"] for h in state["hosts"] for k in ("holder", "sshd") if h[k]}


# ---------------------------------------------------------------------------- hosts


def test_status_and_state_files(testbed: Testbed) -> None:
    st = testbed.status()
    assert st.healthy, st.problems()
    net = f"10.77.{testbed.instance}"  # instance N: 10.77.N.0/24 (0 without xdist)
    assert [(h.name, h.address) for h in st.hosts] == [
        ("tb1", f"{net}.1"),
        ("tb2", f"{net}.2"),
        ("tb3", f"{net}.3"),
    ]
    assert testbed.hostfile.read_text().split("\n")[:3] == [f"{h} slots=1" for h in HOSTS]
    config = testbed.ssh_config.read_text()
    for h in testbed.hosts:
        assert f"Host {h.name}\n    HostName {h.address}\n" in config
    known = testbed.known_hosts.read_text().splitlines()
    assert [line.split()[0] for line in known] == [
        f"tb1,{net}.1",
        f"tb2,{net}.2",
        f"tb3,{net}.3",
    ]
    assert testbed.key_path.stat().st_mode & 0o077 == 0
    assert {h.netns for h in testbed.hosts} <= netns_names()


def test_each_host_has_its_own_hostname_over_ssh(testbed: Testbed) -> None:
    for host in HOSTS:
        res = ssh(testbed, host, "hostname")
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == host


def test_hosts_resolve_and_reach_each_other_by_name(testbed: Testbed) -> None:
    own = testbed.run_on("tb1", ["getent", "hosts", "tb1"], check=True)
    assert own.stdout.split()[0] == testbed.host("tb1").address  # not 127.0.x.x: c10d needs it
    res = testbed.run_on("tb1", ["getent", "hosts", "tb2"], check=True)
    assert res.stdout.split()[0] == testbed.host("tb2").address
    probe = "import socket; socket.create_connection(('tb2', 22), timeout=3).close(); print('ok')"
    res = testbed.run_on("tb1", ["python3", "-c", probe])
    assert (res.returncode, res.stdout.strip()) == (0, "ok"), res.stderr
    assert testbed.run_on("tb3", ["hostname"]).stdout.strip() == "tb3"


def test_srv_corral_is_private_per_host(testbed: Testbed) -> None:
    marker = f"{SRV_DIR}/private-{os.getpid()}"
    res = testbed.run_on("tb1", ["sh", "-c", f"echo tb1 > {marker} && cat {marker}"])
    assert res.stdout.strip() == "tb1", res.stderr
    try:
        assert testbed.run_on("tb2", ["test", "-e", marker]).returncode == 1
        assert not Path(marker).exists()  # the coordinator does not see it either
        on_tb2 = ssh(testbed, "tb2", f"test -e {marker} || echo absent")
        assert on_tb2.stdout.strip() == "absent"
        assert testbed.host_path("tb1", marker).read_text() == "tb1\n"
    finally:
        testbed.run_on("tb1", ["rm", "-f", marker])


def test_srv_tmp_and_home_are_private_per_host(testbed: Testbed) -> None:
    name = f"private-{os.getpid()}"
    paths = [f"/srv/x/{name}", f"/tmp/{name}", f"/root/{name}"]
    write = f"mkdir -p /srv/x && echo tb1 > /srv/x/{name} && echo tb1 > /tmp/{name}"
    write += f" && echo tb1 > ~/{name} && cat {' '.join(paths)}"
    try:
        res = ssh(testbed, "tb1", write)
        assert (res.returncode, res.stdout) == (0, "tb1\n" * 3), res.stderr
        for host in ("tb2", "tb3"):
            seen = ssh(testbed, host, f"ls -d {' '.join(paths)} 2>/dev/null; echo end")
            assert seen.stdout == "end\n", (host, seen.stdout)
        assert [p for p in paths if Path(p).exists()] == []  # nor here, the coordinator
        assert [testbed.host_path("tb1", p).read_text() for p in paths] == ["tb1\n"] * 3
    finally:
        testbed.run_on("tb1", ["rm", "-rf", "/srv/x", *paths[1:]])


def test_hosts_keep_the_state_dir_and_the_python_environment(testbed: Testbed) -> None:
    code = "import corral, sys; print(sys.prefix, corral.__file__)"
    res = ssh(testbed, "tb2", f"{sys.executable} -c '{code}'")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [sys.prefix, corral.__file__]
    listed = testbed.run_on("tb2", ["ls", str(testbed.state_dir)], check=True)
    assert "hostfile" in listed.stdout.split()
    assert testbed.host_path("tb2", testbed.known_hosts) == testbed.known_hosts
    with pytest.raises(ConfigError, match="not in a private directory"):
        testbed.host_path("tb2", "/etc/hosts")


def test_accept_env_forwards_variables(testbed: Testbed) -> None:
    env = {**os.environ, "CORRAL_TEST": "hello $world; 'quoted'"}
    res = ssh(testbed, "tb2", 'echo "$CORRAL_TEST"', env=env, opts=("-o", "SendEnv=CORRAL_TEST"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.rstrip("\n") == "hello $world; 'quoted'"


# ---------------------------------------------------------------------------- up / faults


def test_up_again_is_a_noop_and_other_sizes_are_refused(testbed: Testbed) -> None:
    before = recorded_pids(testbed)
    result = testbed.up(3)
    assert result.already_up
    assert recorded_pids(testbed) == before
    with pytest.raises(ConfigError, match="already up"):
        testbed.up(2)
    with pytest.raises(LaunchError, match="already up with state dir"):
        Testbed(testbed.state_dir.parent / "another", instance=testbed.instance).up(3)


def test_half_up_testbed_is_detected(healthy_testbed: Testbed) -> None:
    tb = healthy_testbed
    tb.kill_sshd("tb2")
    st = tb.status()
    assert not st.healthy
    assert st.problems() == ["tb2: sshd not running"]
    assert connect_error(tb.host("tb2").address) is ConnectionRefusedError
    with pytest.raises(LaunchError, match=r"half up .*tb2: sshd not running.*testbed down"):
        tb.up(3)
    tb.start_sshd("tb2")
    assert tb.status().healthy
    assert ssh(tb, "tb2", "hostname").stdout.strip() == "tb2"


def test_repair_restarts_nothing_healthy_and_only_what_is_broken(
    healthy_testbed: Testbed,
) -> None:
    # every fault test repairs before and after: on a healthy testbed that must be a
    # look at its state, not a restart of the hosts' daemons
    tb = healthy_testbed
    daemons = daemon_pids(tb)
    tb.repair()
    assert daemon_pids(tb) == daemons
    tb.cut_link("tb3")
    tb.kill_sshd("tb2")
    tb.repair()
    assert tb.status().healthy
    after = daemon_pids(tb)
    # tb3's link came back up, tb2 got a new sshd: no host was taken down and up again
    assert {key for key in daemons if after[key] != daemons[key]} == {("tb2", "sshd")}
    assert all(pid_alive(pid) for pid in after.values())
    assert ssh(tb, "tb3", "hostname").stdout.strip() == "tb3"


def test_cut_link_blackholes_the_host_and_restore_brings_it_back(
    healthy_testbed: Testbed,
) -> None:
    tb = healthy_testbed
    tb.cut_link("tb3")
    tb3 = tb.host("tb3").address
    assert connect_error(tb3, timeout=1.0) is TimeoutError  # hangs, no refusal
    probe = "import socket; socket.create_connection(('tb3', 22), timeout=1)"
    blocked = tb.run_on("tb1", ["python3", "-c", probe])
    assert blocked.returncode == 1, blocked.stderr  # an uncaught exception
    assert "TimeoutError" in blocked.stderr  # dropped, not refused
    assert not tb.status(timeout=0.5).healthy
    tb.restore_link("tb3")
    assert connect_error(tb3, timeout=3.0) is None
    assert ssh(tb, "tb3", "hostname").stdout.strip() == "tb3"


def test_down_removes_everything_and_up_restores(testbed: Testbed) -> None:
    stray = ssh(testbed, "tb2", "nohup sleep 600 >/dev/null 2>&1 & echo $!")
    assert stray.returncode == 0, stray.stderr
    stray_pid = int(stray.stdout.strip())
    on_host = testbed.pids_on("tb2")
    assert stray_pid in on_host
    daemons = recorded_pids(testbed)
    assert all(pid_alive(p) for p in daemons)
    hosts, bridge = testbed.hosts, testbed.bridge  # crlbr0 (crlbrN on xdist worker gwN)
    assert bridge == f"crlbr{testbed.instance}"
    try:
        result = testbed.down()
        assert f"bridge {bridge}" in result.removed
        assert not {h.netns for h in hosts} & netns_names()
        assert not {bridge, *(h.veth for h in hosts)} & link_names()
        assert not [p for p in [*daemons, stray_pid] if pid_alive(p)]
        assert not testbed.state_file.exists()
        assert not (testbed.state_dir / "hosts").exists()  # the hosts' /srv, /tmp, home
        assert Testbed.running(testbed.instance) is None
        assert not testbed.status().exists
        assert testbed.down().removed == ()  # down on nothing is fine
    finally:
        testbed.up(3)
    assert testbed.status().healthy
    assert ssh(testbed, "tb1", "hostname").stdout.strip() == "tb1"


def test_dead_holder_is_half_up_and_down_cleans_it(healthy_testbed: Testbed) -> None:
    tb = healthy_testbed
    state = json.loads(tb.state_file.read_text())
    holder = state["hosts"][0]["holder"]["pid"]
    os.kill(holder, 9)
    deadline = time.monotonic() + 30
    while pid_alive(holder):
        assert time.monotonic() < deadline, f"holder {holder} outlived SIGKILL"
        time.sleep(0.01)
    with pytest.raises(LaunchError, match=r"half up .*tb1: namespace holder process gone"):
        tb.up(3)
    tb.repair()  # down + up
    assert tb.status().healthy


# ---------------------------------------------------------------------------- CLI


def test_cli_status_up_down(testbed: Testbed, tmp_path: Path) -> None:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    runner = CliRunner()
    res = runner.invoke(app, ["testbed", "status", "--json", "--state-dir", str(testbed.state_dir)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["healthy"] and [h["name"] for h in data["hosts"]] == HOSTS
    res = runner.invoke(app, ["testbed", "up", "3", "--state-dir", str(testbed.state_dir)])
    assert res.exit_code == 0, res.output
    assert "already up" in res.stdout
    assert f"--hosts {testbed.state_dir}/hostfile --ssh-config" in res.stdout
    empty = tmp_path / "none"
    instance = ("--instance", str(testbed.instance))
    res = runner.invoke(app, ["testbed", "status", "--state-dir", str(empty), *instance])
    assert res.exit_code == 1
    assert f"a testbed is up in {testbed.state_dir}" in res.stdout
    res = runner.invoke(app, ["testbed", "down", "--state-dir", str(empty)])
    assert res.exit_code == 0 and "nothing to do" in res.stdout
