"""Pure parts of the testbed (no root needed): addresses, state, rendered files, checks."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from corral.cli.testbed import register
from corral.errors import ConfigError, LaunchError
from corral.testbed import Testbed, default_state_dir, missing_requirements
from corral.testbed import _system as sysx
from corral.testbed._model import (
    KeptPath,
    PrivateDir,
    ProcessRecord,
    TestbedState,
    check_state_dir,
    new_state,
    plan_mounts,
    plan_network,
    render_etc_hosts,
    render_hostfile,
    render_known_hosts,
    render_ssh_config,
    render_sshd_config,
)


def test_mount_plan_gives_each_host_srv_tmp_and_home_keeping_what_it_needs() -> None:
    keep = ["/tmp/pytest-3/tb", "/tmp/pytest-3/tb/sub", "/root/venv", "/work/.venv", "/usr"]
    plan = plan_mounts(Path("/tmp/pytest-3/tb/hosts/tb1"), "/root", keep)
    fs = "/tmp/pytest-3/tb/hosts/tb1/fs"
    assert plan.private == (
        PrivateDir("/srv", f"{fs}/srv", 0o755),
        PrivateDir("/tmp", f"{fs}/tmp", 0o1777),
        PrivateDir("/root", f"{fs}/root", 0o700),
    )
    # Only what a private dir hides, and a path inside a kept one is kept with it.
    assert plan.kept == (
        KeptPath("/root/venv", f"{fs}/root/venv"),
        KeptPath("/tmp/pytest-3/tb", f"{fs}/tmp/pytest-3/tb"),
    )
    assert plan.directories()[-1] == (f"{fs}/tmp/pytest-3/tb", 0o755)
    # Kept paths are bound while still visible, before any private dir hides them;
    # /tmp, which holds the sources here, is mounted last.
    assert plan.script().splitlines() == [
        f"mount --bind /root/venv {fs}/root/venv",
        f"mount --bind /tmp/pytest-3/tb {fs}/tmp/pytest-3/tb",
        f"mount --rbind {fs}/srv /srv",
        f"mount --rbind {fs}/root /root",
        f"mount --rbind {fs}/tmp /tmp",
    ]
    in_home = plan_mounts(Path("/root/.cache/tb/hosts/tb1"), "/root", ["/root/.cache/tb"])
    assert (
        in_home.script().splitlines()[-1] == "mount --rbind /root/.cache/tb/hosts/tb1/fs/root /root"
    )
    assert plan.locate("/srv/corral/ck") == f"{fs}/srv/corral/ck"
    assert plan.locate("/root") == f"{fs}/root"
    assert plan.locate("/tmp/pytest-3/tb/hostfile") == "/tmp/pytest-3/tb/hostfile"
    assert [plan.locate(p) for p in ("/etc/hosts", "/srvx", "srv/corral")] == [None] * 3
    quoted = plan_mounts(Path("/x"), "/home/a b", ["/home/a b/v env"]).script()
    assert "mount --bind '/home/a b/v env' '/x/fs/home/a b/v env'" in quoted


@pytest.mark.parametrize(
    ("home", "keep", "match"),
    [
        ("/", [], "home '/' must be"),
        ("/tmp/home", [], "must be an absolute directory outside"),
        ("root", [], "must be an absolute"),
        ("/root", ["/tmp"], "/tmp is needed on every host"),
    ],
)
def test_mount_plan_refuses_what_cannot_be_private(home: str, keep: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        plan_mounts(Path("/state/hosts/tb1"), home, keep)


def test_plan_default_subnet() -> None:
    plan = plan_network("10.77.0.0/24", 3)
    assert plan.host_addresses == ("10.77.0.1", "10.77.0.2", "10.77.0.3")
    assert plan.bridge_address == "10.77.0.254"
    assert plan.prefixlen == 24


def test_plan_small_subnet_limits_hosts() -> None:
    assert plan_network("192.168.5.0/29", 5).bridge_address == "192.168.5.6"
    with pytest.raises(ConfigError, match="room for 5 hosts"):
        plan_network("192.168.5.0/29", 6)


@pytest.mark.parametrize(
    ("subnet", "message"),
    [
        ("8.8.8.0/24", "not a private network"),
        ("fd00::/64", "not an IPv4 network"),
        ("10.77.0.1/24", "not a network address"),
        ("banana", "not a network address"),
        ("127.0.0.0/8", "not a private network"),
    ],
)
def test_plan_rejects_bad_subnets(subnet: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        plan_network(subnet, 2)
    assert info.value.option == "--subnet"


@pytest.mark.parametrize("n", [0, -1, 251])
def test_plan_rejects_bad_host_counts(n: int) -> None:
    with pytest.raises(ConfigError, match="number of hosts"):
        plan_network("10.0.0.0/16", n)


def test_state_dir_must_be_config_safe(tmp_path: Path) -> None:
    assert check_state_dir(tmp_path / "ok") == tmp_path / "ok"
    for bad in ("with space", "pct%d", "quote'"):
        with pytest.raises(ConfigError, match="must not contain"):
            check_state_dir(tmp_path / bad)


def test_default_state_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/var/tmp/cachehome")
    assert default_state_dir() == Path("/var/tmp/cachehome/corral/testbed")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_state_dir() == Path.home() / ".cache" / "corral" / "testbed"


def _state(tmp_path: Path) -> TestbedState:
    return new_state(tmp_path, plan_network("10.77.0.0/24", 2), slots=4)


def test_state_names_and_json_roundtrip(tmp_path: Path) -> None:
    state = _state(tmp_path)
    assert [(h.name, h.netns, h.veth) for h in state.hosts] == [
        ("tb1", "corral-tb1", "crl-tb1"),
        ("tb2", "corral-tb2", "crl-tb2"),
    ]
    assert all(
        len(h.veth) <= 15 for h in new_state(tmp_path, plan_network("10.0.0.0/16", 250), 1).hosts
    )
    state.hosts[0].holder = ProcessRecord(pid=10, start_time=99, exe="/usr/bin/sleep")
    state.hosts[0].netns_inode = 4026532000
    state.created_paths.append("/srv/corral")
    again = TestbedState.from_json(state.to_json())
    assert dataclasses.asdict(again) == dataclasses.asdict(state)
    assert again.host("tb1").holder == state.hosts[0].holder
    with pytest.raises(ConfigError, match="no testbed host 'tb9'"):
        again.host("tb9")


@pytest.mark.parametrize("text", ["{", "{}", '{"version": 99}', "[]"])
def test_unreadable_state_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="unreadable testbed state"):
        TestbedState.from_json(text)


def test_rendered_files(tmp_path: Path) -> None:
    state = _state(tmp_path)
    hosts = render_etc_hosts(state.hosts, state.bridge_address)
    assert "10.77.0.1\ttb1\n10.77.0.2\ttb2\n" in hosts
    assert "127.0.1.1" not in hosts and "127.0.0.1\tlocalhost\n" in hosts
    assert render_hostfile(state.hosts, 4) == "tb1 slots=4\ntb2 slots=4\n"
    cfg = render_ssh_config(state.hosts, tmp_path / "id_ed25519", tmp_path / "known_hosts")
    assert "Host tb2\n    HostName 10.77.0.2\n    User root\n    Port 22\n" in cfg
    assert f"IdentityFile {tmp_path}/id_ed25519" in cfg
    assert f"UserKnownHostsFile {tmp_path}/known_hosts" in cfg
    assert "StrictHostKeyChecking yes" in cfg
    known = render_known_hosts([(state.hosts[0], "ssh-ed25519 AAAAkey\n")])
    assert known == "tb1,10.77.0.1 ssh-ed25519 AAAAkey\n"
    sshd = render_sshd_config(
        state.hosts[1],
        host_key=tmp_path / "hk",
        pid_file=tmp_path / "pid",
        authorized_keys=tmp_path / "ak",
    ).splitlines()
    for line in (
        "ListenAddress 10.77.0.2:22",
        f"PidFile {tmp_path}/pid",
        "PasswordAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",
        "AcceptEnv *",
    ):
        assert line in sshd


def test_missing_requirements_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sysx, "which", lambda name: None if name in ("sshd", "ip") else "/x")
    problems = missing_requirements()
    assert problems[0].startswith("the testbed needs root")
    assert "`sshd` is not installed: apt-get install -y openssh-server" in problems
    assert "`ip` is not installed: apt-get install -y iproute2" in problems
    with pytest.raises(LaunchError, match="apt-get install -y openssh-server"):
        sysx.check_requirements()
    with pytest.raises(LaunchError, match="needs root"):
        Testbed("/tmp/unused-testbed-dir").up(3)


def test_not_linux_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert missing_requirements() == [
        "the testbed needs Linux (network namespaces); this is darwin"
    ]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_process_identity_includes_start_time() -> None:
    me = sysx.record(os.getpid())
    assert sysx.is_ours(me)
    assert not sysx.is_ours(dataclasses.replace(me, start_time=me.start_time + 1))
    assert not sysx.is_ours(dataclasses.replace(me, exe="/bin/false"))
    assert not sysx.is_ours(None)


def test_cli_registers_testbed_group(monkeypatch: pytest.MonkeyPatch) -> None:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    runner = CliRunner()
    res = runner.invoke(app, ["testbed", "--help"])
    assert res.exit_code == 0
    for verb in ("up", "down", "status"):
        assert verb in res.stdout
    monkeypatch.setattr(sysx, "missing_requirements", lambda: ["the testbed needs root"])
    res = runner.invoke(app, ["testbed", "up", "2", "--state-dir", "/tmp/unused-testbed-dir"])
    assert isinstance(res.exception, LaunchError)
    assert "needs root" in str(res.exception)
