"""SshTransport against real OpenSSH sshd on the netns testbed (tb1..tb3)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import asyncssh
import pytest

from corral.cluster import Cluster, Host, load_cluster
from corral.errors import ConnectError, ConnectionLost
from corral.testbed import Testbed
from corral.transport.options import SshOptions
from corral.transport.ssh import EXIT_LOST, SshTransport

from .conftest import require_testbed_support, spare_address

pytestmark = pytest.mark.netns

T = TypeVar("T")

NASTY = [
    "with space",
    "it's",
    '"double"',
    "$(touch /tmp/corral-pwned)",
    "`id`",
    "a; echo injected",
    "a && b || c | d > e",
    "line1\nline2\n",
    "tab\there",
    "ünïcødé ✓ 😀",
    "",
    "-n",
    "*",
    "~",
    "$HOME",
    "back\\slash",
    "'",
    "%d %s",
]
ECHO_ARGS = "import sys, json; print(json.dumps(sys.argv[1:]))"


def arun(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


def cluster_of(tb: Testbed) -> Cluster:
    return load_cluster(str(tb.hostfile))


def host(tb: Testbed, name: str) -> Host:
    return cluster_of(tb).host(name)


def options(tb: Testbed, **kwargs: object) -> SshOptions:
    return SshOptions(config=str(tb.ssh_config), **kwargs)  # type: ignore[arg-type]


def config_with_known_hosts(tb: Testbed, tmp_path: Path, known_hosts: Path) -> Path:
    """A copy of the testbed's ssh_config whose hosts use ``known_hosts`` instead."""
    text = tb.ssh_config.read_text()
    text = re.sub(r"(?m)^(\s*UserKnownHostsFile)\s+\S+", rf"\1 {known_hosts}", text)
    config = tmp_path / "ssh_config"
    config.write_text(text)
    return config


async def run_to_end(
    transport: SshTransport, h: Host, argv: list[str], **kwargs: object
) -> tuple[int, bytes, bytes]:
    proc = await transport.start(h, argv, **kwargs)  # type: ignore[arg-type]
    proc.close_stdin()
    out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
    return await proc.wait(), out, err


def with_transport(
    opts: SshOptions, body: Callable[[SshTransport], Awaitable[T]], **kwargs: object
) -> T:
    async def main() -> T:
        transport = SshTransport(opts, **kwargs)  # type: ignore[arg-type]
        try:
            return await body(transport)
        finally:
            await transport.close()

    return asyncio.run(main())


# -- commands, quoting, env, cwd ----------------------------------------------------------


def test_arguments_arrive_verbatim_on_every_host(testbed: Testbed) -> None:
    cluster = cluster_of(testbed)

    async def body(t: SshTransport) -> list[tuple[int, bytes, bytes]]:
        return await asyncio.gather(
            *(run_to_end(t, h, ["python3", "-c", ECHO_ARGS, *NASTY]) for h in cluster)
        )

    for code, out, err in with_transport(options(testbed), body):
        assert code == 0, err
        assert json.loads(out) == NASTY
        assert err == b""
    assert not Path("/tmp/corral-pwned").exists()


