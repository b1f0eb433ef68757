"""asyncssh/OS errors are translated at the transport edge into ConnectError & co."""

from __future__ import annotations

import asyncio
import errno
import socket
from pathlib import Path

import asyncssh
import pytest

from corral.errors import ConfigError, ConnectError, TransportError
from corral.transport.options import SshOptions
from corral.transport.ssh import SshTransport, is_transient, translate_error
from corral.transport.ssh.known_hosts import HostKeyDecision, HostKeyVerdict, KnownHostsPolicy


def cause_of(exc: BaseException, **kwargs: object) -> str | None:
    error = translate_error(exc, host="node7", target="ml@10.0.0.7:2222", **kwargs)  # type: ignore[arg-type]
    assert isinstance(error, ConnectError)
    assert error.host == "node7"
    assert str(error).startswith("node7: ")
    return error.cause


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (asyncssh.PermissionDenied("Permission denied"), "auth failed"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "connection refused"),
        (
            OSError(
                "Multiple exceptions: [Errno 111] Connect call failed ('::1', 22, 0, 0), "
                "[Errno 111] Connect call failed ('127.0.0.1', 22)"
            ),
            "connection refused",
        ),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "unreachable"),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), "unreachable"),
        (asyncio.TimeoutError(), "timeout"),
        (TimeoutError(), "timeout"),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "DNS lookup failed"),
        (asyncssh.ConnectionLost("Connection lost"), "connection lost"),
        (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), "connection lost"),
        (asyncssh.ProtocolError("bad packet"), "disconnected"),
        (asyncssh.KeyImportError("Invalid key"), "bad key"),
        (OSError(errno.EIO, "I/O error"), "unreachable"),
        (RuntimeError("weird"), "error"),
    ],
)
def test_error_causes(exc: BaseException, cause: str) -> None:
    assert cause_of(exc) == cause


def test_messages_name_the_target() -> None:
    error = translate_error(
        asyncssh.PermissionDenied("Permission denied"), host="node7", target="ml@10.0.0.7:2222"
    )
    assert "ml@10.0.0.7:2222" in str(error)
    assert "--ssh-key" in str(error)


def test_timeout_message_says_how_long() -> None:
    error = translate_error(asyncio.TimeoutError(), host="n", timeout=5.0)
    assert "within 5 s" in str(error)


def test_transport_errors_pass_through() -> None:
    original = ConnectError("x", host="h", cause="auth failed")
    assert translate_error(original, host="other") is original


def test_unknown_host_key_says_how_to_fix(tmp_path: Path) -> None:
    policy = KnownHostsPolicy([tmp_path / "kh"])
    decision = HostKeyDecision(
        verdict=HostKeyVerdict.UNKNOWN, lookup_host="10.0.0.7", port=2222, fingerprint="SHA256:x"
    )
    error = translate_error(
        asyncssh.HostKeyNotVerifiable("Host key is not trusted"),
        host="node7",
        decision=decision,
        policy=policy,
    )
    assert error.cause == "unknown host key"
    text = str(error)
    assert f"ssh-keyscan -p 2222 10.0.0.7 >> {tmp_path / 'kh'}" in text
    assert "--accept-new-host-keys" in text
    assert "SHA256:x" in text


def test_changed_host_key_warns_of_mitm(tmp_path: Path) -> None:
    policy = KnownHostsPolicy([tmp_path / "kh"])
    decision = HostKeyDecision(verdict=HostKeyVerdict.MISMATCH, lookup_host="10.0.0.7", port=22)
    error = translate_error(
        asyncssh.HostKeyNotVerifiable("Host key is not trusted"),
        host="node7",
        decision=decision,
        policy=policy,
    )
    assert error.cause == "host key mismatch"
    text = str(error)
    assert "man-in-the-middle" in text
    assert f"ssh-keygen -R 10.0.0.7 -f {tmp_path / 'kh'}" in text
    assert "--accept-new-host-keys" not in text


def test_host_key_error_without_decision_keeps_asyncssh_reason() -> None:
    reason = "Host key is not trusted for host jump.example"
    error = translate_error(asyncssh.HostKeyNotVerifiable(reason), host="h")
    assert error.cause == "unknown host key"
    assert "jump.example" in str(error)


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (asyncssh.ConnectionLost("lost"), True),
        (ConnectionResetError(errno.ECONNRESET, "reset"), True),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), True),
        (OSError("Multiple exceptions: [Errno 111] Connect call failed"), True),
        (socket.gaierror(socket.EAI_AGAIN, "Temporary failure"), True),
        (socket.gaierror(socket.EAI_NONAME, "unknown"), False),
        (asyncio.TimeoutError(), False),
        (OSError(errno.EHOSTUNREACH, "No route"), False),
        (asyncssh.PermissionDenied("denied"), False),
        (asyncssh.HostKeyNotVerifiable("no"), False),
    ],
)
def test_transient_errors(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


# -- settings errors, before any connection ---------------------------------------------


def test_password_is_read_from_the_named_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_PW", "s3cret-pw")
    transport = SshTransport(SshOptions(password_env="CORRAL_TEST_PW"))
    assert "s3cret-pw" not in repr(transport)
    assert "s3cret-pw" not in str(vars(transport).get("user"))


def test_missing_password_env_var_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_TEST_PW", raising=False)
    with pytest.raises(ConfigError, match="CORRAL_TEST_PW"):
        SshTransport(SshOptions(password_env="CORRAL_TEST_PW"))


def test_missing_ssh_config_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--ssh-config"):
        SshTransport(SshOptions(config=str(tmp_path / "nope")))


def test_missing_key_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--ssh-key"):
        SshTransport(SshOptions(key=str(tmp_path / "id_nope")))


def test_garbage_key_is_a_config_error(tmp_path: Path) -> None:
    key = tmp_path / "id_bad"
    key.write_text("not a key\n")
    with pytest.raises(ConfigError, match="--ssh-key"):
        SshTransport(SshOptions(key=str(key)))


def test_encrypted_key_points_to_ssh_agent(tmp_path: Path) -> None:
    key = tmp_path / "id_enc"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(
        str(key), format_name="pkcs8-pem", passphrase="pw"
    )
    with pytest.raises(ConfigError, match="ssh-add"):
        SshTransport(SshOptions(key=str(key)))


def test_connect_error_is_a_transport_error() -> None:
    assert issubclass(ConnectError, TransportError)
