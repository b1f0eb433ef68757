"""Helper programs over real SSH: a program of more than 200 KB (over Linux's 128 KiB
limit on one argument) travels over stdin and runs on a testbed host."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from corral.cluster import load_cluster
from corral.remote.python import program, shell_command, start_program, stdin_payload
from corral.testbed import Testbed
from corral.transport.options import SshOptions
from corral.transport.ssh.transport import SshTransport

pytestmark = pytest.mark.netns

BIG = 200_000


@pytest.fixture
def big_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A shippable module of more than 200 KB whose ``main`` names the host and echoes
    what follows the program on stdin."""
    filler = "".join(f"# padding line {i:06d} {'x' * 60}\n" for i in range(BIG // 70 + 1))
    (tmp_path / "corral_bigmod_ssh.py").write_text(
        filler
        + "import socket, sys\n"
        + "def main(tag):\n"
        + "    rest = sys.stdin.buffer.read()\n"
        + "    print(tag, socket.gethostname(), rest.decode(), flush=True)\n"
        + "    return 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("corral_bigmod_ssh", None)
    return "corral_bigmod_ssh"


def test_a_large_program_runs_on_a_host_over_ssh(testbed: Testbed, big_module: str) -> None:
    host = next(h for h in load_cluster(str(testbed.hostfile)).hosts if h.name == "tb2")
    call = f"{big_module}:main"
    assert len(program([big_module], call, "t")) > BIG

    async def main() -> tuple[int, bytes, bytes]:
        transport = SshTransport(SshOptions(config=str(testbed.ssh_config)))
        try:
            proc = await start_program(transport, host, sys.executable, [big_module], call, "big")
            proc.write(b"then-data")
            proc.close_stdin()
            out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
            return await asyncio.wait_for(proc.wait(), 60), out, err
        finally:
            await transport.close()

    code, out, err = asyncio.run(main())
    assert code == 0, err
    assert out.decode().split() == ["big", "tb2", "then-data"]


def test_a_large_program_runs_through_the_openssh_client(testbed: Testbed, big_module: str) -> None:
    """As ``corral sync --delete`` runs its helper: one ssh command line, stdin piped."""
    text = program([big_module], f"{big_module}:main", "client")
    out = subprocess.run(
        testbed.ssh_argv("tb3", shell_command(sys.executable)),
        input=stdin_payload(text) + b"rest",
        capture_output=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().split() == ["client", "tb3", "rest"]