def test_env_and_cwd_are_applied_and_nothing_else_forwarded(
    testbed: Testbed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_LOCAL_SECRET", "must-not-leak")
    monkeypatch.setenv("LC_CORRAL_TEST", "must-not-leak")  # SendEnv-style names too
    h = host(testbed, "tb2")
    env = {"CORRAL_A": "x y", "CORRAL_B": "$(nope) 'q' ü\nz"}
    script = "import os, json; print(json.dumps([os.getcwd(), dict(os.environ)]))"

    async def body(t: SshTransport) -> tuple[int, bytes, bytes]:
        return await run_to_end(t, h, ["python3", "-c", script], env=env, cwd="/srv/corral")

    code, out, err = with_transport(options(testbed), body)
    assert code == 0, err
    cwd, remote_env = json.loads(out)
    assert cwd == "/srv/corral"
    assert remote_env["CORRAL_A"] == env["CORRAL_A"]
    assert remote_env["CORRAL_B"] == env["CORRAL_B"]
    assert "CORRAL_LOCAL_SECRET" not in remote_env
    assert "LC_CORRAL_TEST" not in remote_env


def test_missing_cwd_fails_with_the_shell_error(testbed: Testbed) -> None:
    h = host(testbed, "tb1")

    async def body(t: SshTransport) -> tuple[int, bytes, bytes]:
        return await run_to_end(t, h, ["true"], cwd="/nonexistent/corral")

    code, _, err = with_transport(options(testbed), body)
    assert code == 1, err  # `cd DIR && exec ...`: the failed cd's status
    assert b"/nonexistent/corral" in err


def test_shell_command_uses_the_login_shell(testbed: Testbed) -> None:
    h = host(testbed, "tb3")

    async def body(t: SshTransport) -> tuple[int, bytes]:
        proc = await t.start_shell(h, "echo $HOSTNAME; hostname | tr a-z A-Z; exit 4")
        out = await proc.stdout.read()
        return await proc.wait(), out

    code, out = with_transport(options(testbed), body)
    assert (code, out) == (4, b"tb3\nTB3\n")


def test_stdin_round_trip(testbed: Testbed) -> None:
    h = host(testbed, "tb1")

    async def body(t: SshTransport) -> tuple[int, bytes]:
        proc = await t.start(h, ["python3", "-c", "import sys; print(sys.stdin.read().upper())"])
        proc.write(b"hello ")
        proc.write(b"stdin")
        proc.close_stdin()
        out = await proc.stdout.read()
        return await proc.wait(), out

    assert with_transport(options(testbed), body) == (0, b"HELLO STDIN\n")


def test_one_connection_per_host_is_shared(testbed: Testbed) -> None:
    h = host(testbed, "tb2")

    async def body(t: SshTransport) -> list[bytes]:
        # concurrent starts share one connect; later ones reuse it
        first = await asyncio.gather(
            *(run_to_end(t, h, ["sh", "-c", "echo $SSH_CONNECTION"]) for _ in range(5))
        )
        later = await run_to_end(t, h, ["sh", "-c", "echo $SSH_CONNECTION"])
        assert t.connected(h)
        return [out for _, out, _ in [*first, later]]

    outs = with_transport(options(testbed), body)
    assert len(set(outs)) == 1, outs


def test_exit_status_and_signal(testbed: Testbed) -> None:
    h = host(testbed, "tb1")

    async def body(t: SshTransport) -> list[int]:
        codes = []
        for argv in (["sh", "-c", "exit 7"], ["sh", "-c", "kill -TERM $$"]):
            code, _, _ = await run_to_end(t, h, argv)
            codes.append(code)
        return codes

    assert with_transport(options(testbed), body) == [7, -15]


def test_kill_takes_down_the_remote_process_group(testbed: Testbed) -> None:
    h = host(testbed, "tb2")
    marker = f"{1000 + uuid.uuid4().int % 9000}.25"

    async def body(t: SshTransport) -> int | None:
        proc = await t.start_shell(h, f"sleep {marker} & sleep {marker}; echo never")
        deadline = time.monotonic() + 30  # the remote pid arrives after the login shell
        while proc.pid is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert proc.pid is not None
        return await proc.kill()

    assert with_transport(options(testbed), body) == -9
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        ps = testbed.run_on("tb2", ["ps", "-eo", "args"]).stdout
        if f"sleep {marker}" not in ps:
            break
        time.sleep(0.2)
    assert f"sleep {marker}" not in ps


def test_sigterm_reaches_the_process(testbed: Testbed) -> None:
    h = host(testbed, "tb3")
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(5)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )

    async def body(t: SshTransport) -> tuple[int, bytes]:
        proc = await t.start(h, ["python3", "-c", script])
        first = await proc.stdout.readline()
        assert first == b"ready\n"
        proc.signal(15)
        rest = await proc.stdout.read()
        return await asyncio.wait_for(proc.wait(), 10), rest

    assert with_transport(options(testbed), body) == (5, b"got TERM\n")


