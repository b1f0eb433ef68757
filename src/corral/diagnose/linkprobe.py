"""Host side of the link matrix (standard library only: shipped over stdin by
:mod:`corral.remote.python`, no corral needed on the host).

``main(params)`` serves a TCP port on the host's training address
(``params["bind"]``, every address when empty) and prints ``{"event": "ready",
"port": P}``; then it reads one JSON command per line from stdin and answers
each with one JSON line on stdout:

* ``{"cmd": "pair", "addr", "port", "seconds", "bytes", "pings"}``: ping-pong
  ``pings`` 8-byte messages with the peer's server (round trip), stream to it
  (this host -> peer, timed by the peer as it receives), then have it stream
  back (peer -> this host, timed here): ``{"event": "pair", "rtt_ms",
  "out_gbs", "in_gbs"}``;
* ``{"cmd": "ring", ...}``: stream to the peer only: ``{"event": "ring", "gbs"}``;
* ``{"cmd": "exit"}`` or EOF: stop.

A stream lasts ``seconds`` or ``bytes``, whichever comes first; the receiver
times it from its first byte to EOF. Errors answer ``{"event": "error",
"message"}``. The process exits on its own after ``params["max_seconds"]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import struct
import sys
import threading
import time
from typing import Any

CHUNK = 1 << 20
HEADER_MAX = 4096


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def _header(conn: socket.socket, rf: Any) -> dict[str, Any]:
    line = rf.readline(HEADER_MAX)
    if not line.endswith(b"\n"):
        raise ValueError("no header")
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("bad header")
    return data


def _receive(rf: Any, timeout: float, conn: socket.socket) -> tuple[int, float]:
    """Read until EOF: the bytes after the first read and the seconds from the end of
    the first read to the last (the first read only starts the clock)."""
    conn.settimeout(timeout)
    buf = bytearray(CHUNK)
    total = 0
    first = last = 0.0
    started = False
    while True:
        n = rf.readinto1(buf)
        if not n:
            break
        last = time.perf_counter()
        if not started:
            first, started = last, True
        else:
            total += n
    return total, max(last - first, 1e-9)


def _send(conn: socket.socket, seconds: float, limit: int) -> int:
    data = b"\0" * CHUNK
    sent = 0
    end = time.perf_counter() + seconds
    while sent < limit and time.perf_counter() < end:
        conn.sendall(data[: min(CHUNK, limit - sent)])
        sent += min(CHUNK, limit - sent)
    conn.shutdown(socket.SHUT_WR)
    return sent


def _serve_one(conn: socket.socket) -> None:
    with conn, conn.makefile("rb") as rf:
        conn.settimeout(30.0)
        head = _header(conn, rf)
        op = head.get("op")
        if op == "ping":
            for _ in range(int(head.get("count", 1))):
                msg = rf.read(8)
                if len(msg) != 8:
                    return
                conn.sendall(msg)
        elif op == "sink":
            total, seconds = _receive(rf, float(head.get("timeout", 30.0)), conn)
            reply = {"bytes": total, "seconds": seconds}
            conn.sendall((json.dumps(reply) + "\n").encode())
        elif op == "source":
            _send(conn, float(head["seconds"]), int(head["bytes"]))
            with contextlib.suppress(OSError):
                rf.read(1)  # until the peer closes: every byte is read before we go


def _server(srv: socket.socket) -> None:
    while True:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def run(c: socket.socket = conn) -> None:
            with contextlib.suppress(Exception):
                _serve_one(c)

        threading.Thread(target=run, daemon=True).start()


def _connect(cmd: dict[str, Any], bind: str) -> socket.socket:
    source = (bind, 0) if bind else None
    conn = socket.create_connection(
        (cmd["addr"], int(cmd["port"])), timeout=10.0, source_address=source
    )
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _timeout(cmd: dict[str, Any]) -> float:
    return float(cmd["seconds"]) * 4 + 10.0


def _ping(cmd: dict[str, Any], bind: str) -> float | None:
    count = int(cmd.get("pings", 0))
    if count < 1:
        return None
    with _connect(cmd, bind) as conn:
        conn.sendall(json.dumps({"op": "ping", "count": count}).encode() + b"\n")
        rtts = []
        for i in range(count):
            start = time.perf_counter()
            conn.sendall(struct.pack("!Q", i))
            got = b""
            while len(got) < 8:
                part = conn.recv(8 - len(got))
                if not part:
                    raise ConnectionError("the peer closed during the ping")
                got += part
            rtts.append(time.perf_counter() - start)
    return statistics.median(rtts) * 1e3


def _stream_out(cmd: dict[str, Any], bind: str) -> float:
    """This host -> the peer, timed by the peer."""
    with _connect(cmd, bind) as conn:
        head = {"op": "sink", "timeout": _timeout(cmd)}
        conn.sendall(json.dumps(head).encode() + b"\n")
        _send(conn, float(cmd["seconds"]), int(cmd["bytes"]))
        conn.settimeout(_timeout(cmd))
        with conn.makefile("rb") as rf:
            reply = json.loads(rf.readline(HEADER_MAX) or b"{}")
    if not reply.get("bytes"):
        raise ConnectionError("the peer received nothing")
    return float(reply["bytes"]) / float(reply["seconds"]) / 1e9


def _stream_in(cmd: dict[str, Any], bind: str) -> float:
    """The peer -> this host, timed here."""
    with _connect(cmd, bind) as conn:
        head = {"op": "source", "seconds": cmd["seconds"], "bytes": cmd["bytes"]}
        conn.sendall(json.dumps(head).encode() + b"\n")
        with conn.makefile("rb") as rf:
            total, seconds = _receive(rf, _timeout(cmd), conn)
    if not total:
        raise ConnectionError("received nothing from the peer")
    return total / seconds / 1e9


def _run(cmd: dict[str, Any], bind: str) -> dict[str, Any]:
    kind = cmd.get("cmd")
    if kind == "pair":
        rtt = _ping(cmd, bind)
        out = _stream_out(cmd, bind)
        inward = _stream_in(cmd, bind)
        return {"event": "pair", "rtt_ms": rtt, "out_gbs": out, "in_gbs": inward}
    if kind == "ring":
        return {"event": "ring", "gbs": _stream_out(cmd, bind)}
    raise ValueError(f"unknown command {kind!r}")


def main(params: dict[str, Any]) -> int:
    """Serve, then run the coordinator's commands (see the module docstring)."""
    bind = str(params.get("bind") or "")
    limit = float(params.get("max_seconds", 120.0))

    def expire() -> None:
        time.sleep(limit)
        os._exit(3)  # the coordinator is gone or stuck: never stay behind

    threading.Thread(target=expire, daemon=True).start()
    try:
        srv = socket.create_server((bind, 0), backlog=16)
    except OSError as exc:
        _emit({"event": "error", "message": f"cannot listen on {bind or '*'}: {exc}"})
        return 1
    threading.Thread(target=_server, args=(srv,), daemon=True).start()
    _emit({"event": "ready", "port": srv.getsockname()[1], "pid": os.getpid()})
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
        except ValueError:
            continue
        if not isinstance(cmd, dict) or cmd.get("cmd") == "exit":
            break
        try:
            answer = _run(cmd, bind)
        except (OSError, ValueError, KeyError) as exc:
            answer = {"event": "error", "message": f"{type(exc).__name__}: {exc}"}
        answer["id"] = cmd.get("id")
        _emit(answer)
    srv.close()
    return 0
