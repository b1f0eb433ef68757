"""Host key policy: known -> accept, unknown -> refuse (or record with accept-new),
changed -> always refuse."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import stat
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from corral.transport.ssh.known_hosts import (
    GLOBAL_KNOWN_HOSTS,
    HostKeyDecision,
    HostKeyVerdict,
    KnownHostsPolicy,
    default_known_hosts,
    host_pattern,
    keygen_remove_command,
    keyscan_command,
    known_hosts_files,
)


def new_key() -> Any:
    return asyncssh.generate_private_key("ssh-ed25519").convert_to_public()


def openssh(key: Any) -> str:
    return str(key.export_public_key("openssh").decode().strip())


@pytest.fixture
def key_a() -> Any:
    return new_key()


@pytest.fixture
def key_b() -> Any:
    return new_key()


def decide(policy: KnownHostsPolicy, key: Any, host: str = "10.0.0.5", port: int = 22) -> Any:
    decision = HostKeyDecision()
    addr = host if host[0].isdigit() else "192.0.2.1"
    accepted = policy.decide(decision, host, addr, port, key)
    return accepted, decision


def test_host_pattern() -> None:
    assert host_pattern("h", None) == "h"
    assert host_pattern("h", 22) == "h"
    assert host_pattern("h", 2222) == "[h]:2222"


def test_fix_commands() -> None:
    assert keyscan_command("10.0.0.5", 22, "/k h") == "ssh-keyscan 10.0.0.5 >> '/k h'"
    assert keyscan_command("h", 2222, "/kh") == "ssh-keyscan -p 2222 h >> /kh"
    assert keygen_remove_command("h", 2222, "/kh") == "ssh-keygen -R '[h]:2222' -f /kh"
    assert keygen_remove_command("h", None, "/kh") == "ssh-keygen -R h -f /kh"


def test_unknown_host_is_refused_and_nothing_written(tmp_path: Path, key_a: Any) -> None:
    kh = tmp_path / "known_hosts"
    accepted, decision = decide(KnownHostsPolicy([kh]), key_a)
    assert not accepted
    assert decision.verdict is HostKeyVerdict.UNKNOWN
    assert decision.fingerprint.startswith("SHA256:")
    assert not kh.exists()


def test_accept_new_records_the_key(tmp_path: Path, key_a: Any) -> None:
    kh = tmp_path / "sub" / "known_hosts"
    policy = KnownHostsPolicy([kh], accept_new=True)
    accepted, decision = decide(policy, key_a, host="10.0.0.5", port=2222)
    assert accepted
    assert decision.verdict is HostKeyVerdict.RECORDED
    assert kh.read_text() == f"[10.0.0.5]:2222 {openssh(key_a)}\n"
    assert stat.S_IMODE(kh.stat().st_mode) == 0o600
    # what asyncssh will match next time
    fresh = KnownHostsPolicy([kh])
    assert fresh.listed("10.0.0.5", "10.0.0.5", 2222)


def test_accept_new_appends_after_a_file_without_final_newline(
    tmp_path: Path, key_a: Any, key_b: Any
) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(f"other {openssh(key_b)}")
    decide(KnownHostsPolicy([kh], accept_new=True), key_a, host="new")
    lines = kh.read_text().splitlines()
    assert lines == [f"other {openssh(key_b)}", f"new {openssh(key_a)}"]


def test_changed_key_is_refused_even_with_accept_new(
    tmp_path: Path, key_a: Any, key_b: Any
) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(f"10.0.0.5 {openssh(key_a)}\n")
    before = kh.read_text()
    for accept_new in (False, True):
        accepted, decision = decide(KnownHostsPolicy([kh], accept_new=accept_new), key_b)
        assert not accepted
        assert decision.verdict is HostKeyVerdict.MISMATCH
    assert kh.read_text() == before


def test_a_key_recorded_in_this_run_is_remembered(tmp_path: Path, key_a: Any, key_b: Any) -> None:
    kh = tmp_path / "known_hosts"
    policy = KnownHostsPolicy([kh], accept_new=True)
    assert decide(policy, key_a)[0]
    accepted, decision = decide(policy, key_b)
    assert not accepted
    assert decision.verdict is HostKeyVerdict.MISMATCH
    assert kh.read_text().count("\n") == 1


def test_entries_by_name_or_address_both_count(tmp_path: Path, key_a: Any, key_b: Any) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(f"tb1,10.77.0.1 {openssh(key_a)}\n")
    policy = KnownHostsPolicy([kh])
    assert policy.listed("tb1", "10.77.0.9", None)
    assert policy.listed("other", "10.77.0.1", None)
    assert not policy.listed("tb2", "10.77.0.2", None)


def test_hashed_entries_are_recognised(tmp_path: Path, key_a: Any, key_b: Any) -> None:
    salt = os.urandom(20)
    digest = hmac.new(salt, b"secret-host", hashlib.sha1).digest()
    entry = f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{entry} {openssh(key_a)}\n")
    accepted, decision = decide(KnownHostsPolicy([kh]), key_b, host="secret-host")
    assert not accepted
    assert decision.verdict is HostKeyVerdict.MISMATCH


def test_all_files_are_read_and_the_first_is_written(
    tmp_path: Path, key_a: Any, key_b: Any
) -> None:
    user, extra = tmp_path / "user", tmp_path / "global"
    extra.write_text(f"h1 {openssh(key_a)}\n")
    policy = KnownHostsPolicy([user, extra], accept_new=True)
    assert policy.primary == user
    assert decide(policy, key_b, host="h1")[1].verdict is HostKeyVerdict.MISMATCH
    assert decide(policy, key_b, host="h2")[1].verdict is HostKeyVerdict.RECORDED
    assert [line.split()[0] for line in user.read_text().splitlines()] == ["h2"]
    assert [line.split()[0] for line in extra.read_text().splitlines()] == ["h1"]


def test_known_hosts_files_from_asyncssh_options() -> None:
    assert known_hosts_files(None) is None  # UserKnownHostsFile none
    assert known_hosts_files([]) == [default_known_hosts(), *GLOBAL_KNOWN_HOSTS]
    assert known_hosts_files(()) == [default_known_hosts(), *GLOBAL_KNOWN_HOSTS]
    assert known_hosts_files(["~/kh", "/dev/null"]) == [
        Path("~/kh").expanduser(),
        Path("/dev/null"),
    ]
    assert known_hosts_files("/x/kh") == [Path("/x/kh")]


def test_disabled_policy() -> None:
    policy = KnownHostsPolicy(None)
    assert not policy.enabled
    assert policy.primary == default_known_hosts()