# -- connect errors -----------------------------------------------------------------------


def connect_error(opts: SshOptions, h: Host, **kwargs: object) -> ConnectError:
    async def body(t: SshTransport) -> None:
        await t.connect(h)

    with pytest.raises(ConnectError) as info:
        with_transport(opts, body, **kwargs)
    error = info.value
    assert error.host == h.name
    assert str(error).startswith(f"{h.name}: ")
    return error


def test_wrong_key_is_auth_failed(testbed: Testbed, tmp_path: Path) -> None:
    key = tmp_path / "id_wrong"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(key))
    error = connect_error(options(testbed, key=str(key)), host(testbed, "tb1"))
    assert error.cause == "auth failed"


def test_unknown_host_key_is_refused_with_the_fix(testbed: Testbed, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    config = config_with_known_hosts(testbed, tmp_path, empty)
    error = connect_error(SshOptions(config=str(config)), host(testbed, "tb2"))
    assert error.cause == "unknown host key"
    assert f"ssh-keyscan {testbed.host('tb2').address} >> {empty}" in str(error)
    assert "--accept-new-host-keys" in str(error)
    assert not empty.exists() or empty.read_text() == ""


def test_accept_new_records_and_then_trusts(testbed: Testbed, tmp_path: Path) -> None:
    recorded = tmp_path / "known_hosts"
    config = config_with_known_hosts(testbed, tmp_path, recorded)
    h = host(testbed, "tb2")

    async def body(t: SshTransport) -> int:
        code, _, _ = await run_to_end(t, h, ["true"])
        return code

    assert with_transport(SshOptions(config=str(config), accept_new_host_keys=True), body) == 0
    lines = recorded.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{testbed.host('tb2').address} ssh-")
    real_key = lines[0].split(None, 1)[1]
    assert real_key in testbed.known_hosts.read_text()
    # the recorded key is now trusted without accept-new
    assert with_transport(SshOptions(config=str(config)), body) == 0


def test_changed_host_key_is_always_refused(testbed: Testbed, tmp_path: Path) -> None:
    forged = tmp_path / "known_hosts"
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode()
    tb1 = testbed.host("tb1").address
    forged.write_text(f"tb1,{tb1} {other.strip()}\n")
    config = config_with_known_hosts(testbed, tmp_path, forged)
    for accept_new in (False, True):
        opts = SshOptions(config=str(config), accept_new_host_keys=accept_new)
        error = connect_error(opts, host(testbed, "tb1"))
        assert error.cause == "host key mismatch"
        assert "man-in-the-middle" in str(error)
        assert f"ssh-keygen -R {tb1} -f {forged}" in str(error)
    assert forged.read_text().count("\n") == 1


def test_config_without_known_hosts_is_refused_unless_insecure_is_explicit(
    testbed: Testbed, tmp_path: Path
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        re.sub(r"(?m)^(\s*UserKnownHostsFile)\s+\S+", r"\1 none", testbed.ssh_config.read_text())
    )
    h = host(testbed, "tb2")
    error = connect_error(SshOptions(config=str(config)), h)
    assert error.cause == "host key checking disabled"
    assert f"ssh config {config} sets 'UserKnownHostsFile none' for tb2" in str(error)
    assert "corral always verifies host keys" in str(error)

    async def body(t: SshTransport) -> tuple[int, bytes, bytes]:
        return await run_to_end(t, h, ["hostname"])

    insecure = SshOptions(config=str(config), insecure_no_host_key_check=True)
    assert with_transport(insecure, body) == (0, b"tb2\n", b"")


def test_stopped_sshd_is_connection_refused(healthy_testbed: Testbed) -> None:
    tb = healthy_testbed
    tb.kill_sshd("tb2")
    started = time.monotonic()
    error = connect_error(options(tb), host(tb, "tb2"), backoff=0.05, connect_timeout=120.0)
    assert error.cause == "connection refused"
    # the bound is the behaviour: a refused connect fails at once (after two short
    # retries), not when the 120 s connect timeout runs out
    assert time.monotonic() - started < 60


def test_cut_link_before_connect_is_timeout_or_unreachable(healthy_testbed: Testbed) -> None:
    tb = healthy_testbed
    tb.cut_link("tb3")
    started = time.monotonic()
    error = connect_error(options(tb), host(tb, "tb3"), connect_timeout=2.0)
    assert error.cause in ("timeout", "unreachable")
    # the bound is the behaviour: the 2 s connect timeout ends the attempt; unbounded, a
    # connect to a silent host waits for the kernel's SYN retries (over 2 minutes)
    assert time.monotonic() - started < 60


def test_unknown_alias_without_config_names_the_host(testbed: Testbed, tmp_path: Path) -> None:
    # an address with no sshd at all on a testbed-private address (never leaves the box)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host ghost\n    HostName {spare_address(testbed)}\n    ConnectTimeout 2\n")
    error = connect_error(SshOptions(config=str(config)), Host(name="ghost"))
    assert error.cause in ("timeout", "unreachable", "connection refused")


# -- a link cut while a command runs --------------------------------------------------------


def test_cut_link_mid_command_is_noticed(healthy_testbed: Testbed) -> None:
    tb = healthy_testbed
    h = host(tb, "tb2")

    async def body(t: SshTransport) -> tuple[float, int, ConnectionLost | None, bytes]:
        proc = await t.start_shell(h, "echo up; sleep 120")
        assert await proc.stdout.readline() == b"up\n"
        tb.cut_link("tb2")
        cut = time.monotonic()
        rest = await asyncio.wait_for(proc.stdout.read(), 90)
        code = await asyncio.wait_for(proc.wait(), 90)
        return time.monotonic() - cut, code, proc.lost, rest

    elapsed, code, lost, rest = with_transport(options(tb), body)
    # the bound is the behaviour: keepalives (5 s x 3 = 15 s by default) notice the cut
    # link; without them a silent peer goes unnoticed for many minutes (TCP retransmits)
    assert elapsed < 60
    assert code == EXIT_LOST
    assert isinstance(lost, ConnectionLost)
    assert lost.host == "tb2"
    assert lost.cause == "no keepalive reply"
    assert rest == b""


def test_reconnects_after_the_link_comes_back(healthy_testbed: Testbed) -> None:
    tb = healthy_testbed
    h = host(tb, "tb1")

    async def body(t: SshTransport) -> tuple[int, bytes]:
        await t.connect(h)
        assert t.connected(h)
        tb.cut_link("tb1")
        # the keepalive (1 s x 2) drops the dead connection
        deadline = time.monotonic() + 30
        while t.connected(h):
            assert time.monotonic() < deadline, "the cut connection was not dropped in 30 s"
            await asyncio.sleep(0.1)
        tb.restore_link("tb1")
        return (await run_to_end(t, h, ["hostname"]))[:2]

    opts = options(tb)
    result = with_transport(opts, body, keepalive_interval=1.0, keepalive_count_max=2)
    assert result == (0, b"tb1\n")


def test_proxyjump_from_the_ssh_config(testbed: Testbed, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        testbed.ssh_config.read_text()
        + f"\nHost tb3-via-tb1\n    HostName {testbed.host('tb3').address}\n    ProxyJump tb1\n"
        f"    User root\n    IdentityFile {testbed.key_path}\n"
        f"    UserKnownHostsFile {testbed.known_hosts}\n"
    )
    h = Host(name="tb3-via-tb1")

    async def body(t: SshTransport) -> tuple[int, bytes]:
        code, out, _ = await run_to_end(t, h, ["sh", "-c", "hostname; echo $SSH_CONNECTION"])
        return code, out

    code, out = with_transport(SshOptions(config=str(config)), body)
    assert code == 0
    name, connection = out.decode().splitlines()
    assert name == "tb3"
    assert connection.split()[0] == testbed.host("tb1").address  # the hop, not the coordinator


def test_hostfile_address_is_used_when_the_config_has_no_hostname(
    testbed: Testbed, tmp_path: Path
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host {testbed.host('tb2').address.rsplit('.', 1)[0]}.*\n    User root\n"
        f"    IdentityFile {testbed.key_path}\n    UserKnownHostsFile {testbed.known_hosts}\n"
    )
    h = Host(name="node-b", address=testbed.host("tb2").address)

    async def body(t: SshTransport) -> tuple[int, bytes]:
        code, out, _ = await run_to_end(t, h, ["hostname"])
        return code, out

    assert with_transport(SshOptions(config=str(config)), body) == (0, b"tb2\n")


# -- password auth (its own loopback sshd whose private /etc/shadow knows a test password) --


@pytest.fixture
def password_sshd(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """An sshd on 127.0.0.1 accepting only root's password, set in a private mount namespace."""
    require_testbed_support()  # root and sshd; fails rather than skips under CI=true
    password = "corral-pw-" + uuid.uuid4().hex[:8]
    hashed = subprocess.run(
        ["openssl", "passwd", "-6", "-stdin"], input=password, capture_output=True, text=True
    ).stdout.strip()
    lines = []
    for line in Path("/etc/shadow").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == "root":
            fields[1] = hashed
        lines.append(":".join(fields))
    shadow = tmp_path / "shadow"
    shadow.write_text("\n".join(lines) + "\n")
    shadow.chmod(0o600)
    host_key = tmp_path / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "sshd_config"
    conf.write_text(
        f"ListenAddress 127.0.0.1:{port}\nHostKey {host_key}\nPidFile {tmp_path / 'pid'}\n"
        "PasswordAuthentication yes\nPubkeyAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin yes\nUsePAM no\nStrictModes no\nUseDNS no\nAuthorizedKeysFile none\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    script = f'mount --bind {shadow} /etc/shadow && exec "$@"'
    unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    sshd = subprocess.Popen(
        [*unshare, "/usr/sbin/sshd", "-D", "-e", "-f", str(conf)], stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        pub = host_key.with_suffix(".pub").read_text().split()[:2]
        known = tmp_path / "known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {' '.join(pub)}\n")
        config = tmp_path / "ssh_config"
        config.write_text(
            f"Host pwhost\n    HostName 127.0.0.1\n    Port {port}\n    User root\n"
            f"    UserKnownHostsFile {known}\n    IdentitiesOnly yes\n"
        )
        yield config, password
    finally:
        sshd.terminate()
        sshd.wait(5)


def test_password_from_env_var(
    password_sshd: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, password = password_sshd
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("CORRAL_TEST_PASSWORD", password)
    h = Host(name="pwhost")

    async def body(t: SshTransport) -> tuple[int, bytes]:
        assert password not in repr(t)
        code, out, _ = await run_to_end(t, h, ["echo", "in"])
        return code, out

    opts = SshOptions(config=str(config), password_env="CORRAL_TEST_PASSWORD")
    assert with_transport(opts, body) == (0, b"in\n")

    monkeypatch.setenv("CORRAL_TEST_PASSWORD", "wrong-" + password)
    error = connect_error(opts, h)
    assert error.cause == "auth failed"
    assert password not in str(error)


def test_ssh_agent_is_used(
    testbed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.05)
        env = dict(os.environ, SSH_AUTH_SOCK=str(sock))
        subprocess.run(["ssh-add", "-q", str(testbed.key_path)], env=env, check=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        config = tmp_path / "ssh_config"  # no IdentityFile: only the agent has the key
        config.write_text(
            f"Host tb1\n    HostName {testbed.host('tb1').address}\n    User root\n"
            f"    UserKnownHostsFile {testbed.known_hosts}\n"
        )
        h = Host(name="tb1")

        async def body(t: SshTransport) -> tuple[int, bytes]:
            code, out, _ = await run_to_end(t, h, ["hostname"])
            return code, out

        assert with_transport(SshOptions(config=str(config)), body) == (0, b"tb1\n")
        monkeypatch.delenv("SSH_AUTH_SOCK")
        assert connect_error(SshOptions(config=str(config)), h).cause == "auth failed"
    finally:
        agent.terminate()
        agent.wait(5)
