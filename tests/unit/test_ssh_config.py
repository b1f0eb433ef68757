"""The ssh config's host key settings: refused when they turn checking off, unless told."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.cluster import Host
from corral.errors import ConnectError
from corral.transport.options import SshOptions
from corral.transport.ssh import SshTransport
from corral.transport.ssh.config import (
    config_file_name,
    disabling_settings,
    host_key_files,
    strict_host_key_checking,
)
from corral.transport.ssh.known_hosts import GLOBAL_KNOWN_HOSTS, KnownHostsPolicy


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of its own, so the user's real ~/.ssh never takes part."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize(
    ("user_known_hosts", "strict", "found"),
    [
        (None, None, []),
        ([], None, ["UserKnownHostsFile none"]),
        (["/dev/null"], None, ["UserKnownHostsFile /dev/null"]),
        (["/dev/null", "/dev/null"], None, ["UserKnownHostsFile /dev/null /dev/null"]),
        (["/dev/null", "~/.ssh/kh2"], None, []),
        (["~/.ssh/known_hosts"], "yes", []),
        (None, "accept-new", []),
        (None, "ask", []),
        (None, "no", ["StrictHostKeyChecking no"]),
        (None, "OFF", ["StrictHostKeyChecking OFF"]),
        ([], "no", ["UserKnownHostsFile none", "StrictHostKeyChecking no"]),
    ],
)
def test_disabling_settings(user_known_hosts: object, strict: str | None, found: list[str]) -> None:
    assert disabling_settings(user_known_hosts, strict) == found


def test_disabling_setting_is_refused_naming_file_host_and_options() -> None:
    with pytest.raises(ConnectError) as info:
        host_key_files(
            None, ["UserKnownHostsFile none"], host="node7", config_file="/etc/corral/ssh_config"
        )
    error = info.value
    assert error.host == "node7"
    assert error.cause == "host key checking disabled"
    text = str(error)
    assert "ssh config /etc/corral/ssh_config sets 'UserKnownHostsFile none' for node7" in text
    assert "corral always verifies host keys" in text
    assert "--accept-new-host-keys" in text and "--insecure-no-host-key-check" in text


def test_accept_new_verifies_against_the_default_file_instead(home: Path) -> None:
    default = home / ".ssh" / "known_hosts"
    files = host_key_files(
        None, ["UserKnownHostsFile none"], host="h", config_file="c", accept_new=True
    )
    assert files == [default, *GLOBAL_KNOWN_HOSTS]
    files = host_key_files(
        ["/dev/null"], ["UserKnownHostsFile /dev/null"], host="h", config_file="c", accept_new=True
    )
    assert files == [default]
    files = host_key_files(
        ["/k"], ["StrictHostKeyChecking no"], host="h", config_file="c", accept_new=True
    )
    assert files == [Path("/k")]


def test_insecure_option_turns_checking_off_even_without_a_config() -> None:
    assert (
        host_key_files(None, ["UserKnownHostsFile none"], host="h", config_file="c", insecure=True)
        is None
    )
    assert host_key_files(["/k"], [], host="h", config_file="c", insecure=True) is None


def test_normal_settings_keep_their_files(home: Path) -> None:
    assert host_key_files(["/a", "/b"], [], host="h", config_file="c") == [Path("/a"), Path("/b")]
    assert host_key_files([], [], host="h", config_file="c") == [
        home / ".ssh" / "known_hosts",
        *GLOBAL_KNOWN_HOSTS,
    ]


def test_dev_null_never_receives_new_keys(home: Path) -> None:
    # GlobalKnownHostsFile /dev/null alone: the user's file comes first, for new keys
    files = host_key_files(["/dev/null"], [], host="h", config_file="c")
    assert files == [home / ".ssh" / "known_hosts"]


def test_strict_host_key_checking_follows_host_blocks(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host lab-*\n    StrictHostKeyChecking no\n"
        "Host *\n    StrictHostKeyChecking yes\n    User someone\n"
    )
    assert strict_host_key_checking([str(config)], "lab-3") == "no"
    assert strict_host_key_checking([str(config)], "prod-1") == "yes"


def test_strict_host_key_checking_without_any_config() -> None:
    assert strict_host_key_checking((), "h") is None
    assert config_file_name(()).endswith("/.ssh/config")


def test_default_config_is_read_and_named(home: Path) -> None:
    (home / ".ssh").mkdir()
    (home / ".ssh" / "config").write_text("StrictHostKeyChecking=off\n")
    assert strict_host_key_checking((), "h") == "off"
    assert config_file_name(()) == str(home / ".ssh" / "config")


# -- through the transport: the ssh config as asyncssh parses it -----------------------


def policy_for(options: SshOptions, host: Host) -> KnownHostsPolicy:
    async def main() -> KnownHostsPolicy:
        transport = SshTransport(options)
        try:
            return (await transport._prepare(host)).policy
        finally:
            await transport.close()

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("line", "setting"),
    [
        ("UserKnownHostsFile none", "UserKnownHostsFile none"),
        ("UserKnownHostsFile /dev/null", "UserKnownHostsFile /dev/null"),
        ("StrictHostKeyChecking no", "StrictHostKeyChecking no"),
    ],
)
def test_transport_refuses_a_config_that_turns_checking_off(
    tmp_path: Path, line: str, setting: str
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host node1\n    HostName 192.0.2.1\n    {line}\n")
    with pytest.raises(ConnectError) as info:
        policy_for(SshOptions(config=str(config)), Host(name="node1"))
    assert info.value.host == "node1"
    assert f"ssh config {config} sets '{setting}' for node1" in str(info.value)


def test_transport_refusal_applies_to_the_matching_host_only(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    known = tmp_path / "known_hosts"
    config.write_text(
        "Host lab\n    UserKnownHostsFile none\n"
        f"Host *\n    HostName 192.0.2.1\n    UserKnownHostsFile {known}\n"
    )
    policy = policy_for(SshOptions(config=str(config)), Host(name="prod"))
    assert policy.files == [known]


def test_transport_with_accept_new_checks_against_the_default_file(
    tmp_path: Path, home: Path
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host node1\n    HostName 192.0.2.1\n    UserKnownHostsFile none\n")
    options = SshOptions(config=str(config), accept_new_host_keys=True)
    policy = policy_for(options, Host(name="node1"))
    assert policy.enabled and policy.accept_new
    assert policy.primary == home / ".ssh" / "known_hosts"


def test_transport_with_the_insecure_option_does_not_check(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host node1\n    HostName 192.0.2.1\n    UserKnownHostsFile none\n")
    options = SshOptions(config=str(config), insecure_no_host_key_check=True)
    assert not policy_for(options, Host(name="node1")).enabled
