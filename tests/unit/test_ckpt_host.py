"""corral.recovery.checkpoints.hostside: listing, sending and receiving checkpoints on a host."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from corral.recovery.checkpoints import HOSTSIDE, SHIPPED, hostside
from corral.remote.python import bootstrap_argv, program, stdin_payload


def checkpoint_bytes(payload: int, seed: int = 0) -> bytes:
    """A file shaped like ``torch.save``'s (a stored zip with ``data.pkl``), no torch needed."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", b"pickle" * 10)
        archive.writestr("archive/data/0", bytes((seed + i) % 251 for i in range(payload)))
    return buf.getvalue()


def host_call(
    call: str, *args: Any, stdin: bytes = b"", cwd: Path | None = None
) -> tuple[int, bytes]:
    """Run ``hostside.<call>`` as the coordinator ships it: the program on stdin, then
    ``stdin``."""
    text = program(SHIPPED, f"{HOSTSIDE}:{call}", *args)
    proc = subprocess.run(
        bootstrap_argv(sys.executable, call),
        input=stdin_payload(text) + stdin,
        capture_output=True,
        timeout=60,
        cwd=cwd,
    )
    return proc.returncode, proc.stdout


def lines(out: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith(b"{")]


def test_shipped_modules_need_only_the_standard_library() -> None:
    code = (
        "import sys\n"
        + program(SHIPPED, f"{HOSTSIDE}:list_checkpoints", ".", None).replace("_s.exit(", "_r = (")
        + "\nbad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')]\n"
        + "sys.exit(1 if bad else 0)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, timeout=60, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr


def test_list_reports_complete_and_damaged_files_and_ignores_temps(tmp_path: Path) -> None:
    ck = tmp_path / "work" / "ck"
    ck.mkdir(parents=True)
    good = checkpoint_bytes(5000)
    (ck / "ckpt-00000020.pt").write_bytes(good)
    (ck / "ckpt-00000040.pt").write_bytes(good)
    (ck / "ckpt-00000060.pt").write_bytes(good[: len(good) // 2])  # truncated
    (ck / ".ckpt-00000080.pt.tmp-123").write_bytes(good)  # being written: never a candidate
    (ck / "ckpt-00000040-rank00001.pt").write_bytes(good)  # another family
    code, out = host_call("list_checkpoints", "ck", str(tmp_path / "work"))
    assert code == 0
    [listing] = lines(out)
    assert listing["directory"] == str(ck)
    assert listing["exists"] is True
    assert listing["free"] > 0
    files = {f["name"]: f for f in listing["files"]}
    assert list(files) == ["ckpt-00000020.pt", "ckpt-00000040.pt", "ckpt-00000060.pt"]
    assert [f["step"] for f in listing["files"]] == [20, 40, 60]
    assert files["ckpt-00000040.pt"]["complete"] is True
    assert files["ckpt-00000040.pt"]["size"] == len(good)
    assert files["ckpt-00000060.pt"]["complete"] is False


def test_list_of_a_missing_directory_is_empty(tmp_path: Path) -> None:
    code, out = host_call("list_checkpoints", str(tmp_path / "nope" / "ck"), None)
    assert code == 0
    [listing] = lines(out)
    assert listing["exists"] is False and listing["files"] == []
    assert listing["free"] > 0  # of the nearest existing parent


def test_send_streams_under_credits_then_the_checksum(tmp_path: Path) -> None:
    data = checkpoint_bytes(3 << 20, seed=3)
    path = tmp_path / "ckpt-00000007.pt"
    path.write_bytes(data)
    credits = b"".join(f"{n}\n".encode() for n in (1 << 20, 1 << 20, 4 << 20))
    code, out = host_call("send", str(path), stdin=credits)
    assert code == 0
    header, rest = out.split(b"\n", 1)
    assert json.loads(header) == {"size": len(data), "path": str(path)}
    assert rest[: len(data)] == data
    assert json.loads(rest[len(data) :]) == {"sha256": hashlib.sha256(data).hexdigest()}


def test_send_stops_when_the_credits_stop(tmp_path: Path) -> None:
    path = tmp_path / "ckpt-00000007.pt"
    path.write_bytes(checkpoint_bytes(3 << 20))
    code, out = host_call("send", str(path), stdin=b"1000\n")  # then EOF: the reader gave up
    assert code == 1
    assert len(out.split(b"\n", 1)[1]) == 1000


def test_send_of_a_missing_file_is_a_json_error(tmp_path: Path) -> None:
    code, out = host_call("send", str(tmp_path / "ckpt-00000001.pt"))
    assert code == 1
    [error] = lines(out)
    assert "cannot read" in error["error"] and error["errno"] == "ENOENT"


def test_serve_answers_request_after_request_and_survives_a_missing_file(
    tmp_path: Path,
) -> None:
    first, second = checkpoint_bytes(2 << 20, seed=1), checkpoint_bytes(1000, seed=2)
    (tmp_path / "ckpt-00000001.pt").write_bytes(first)
    (tmp_path / "ckpt-00000002.pt").write_bytes(second)

    def ask(name: str) -> bytes:
        return json.dumps({"send": str(tmp_path / name)}).encode() + b"\n"

    stdin = (
        ask("ckpt-00000001.pt")
        + f"{1 << 20}\n{len(first) - (1 << 20)}\n".encode()  # the credits, exactly the size
        + ask("ckpt-00000009.pt")  # missing: an error header, and the server goes on
        + b"not json\n"
        + ask("ckpt-00000002.pt")
        + f"{len(second)}\n".encode()
    )
    code, out = host_call("serve", stdin=stdin)
    assert code == 0  # stdin closed between requests
    header, rest = out.split(b"\n", 1)
    assert json.loads(header)["size"] == len(first)
    assert rest[: len(first)] == first
    rest = rest[len(first) :]
    trailer, missing, bad, header2, rest = rest.split(b"\n", 4)
    assert json.loads(trailer) == {"sha256": hashlib.sha256(first).hexdigest()}
    assert json.loads(missing)["errno"] == "ENOENT"
    assert "bad request" in json.loads(bad)["error"]
    assert json.loads(header2)["size"] == len(second)
    assert rest[: len(second)] == second
    assert json.loads(rest[len(second) :]) == {"sha256": hashlib.sha256(second).hexdigest()}


def test_serve_exits_1_when_the_reader_gives_up_mid_file(tmp_path: Path) -> None:
    path = tmp_path / "ckpt-00000003.pt"
    path.write_bytes(checkpoint_bytes(3 << 20))
    request = json.dumps({"send": str(path)}).encode() + b"\n1000\n"
    code, out = host_call("serve", stdin=request)
    assert code == 1
    assert len(out.split(b"\n", 1)[1]) == 1000


def test_receive_writes_atomically_and_acknowledges(tmp_path: Path) -> None:
    data = checkpoint_bytes(3 << 20, seed=5)
    digest = hashlib.sha256(data).hexdigest()
    trailer = json.dumps({"sha256": digest}).encode() + b"\n"
    code, out = host_call(
        "receive", "ck", str(tmp_path), "ckpt-00000040.pt", len(data), None, stdin=data + trailer
    )
    assert code == 0
    msgs = lines(out)
    acks = [m["ack"] for m in msgs if "ack" in m]
    assert acks == sorted(acks) and acks[0] >= hostside.ACK_EVERY
    final = msgs[-1]
    assert final == {
        "ok": True,
        "path": str(tmp_path / "ck" / "ckpt-00000040.pt"),
        "size": len(data),
        "sha256": digest,
    }
    assert (tmp_path / "ck" / "ckpt-00000040.pt").read_bytes() == data
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["ckpt-00000040.pt"]


def test_receive_with_a_checksum_mismatch_leaves_no_file(tmp_path: Path) -> None:
    data = checkpoint_bytes(20000)
    wrong = hashlib.sha256(b"something else").hexdigest()
    code, out = host_call(
        "receive", str(tmp_path), None, "ckpt-00000040.pt", len(data), wrong, stdin=data
    )
    assert code == 1
    error = lines(out)[-1]
    assert error["ok"] is False and "checksum mismatch" in error["error"]
    assert list(tmp_path.iterdir()) == []


def test_receive_of_a_short_stream_leaves_no_file(tmp_path: Path) -> None:
    data = checkpoint_bytes(20000)
    code, out = host_call(
        "receive", str(tmp_path), None, "ckpt-00000040.pt", len(data), None, stdin=data[:5000]
    )
    assert code == 1
    assert "ended after 5000 of" in lines(out)[-1]["error"]
    assert list(tmp_path.iterdir()) == []


def test_receive_refuses_an_incomplete_checkpoint(tmp_path: Path) -> None:
    data = checkpoint_bytes(20000)[:-100]  # a truncated source, checksum and all consistent
    code, out = host_call(
        "receive",
        str(tmp_path),
        None,
        "ckpt-00000040.pt",
        len(data),
        hashlib.sha256(data).hexdigest(),
        stdin=data,
    )
    assert code == 1
    assert "not a complete checkpoint" in lines(out)[-1]["error"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["../ckpt-00000001.pt", "ckpt-1-rank00001.pt", "x.pt", ""])
def test_receive_refuses_other_names(tmp_path: Path, name: str) -> None:
    code, out = host_call("receive", str(tmp_path), None, name, 10, None, stdin=b"0" * 10)
    assert code == 1
    assert "not a checkpoint name" in lines(out)[-1]["error"]
    assert list(tmp_path.iterdir()) == []


class _Stdio:
    """Stand-in for sys.stdin / sys.stdout (only ``.buffer`` is used)."""

    def __init__(self, data: bytes = b"") -> None:
        self.buffer = io.BytesIO(data)


def _receive_in_process(
    monkeypatch: pytest.MonkeyPatch, directory: Path, data: bytes
) -> tuple[int, list[dict[str, Any]]]:
    stdin, stdout = _Stdio(data), _Stdio()
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.setattr(sys, "stdout", stdout)
    digest = hashlib.sha256(data).hexdigest()
    code = hostside.receive(str(directory), None, "ckpt-00000040.pt", len(data), digest)
    monkeypatch.undo()
    return code, lines(stdout.buffer.getvalue())


def test_receive_on_a_full_disk_names_the_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = checkpoint_bytes(3 << 20)
    real_write = os.write
    room = [1 << 20]

    def write(fd: int, chunk: Any) -> int:
        if room[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real_write(fd, bytes(chunk)[: room[0]])
        room[0] -= n
        return n

    monkeypatch.setattr(hostside.os, "write", write)
    code, msgs = _receive_in_process(monkeypatch, tmp_path, data)
    assert code == 1
    error = msgs[-1]
    assert error["ok"] is False and error["errno"] == "ENOSPC"
    assert error["error"].startswith(f"cannot write {tmp_path / 'ckpt-00000040.pt'}: ")
    assert "no space left on device" in error["error"]
    assert list(tmp_path.iterdir()) == []  # the temp file is gone


def test_receive_checks_the_free_space_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "ckpt-00000020.pt").write_bytes(checkpoint_bytes(100))
    monkeypatch.setattr(hostside, "free_bytes", lambda path: 1000)
    code, msgs = _receive_in_process(monkeypatch, tmp_path, checkpoint_bytes(20000))
    assert code == 1
    assert msgs[-1]["errno"] == "ENOSPC"
    assert "1000 bytes free" in msgs[-1]["error"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-00000020.pt"]  # untouched


def test_receive_restores_signal_handlers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import signal

    before = signal.getsignal(signal.SIGTERM)
    code, _ = _receive_in_process(monkeypatch, tmp_path, checkpoint_bytes(100))
    assert code == 0
    assert signal.getsignal(signal.SIGTERM) == before
