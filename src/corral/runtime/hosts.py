"""Resolve what a launch needs from each host before anything is started.

One short command per host (in parallel, through the job's transport) finds
the Python interpreter (``--python``, else the coordinator's own interpreter
path when it exists there, else ``python3``), checks that corral (and torch,
for the torchrun launcher) import with it, that ``--workdir`` exists, and, on
the master host, that the master port is free (or picks one for port 0).
Every problem is a LaunchError naming the host; nothing is launched.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from corral.cluster.model import Host
from corral.errors import CorralError, LaunchError, TransportError
from corral.transport.base import Transport

PROBE_TIMEOUT = 60.0

_PROBE = r"""
import json, os, socket, sys
info = {"executable": sys.executable, "hostname": socket.gethostname(), "version": sys.version}
try:
    import corral
    info["corral"] = getattr(corral, "__version__", "unknown")
except Exception as exc:
    info["corral"] = None
    info["corral_error"] = f"{type(exc).__name__}: {exc}"
import importlib.util
info["torch"] = importlib.util.find_spec("torch") is not None
workdir, port = sys.argv[1], int(sys.argv[2])
info["workdir_ok"] = not workdir or os.path.isdir(os.path.expanduser(workdir))
if port >= 0:
    s = socket.socket()
    # as TCPStore does: a port in TIME_WAIT after the last job is free to reuse
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
        info["port"] = s.getsockname()[1]
    except OSError as exc:
        info["port"] = None
        info["port_error"] = str(exc)
    finally:
        s.close()
print("CORRAL-PROBE " + json.dumps(info))
"""

_SHELL = (
    'code=$1; wd=$2; port=$3; shift 3; for p in "$@"; do '
    'if command -v "$p" >/dev/null 2>&1; then exec "$p" -c "$code" "$wd" "$port"; fi; done; '
    'echo "no python interpreter found (tried: $*)" >&2; exit 127'
)


@dataclass(frozen=True)
class HostProbe:
    """What one host told us."""

    host: str
    python: str
    hostname: str
    has_corral: bool
    has_torch: bool
    workdir_ok: bool
    port: int | None
    port_error: str | None = None
    corral_error: str | None = None


def candidates(python: str | None) -> list[str]:
    """Interpreters to try on a host, in order."""
    if python:
        return [python]
    return [sys.executable, "python3"] if sys.executable else ["python3"]


async def probe_host(
    transport: Transport,
    host: Host,
    *,
    python: str | None,
    workdir: str | None,
    port: int | None,
) -> HostProbe:
    """Run the probe on ``host``; TransportError or LaunchError on failure."""
    argv = [
        "sh",
        "-c",
        _SHELL,
        "sh",
        _PROBE,
        workdir or "",
        str(-1 if port is None else port),
        *candidates(python),
    ]
    proc = await transport.start(host, argv)
    proc.close_stdin()
    try:
        out, err, code = await asyncio.wait_for(
            asyncio.gather(proc.stdout.read(), proc.stderr.read(), proc.wait()), PROBE_TIMEOUT
        )
    except asyncio.TimeoutError as exc:
        raise LaunchError(
            f"did not answer the launch probe within {PROBE_TIMEOUT:g} s", host=host.name
        ) from exc
    line = next(
        (ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("CORRAL-PROBE ")),
        None,
    )
    if code != 0 or line is None:
        why = err.decode(errors="replace").strip().splitlines()
        raise LaunchError(
            f"launch probe failed (exit {code}): {why[-1] if why else 'no output'}",
            host=host.name,
        )
    info = json.loads(line[len("CORRAL-PROBE ") :])
    return HostProbe(
        host=host.name,
        python=info["executable"],
        hostname=info["hostname"],
        has_corral=info["corral"] is not None,
        has_torch=bool(info["torch"]),
        workdir_ok=bool(info["workdir_ok"]),
        port=info.get("port"),
        port_error=info.get("port_error"),
        corral_error=info.get("corral_error"),
    )


def problems(
    probe: HostProbe, *, need_torch: bool, workdir: str | None, port: int | None
) -> list[str]:
    """Human-readable problems found by a probe (empty when the host is ready)."""
    found = []
    if not probe.has_corral:
        found.append(
            f"corral cannot be imported by {probe.python} ({probe.corral_error}); install it "
            f"there (`{probe.python} -m pip install corral`) or pass --python"
        )
    if need_torch and not probe.has_torch:
        found.append(
            f"torch is not installed for {probe.python}, so torchrun is missing; install it "
            "there or use --launcher python"
        )
    if workdir and not probe.workdir_ok:
        found.append(f"--workdir {workdir} does not exist")
    if port is not None and probe.port is None:
        found.append(
            f"master port {port} cannot be bound ({probe.port_error}); pass another "
            "--master-port, or 0 to pick a free one"
        )
    return found


async def probe_hosts(
    transport: Transport,
    hosts: Sequence[Host],
    *,
    python: str | None,
    workdir: str | None,
    master: Host,
    master_port: int,
    need_torch: bool,
) -> dict[str, HostProbe]:
    """Probe every host in parallel; LaunchError listing every host that is not ready."""

    async def one(host: Host) -> HostProbe:
        port = master_port if host.name == master.name else None
        return await probe_host(transport, host, python=python, workdir=workdir, port=port)

    results = await asyncio.gather(*(one(h) for h in hosts), return_exceptions=True)
    errors: list[str] = []
    probes: dict[str, HostProbe] = {}
    for host, result in zip(hosts, results, strict=True):
        if isinstance(result, (TransportError, LaunchError)):
            errors.append(str(result))
        elif isinstance(result, CorralError):
            errors.append(f"{host.name}: {result}")
        elif isinstance(result, BaseException):
            raise result
        else:
            probes[host.name] = result
            port = master_port if host.name == master.name else None
            errors += [
                f"{host.name}: {p}"
                for p in problems(result, need_torch=need_torch, workdir=workdir, port=port)
            ]
    if errors:
        if len(errors) == 1:
            raise LaunchError(errors[0])
        raise LaunchError(f"{len(errors)} problems before launch:\n  " + "\n  ".join(errors))
    return probes
