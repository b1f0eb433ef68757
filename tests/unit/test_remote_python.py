"""corral.remote.python: helper programs travel over stdin, whatever their size."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from corral.cluster.model import Host
from corral.remote.python import (
    bootstrap_argv,
    program,
    shell_command,
    start_program,
    stdin_payload,
)
from corral.transport.local import LocalTransport

#: More than Linux's 128 KiB limit on one argument or environment string.
BIG = 200_000


@pytest.fixture
def big_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A shippable module of more than 200 KB whose ``main`` echoes stdin's rest."""
    filler = "".join(f"# padding line {i:06d} {'x' * 60}\n" for i in range(BIG // 70 + 1))
    (tmp_path / "corral_bigmod.py").write_text(
        filler
        + "import sys\n"
        + "def main(tag):\n"
        + "    rest = sys.stdin.buffer.read()\n"
        + "    sys.stdout.write(tag + ':' + rest.decode() + '\\n')\n"
        + "    return 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("corral_bigmod", None)
    return "corral_bigmod"


def test_the_program_is_not_in_the_command_line(big_module: str) -> None:
    text = program([big_module], f"{big_module}:main", "t")
    assert len(text) > BIG
    argv = bootstrap_argv(sys.executable, f"{big_module}:main")
    assert sum(len(a) for a in argv) < 2000 and f"{big_module}:main" in argv
    assert len(shell_command(sys.executable)) < 2000


def test_a_large_program_runs_and_the_rest_of_stdin_is_its_input(big_module: str) -> None:
    text = program([big_module], f"{big_module}:main", "tag")
    out = subprocess.run(
        bootstrap_argv(sys.executable),
        input=stdin_payload(text) + b"after the program",
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == b"tag:after the program\n"


def test_start_program_over_a_transport(big_module: str) -> None:
    async def main() -> tuple[int, bytes]:
        transport = LocalTransport()
        try:
            proc = await start_program(
                transport, Host("n1", local=True), sys.executable, [big_module],
                f"{big_module}:main", "via-transport",
            )  # fmt: skip
            proc.write(b"more input")
            proc.close_stdin()
            out = await proc.stdout.read()
            return await proc.wait(), out
        finally:
            await transport.close()

    code, out = asyncio.run(main())
    assert (code, out) == (0, b"via-transport:more input\n")


def test_a_short_stdin_is_one_clear_message(tmp_path: Path) -> None:
    cut = subprocess.run(
        bootstrap_argv(sys.executable), input=b"100\nprint(1)\n", capture_output=True, timeout=60
    )
    assert cut.returncode == 1
    assert cut.stderr.decode().strip() == "corral: the helper program on stdin was cut short"
    empty = subprocess.run(bootstrap_argv(sys.executable), input=b"", capture_output=True)
    assert empty.stderr.decode().strip() == "corral: no helper program arrived on stdin"


def test_no_interpreter_is_named(tmp_path: Path) -> None:
    out = subprocess.run(
        bootstrap_argv("/nonexistent/python3"), input=b"", capture_output=True, timeout=60
    )
    assert out.returncode == 127
    assert out.stderr.decode().strip() == (
        "no python interpreter found (tried: /nonexistent/python3)"
    )
