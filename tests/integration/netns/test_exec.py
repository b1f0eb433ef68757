"""``corral exec`` across the netns testbed's real sshd hosts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from corral.testbed import Testbed

from .conftest import spare_address

pytestmark = pytest.mark.netns

HOSTS = ("tb1", "tb2", "tb3")

# Runs the real CLI entry point; registers the ``exec`` verb should the verb list
# being assembled in corral.cli not name it yet.
_MAIN = (
    "import sys, corral.cli as c\n"
    "if 'exec' not in c._VERB_MODULES:\n"
    "    c._VERB_MODULES = (*c._VERB_MODULES, 'exec')\n"
    "from corral.cli.main import main\n"
    "sys.argv[0] = 'corral'\n"
    "main()\n"
)


def corral_exec(
    tb: Testbed, *args: str, timeout: float = 60, cluster: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    hosts = ["--hosts", ",".join(cluster) + ","] if cluster else ["--hosts", str(tb.hostfile)]
    argv = [sys.executable, "-c", _MAIN, "exec", *hosts, "--ssh-config", str(tb.ssh_config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["NO_COLOR"] = "1"
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def lines_of(text: str, host: str) -> list[str]:
    prefix = f"[{host}] "
    return [line[len(prefix) :] for line in text.splitlines() if line.startswith(prefix)]


def test_hostname_on_every_host_prefixed(testbed: Testbed) -> None:
    result = corral_exec(testbed, "--", "hostname")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [f"[{h}] {h}" for h in HOSTS]
    assert "3/3 hosts succeeded" in result.stderr


def test_remote_shell_expands_variables(testbed: Testbed) -> None:
    result = corral_exec(testbed, "--", "echo $HOSTNAME; echo", "'$HOME'")
    assert result.returncode == 0, result.stderr
    for h in HOSTS:
        assert lines_of(result.stdout, h) == [h, "$HOME"]


def test_stderr_is_prefixed_on_stderr(testbed: Testbed) -> None:
    result = corral_exec(testbed, "--", "echo to-err >&2")
    assert result.returncode == 0
    assert result.stdout == ""
    for h in HOSTS:
        assert lines_of(result.stderr, h) == ["to-err"]


def test_long_output_lines_are_never_split(testbed: Testbed) -> None:
    n = 2000
    script = f"python3 -c 'import socket; [print(socket.gethostname() * 40) for _ in range({n})]'"
    result = corral_exec(testbed, "--", script)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 * n
    for line in lines:
        host = line[1:4]
        assert line == f"[{host}] " + host * 40


def test_one_failing_host_fails_the_run(testbed: Testbed) -> None:
    result = corral_exec(testbed, "--", '[ "$(hostname)" = tb2 ] && exit 3; echo fine')
    assert result.returncode == 1
    assert "2/3 hosts succeeded" in result.stderr
    row = next(line for line in result.stderr.splitlines() if line.startswith("tb2"))
    assert "exit 3" in row
    assert lines_of(result.stdout, "tb1") == ["fine"]
    assert lines_of(result.stdout, "tb2") == []


def test_json_results(testbed: Testbed) -> None:
    result = corral_exec(testbed, "--json", "--", '[ "$(hostname)" = tb3 ] && exit 5; hostname')
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["succeeded"] == 2 and doc["total"] == 3
    by_host = {h["host"]: h for h in doc["hosts"]}
    assert by_host["tb1"]["stdout"] == "tb1\n"
    assert by_host["tb3"]["exit_code"] == 5
    assert all(h["duration"] >= 0 for h in doc["hosts"])


def test_timeout_kills_the_remote_command(testbed: Testbed) -> None:
    marker = f"{2000 + uuid.uuid4().int % 9000}.5"
    started = time.monotonic()
    result = corral_exec(
        testbed, "--timeout", "5", "--", f'[ "$(hostname)" = tb1 ] && sleep {marker}; echo done'
    )
    # The bound is the behaviour (the 2000+ s sleep was not waited for); generous.
    assert time.monotonic() - started < 5 + 60
    assert result.returncode == 1
    assert "2/3 hosts succeeded" in result.stderr
    row = next(line for line in result.stderr.splitlines() if line.startswith("tb1"))
    assert "timeout" in row
    assert f"sleep {marker}" not in testbed.run_on("tb1", ["ps", "-eo", "args"]).stdout


def test_unreachable_host_means_nothing_runs(healthy_testbed: Testbed, tmp_path: Path) -> None:
    tb = healthy_testbed
    marker = tmp_path / "ran"  # tmp_path is shared with every testbed host (netns conftest)
    tb.kill_sshd("tb2")
    result = corral_exec(tb, "--", f"touch {marker}-$(hostname)")
    assert result.returncode == 2
    assert "tb2: " in result.stderr
    assert "connection refused" in result.stderr
    assert "1 host unreachable: tb2 (connection refused); nothing was run" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_host_in_list_is_named(testbed: Testbed, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        testbed.ssh_config.read_text() + f"\nHost ghost\n    HostName {spare_address(testbed)}\n"
        "    ConnectTimeout 2\n"
    )
    argv = [sys.executable, "-c", _MAIN, "exec", "--hosts", "tb1,ghost", "--ssh-config"]
    result = subprocess.run(
        [*argv, str(config), "--", "true"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "ghost: " in result.stderr
    assert "unreachable" in result.stderr


# Ctrl-C as at a terminal: a process started with SIGINT ignored (a background job of
# a non-interactive shell, e.g. `make test &` from a script) passes that on, and Python
# then installs no KeyboardInterrupt handler; the test's corral gets the terminal's.
_INTERRUPTIBLE = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"


def test_ctrl_c_kills_the_remote_commands(testbed: Testbed) -> None:
    marker = f"{3000 + uuid.uuid4().int % 9000}.5"
    argv = [sys.executable, "-c", _INTERRUPTIBLE + _MAIN, "exec", "--hosts", str(testbed.hostfile)]
    argv += ["--ssh-config", str(testbed.ssh_config), "--", f"echo started; sleep {marker}"]
    env = dict(os.environ, NO_COLOR="1")
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        started = [proc.stdout.readline() for _ in HOSTS]
        assert sorted(started) == [f"[{h}] started\n" for h in HOSTS]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=45)  # a guard: each host's kill is bounded by 6 s, the close by 5
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 130
    for h in HOSTS:
        assert f"sleep {marker}" not in testbed.run_on(h, ["ps", "-eo", "args"]).stdout
