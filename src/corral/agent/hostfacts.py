"""What the pre-flight checklist learns on each host (standard library only).

A node agent being started for the launch gathers these facts in its own session
(:mod:`corral.agent.hostcheck`); otherwise (``corral check``, or a host whose
agent could not) the checklist ships this module with ``corral.remote.python``
together with ``corral.agent.fingerprint``, so it needs no corral (and no torch)
on the host and never imports anything heavy. :func:`main` is one such session:

1. on the master host, bind and listen on the master port first (who holds it
   when that fails; an ephemeral port then stands in, so reachability is still
   measured);
2. print one JSON line of facts (interpreter, versions, GPUs, RDMA, memory,
   the code tree's manifest, the checkpoint directory, stale processes, the
   interface that routes to the master, the clock);
3. answer ``{"op": "connect", "addr", "port", "timeout"}`` lines with a real TCP
   connection attempt, until stdin closes.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import itertools
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import uuid
from typing import Any

_SIOCGIFADDR = 0x8915
#: The executables a launcher runs on a host. ``accelerate`` and ``mlx`` need none:
#: corral starts their ranks itself (their modules are checked, see :data:`MODULES`);
#: ``command`` runs whatever its template names (the coordinator asks for that word).
_LAUNCHER_BINARIES = {
    "torchrun": ("torchrun",),
    "python": (),
    "accelerate": (),
    "mlx": (),
    "command": (),
    "madengine": ("madengine",),
}
#: Modules whose presence for the interpreter is reported (found, never imported).
MODULES = ("accelerate", "mlx.core", "torchft")
_NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")


def _emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def run_output(argv: list[str], timeout: float = 10.0) -> str | None:
    """``argv``'s stdout when it exits 0; None when it cannot run, fails or times out."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


# ----------------------------------------------------------------------- software


def packages() -> dict[str, str]:
    """Installed distributions of this interpreter: lower-case name -> version.

    Read from the ``NAME-VERSION.dist-info`` / ``.egg-info`` directory names on
    ``sys.path`` (what pip writes), which is ten times faster than parsing every
    METADATA file; the first entry on the path wins, as for imports."""
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            stem, dot, kind = name.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info"):
                continue
            dist, _, version = stem.partition("-")
            if dist and version:
                key = dist.lower().replace("_", "-").replace(".", "-")
                found.setdefault(key, version.split("-")[0])
    return found


def torch_build() -> dict[str, Any]:
    """torch's version and the CUDA it was built for, read without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {"installed": False}
    info: dict[str, Any] = {"installed": True, "cuda": None, "version": None}
    path = os.path.join(next(iter(spec.submodule_search_locations)), "version.py")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return info
    for key in ("__version__", "cuda", "hip"):
        match = re.search(rf"^{key}\s*(?::[^=]*)?=\s*['\"]([^'\"]*)['\"]", text, re.M)
        if match:
            info["version" if key == "__version__" else key] = match.group(1)
    return info


def importable(name: str) -> bool:
    """Whether this interpreter finds module ``name`` (dotted: each package on the way)
    on ``sys.path``, without importing it (namespace packages count, as for imports)."""
    parts = name.split(".")
    path: list[str] | None = None
    for depth in range(len(parts)):
        try:
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]), path)
        except (ImportError, ValueError):
            return False
        if spec is None:
            return False
        if depth < len(parts) - 1:
            if not spec.submodule_search_locations:
                return False
            path = list(spec.submodule_search_locations)
    return True


def software(
    pkgs: dict[str, str], launcher: str, extra_binaries: list[str] | tuple[str, ...] = ()
) -> dict[str, Any]:
    """Versions that must agree across hosts, the launcher binaries found (and
    ``extra_binaries``: the first word of a command template) and the modules of
    :data:`MODULES` found."""
    torch = torch_build()
    nccl = next((pkgs[d] for d in _NCCL_DISTS if d in pkgs), None)
    bindir = os.path.dirname(sys.executable)
    search = os.pathsep.join([bindir, os.environ.get("PATH", "")])
    wanted = dict.fromkeys([*_LAUNCHER_BINARIES.get(launcher, ()), *extra_binaries])
    binaries = {b: shutil.which(b, path=search) for b in wanted}
    return {
        "python": ".".join(str(v) for v in sys.version_info[:3]),
        "python_executable": sys.executable,
        "torch": torch.get("version"),
        "cuda": torch.get("cuda"),
        "nccl": nccl,
        "mlx": pkgs.get("mlx"),
        "corral": pkgs.get("corral"),
        # PathFinder: sys.path only (the modules shipped with this script are no install)
        "corral_importable": importlib.machinery.PathFinder.find_spec("corral") is not None,
        "binaries": binaries,
        "modules": {m: importable(m) for m in MODULES},
        "platform": sys.platform,
    }


# ----------------------------------------------------------------------- hardware


def gpus() -> list[dict[str, Any]]:
    """GPUs from nvidia-smi, else from the driver's /proc entries (no memory then)."""
    out = None
    if shutil.which("nvidia-smi"):
        out = run_output(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
        )
    if out is not None:
        found = []
        for line in out.splitlines():
            name, _, mem = line.rpartition(",")
            if name.strip():
                try:
                    memory = int(float(mem.strip()))
                except ValueError:
                    memory = None
                found.append({"name": name.strip(), "memory_mib": memory})
        return found
    base = "/proc/driver/nvidia/gpus"
    found = []
    with contextlib.suppress(OSError):
        for entry in sorted(os.listdir(base)):
            model = "NVIDIA GPU"
            with contextlib.suppress(OSError), open(os.path.join(base, entry, "information")) as f:
                for line in f:
                    if line.startswith("Model:"):
                        model = line.split(":", 1)[1].strip()
            found.append({"name": model, "memory_mib": None})
    return found


def rdma_devices() -> list[str]:
    """InfiniBand / RoCE devices (``/sys/class/infiniband``)."""
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []


def memory() -> dict[str, int | None]:
    """Total and available memory in bytes (from /proc/meminfo)."""
    values: dict[str, int | None] = {"total": None, "available": None}
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                values["total" if key == "MemTotal" else "available"] = int(rest.split()[0]) * 1024
    return values


def hardware() -> dict[str, Any]:
    """GPUs, RDMA devices, CPUs and memory."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 0
    return {"gpus": gpus(), "rdma": rdma_devices(), "cpus": cpus, "memory": memory()}


# ----------------------------------------------------------------------- network


def _interfaces() -> dict[str, str]:
    """IPv4 address of every interface that has one."""
    import fcntl

    found: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(
                    sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                )
            except OSError:
                continue
            found[name] = socket.inet_ntoa(raw[20:24])
    return found


def route_to(addr: str) -> dict[str, Any]:
    """How this host reaches ``addr``: the resolved IP, the source address the
    kernel picks, and the interface that carries that address."""
    info: dict[str, Any] = {"addr": addr, "ip": None, "source": None, "interface": None}
    try:
        info["ip"] = socket.gethostbyname(addr)
    except OSError as exc:
        info["error"] = f"cannot resolve {addr}: {exc.strerror or exc}"
        return info
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((info["ip"], 9))  # UDP: picks the route, sends nothing
            info["source"] = sock.getsockname()[0]
    except OSError as exc:
        info["error"] = f"no route to {addr} ({info['ip']}): {exc.strerror or exc}"
        return info
    interfaces = _interfaces()
    info["interfaces"] = interfaces
    for name, ip in interfaces.items():
        if ip == info["source"]:
            info["interface"] = name
            break
    return info


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as fh:
            next(fh, None)
            for line in fh:
                cols = line.split()
                if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(cols[9])
    return inodes


def _raw_cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _cmdline(pid: int) -> str:
    raw = _raw_cmdline(pid)
    return " ".join(raw.decode(errors="replace").replace("\0", " ").split())[:200]


def _pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def port_holders(port: int) -> list[dict[str, Any]]:
    """Processes with a listening TCP socket on ``port`` (PID and command line)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    targets = {f"socket:[{i}]" for i in inodes}
    holders = []
    for pid in _pids():
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if link in targets:
                holders.append({"pid": pid, "cmdline": _cmdline(pid)})
                break
    return holders


def describe_holders(holders: list[dict[str, Any]]) -> str:
    """``PID 12 (python train.py), ...`` for :func:`port_holders`' result."""
    return ", ".join(f"PID {h['pid']} ({h['cmdline'][:60]})" for h in holders)


def listen(port: int) -> tuple[socket.socket | None, dict[str, Any]]:
    """Listen on ``port`` on every address, as the rendezvous store will; when that
    fails, name the holders and listen on an ephemeral port instead."""
    info: dict[str, Any] = {"requested": port, "free": False, "port": None}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("", port))
        info["free"] = True
    except OSError as exc:
        info["error"] = exc.strerror or str(exc)
        info["holders"] = port_holders(port)
        try:
            sock.bind(("", 0))
        except OSError:
            sock.close()
            return None, info
    sock.listen(128)
    info["port"] = sock.getsockname()[1]
    return sock, info


def connect(addr: str, port: int, timeout: float) -> dict[str, Any]:
    """One real TCP connection to ``addr:port``."""
    start = time.monotonic()
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            pass
    except TimeoutError:
        return {"ok": False, "error": f"no answer within {timeout:g} s (filtered or unroutable)"}
    except OSError as exc:
        return {"ok": False, "error": exc.strerror or str(exc)}
    return {"ok": True, "ms": round((time.monotonic() - start) * 1000, 3)}


# ----------------------------------------------------------------------- processes


def _same_netns(pid: int, own: str | None) -> bool:
    try:
        return own is None or os.readlink(f"/proc/{pid}/ns/net") == own
    except OSError:
        return False


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent PID, session ID)`` of ``pid`` from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return int(fields[1]), int(fields[3])
    except (OSError, IndexError, ValueError):
        return None


def own_family(pids: list[int]) -> set[int]:
    """This process, its ancestors, and every process in its session or below it:
    the check session itself, never something left over."""
    me = os.getpid()
    stats = {pid: st for pid in pids if (st := _stat(pid)) is not None}
    session = stats.get(me, (0, -1))[1]
    family = {me} | {pid for pid, (_, sid) in stats.items() if sid == session}
    while True:
        below = {pid for pid, (ppid, _) in stats.items() if ppid in family} - family
        if not below:
            break
        family |= below
    ancestors: set[int] = set()
    pid = stats.get(me, (0, 0))[0]
    while pid > 1 and pid not in ancestors:
        ancestors.add(pid)
        pid = stats.get(pid, (0, 0))[0]
    return family | ancestors


def _corral_env(pid: int) -> tuple[str | None, str | None]:
    """``(CORRAL_JOB_ID, CORRAL_NODE_DIR)`` of ``pid``'s environment (None: unset or
    unreadable): the job and where its node's files are (which run dir it belongs to)."""
    found: dict[bytes, str] = {}
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                key, _, value = item.partition(b"=")
                if key in (b"CORRAL_JOB_ID", b"CORRAL_NODE_DIR"):
                    found[key] = value.decode(errors="replace")
    except OSError:
        pass
    return found.get(b"CORRAL_JOB_ID"), found.get(b"CORRAL_NODE_DIR")


#: The modules whose process anchors a corral job on a host while it runs: the node
#: agent (every ``corral run`` / served job) and the actors' worker.
_ANCHOR_MODULES = (b"corral.agent", b"corral.actors.worker")
#: Daemons whose descendants belong to a job an engine runs (Slurm's step daemon, a
#: container runtime's shim: a Kubernetes pod): running, never leftovers.
_ENGINE_DAEMONS = ("slurmstepd", "containerd-shim", "conmon")
_JOB_ON_CMDLINE = re.compile(rb"(?:^|[\s\0'\"])CORRAL_JOB_ID=([^\s\0'\"]+)")


def _proc_stat(pid: int) -> tuple[str, str, int] | None:
    """``(state letter, command name, parent PID)`` of ``pid`` from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            head, tail = fh.read().rsplit(b")", 1)
        fields = tail.split()
        comm = head.split(b"(", 1)[1].decode(errors="replace")
        return fields[0].decode(), comm, int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def is_anchor(raw_cmdline: bytes) -> bool:
    """Whether a command line runs a job's anchor (``python -m corral.agent`` or
    ``-m corral.actors.worker``): while one lives, its job is running on this host."""
    argv = raw_cmdline.split(b"\0")
    return any(
        flag == b"-m" and module in _ANCHOR_MODULES for flag, module in itertools.pairwise(argv)
    )


def classify(procs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split corral processes into the leftovers of jobs that are gone and the jobs
    that are running here.

    ``procs``: ``{"pid", "job", "cmdline", "anchor", "under"}`` per process, where
    ``anchor`` marks a live agent / actor worker and ``under`` is the PID of the
    live anchor (or engine daemon: Slurm's, a pod's) it descends from, if any.
    A job with an anchor or a process under one is running (``{"job", "pids"}``,
    never to be killed; an agent started without ``CORRAL_JOB_ID`` is known by its
    ranks' job); every other process is stale (``{"pid", "job", "cmdline"}``, and its
    ``node_dir`` when its environment has one).
    Each PID is listed once."""
    anchor_job: dict[int, str | None] = {p["pid"]: p["job"] for p in procs if p.get("anchor")}
    for p in procs:
        under = p.get("under")
        if under is not None and p["job"] is not None and anchor_job.get(under) is None:
            anchor_job[under] = p["job"]
    live = {p["job"] for p in procs if p.get("under") is not None} | set(anchor_job.values())
    live.discard(None)
    stale: list[dict[str, Any]] = []
    busy: dict[str | None, list[int]] = {}
    seen: set[int] = set()
    for p in procs:
        if p["pid"] in seen:
            continue
        seen.add(p["pid"])
        job = p["job"] if p["job"] is not None else anchor_job.get(p["pid"])
        if p.get("anchor") or p.get("under") is not None or job in live:
            busy.setdefault(job, []).append(p["pid"])
        else:
            entry = {"pid": p["pid"], "job": p["job"], "cmdline": p["cmdline"]}
            if p.get("node_dir"):
                entry["node_dir"] = p["node_dir"]
            stale.append(entry)
    running = [{"job": job, "pids": sorted(pids)} for job, pids in busy.items()]
    return stale, running


def corral_processes(skip: set[int], job_id: str | None = None) -> list[dict[str, Any]]:
    """Processes of corral jobs alive on this host (its network namespace): anything
    with ``CORRAL_JOB_ID`` in its environment (or setting it on its command line) or
    running the agent; zombies (already dead) are left out. See :func:`classify`.

    Never counted: ``skip``, this session's own family (:func:`own_family`), and
    the processes of ``job_id`` (the job being checked), whose environment has
    it, or whose command line sets it (a shell about to exec that job's agent)."""
    try:
        own = os.readlink("/proc/self/ns/net")
    except OSError:
        own = None
    pids = _pids()
    skip = skip | own_family(pids)
    sets_mine = (
        re.compile(
            rb"(?:^|[\s\0'\"])CORRAL_JOB_ID=" + re.escape(job_id.encode()) + rb"(?=[\s\0'\"]|$)"
        )
        if job_id
        else None
    )
    info = {pid: st for pid in pids if (st := _proc_stat(pid)) is not None}
    anchors: set[int] = set()
    candidates: list[tuple[int, str | None, str, str | None]] = []
    for pid in pids:
        if info.get(pid, ("Z", "", 0))[0] in "ZX" or not _same_netns(pid, own):
            continue
        raw = _raw_cmdline(pid)
        if is_anchor(raw):
            anchors.add(pid)
        if pid in skip:
            continue
        job, node_dir = _corral_env(pid)
        cmd = _cmdline(pid)
        if job is None and "corral.agent" not in cmd:
            continue
        if job_id is not None and job == job_id:
            continue
        if sets_mine is not None and sets_mine.search(raw):
            continue
        if job is None and (named := _JOB_ON_CMDLINE.search(raw)) is not None:
            job = named.group(1).decode(errors="replace")
        candidates.append((pid, job, cmd, node_dir))
    return [
        {
            "pid": pid,
            "job": job,
            "cmdline": cmd,
            "node_dir": node_dir,
            "anchor": pid in anchors,
            "under": _attached_to(pid, info, anchors),
        }
        for pid, job, cmd, node_dir in candidates
    ]


def _attached_to(pid: int, info: dict[int, tuple[str, str, int]], anchors: set[int]) -> int | None:
    """The nearest ancestor of ``pid`` that keeps its job running: a live agent or
    actor worker, or an engine's daemon (:data:`_ENGINE_DAEMONS`; None: nothing does)."""
    seen: set[int] = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        pid = info.get(pid, ("", "", 0))[2]
        if pid in anchors or info.get(pid, ("", "", 0))[1] in _ENGINE_DAEMONS:
            return pid
    return None


def stale_processes(skip: set[int], job_id: str | None = None) -> list[dict[str, Any]]:
    """Leftovers of corral jobs that are gone (no live agent or actor worker of
    their job on this host): :func:`corral_processes` through :func:`classify`."""
    return classify(corral_processes(skip, job_id))[0]


def gpu_processes() -> list[dict[str, Any]]:
    """Processes using a GPU (nvidia-smi), with their memory."""
    if not shutil.which("nvidia-smi"):
        return []
    out = run_output(
        [
            "nvidia-smi",
            "--query-compute-apps=pid,process_name,used_memory",
            "--format=csv,noheader,nounits",
        ]
    )
    procs = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            procs.append({"pid": int(parts[0]), "cmdline": parts[1], "memory_mib": parts[2]})
    return procs


def gpu_health() -> dict[str, Any]:
    """GPU health through NVML (:func:`corral.agent.gpuprobe.probe`, shipped
    alongside this module): ``{"state": "no_gpus"}`` on a host without GPUs."""
    from corral.agent import gpuprobe  # shipped alongside this module

    return gpuprobe.probe()


# ----------------------------------------------------------------------- storage


def checkpoint_dir(path: str) -> dict[str, Any]:
    """Whether ``path`` exists or can be created, is writable, and its free space."""
    full = os.path.abspath(os.path.expanduser(path))
    info: dict[str, Any] = {"path": full, "existed": os.path.isdir(full), "writable": False}
    try:
        os.makedirs(full, exist_ok=True)
    except OSError as exc:
        info["error"] = f"cannot create {full}: {exc.strerror or exc}"
        return info
    probe = os.path.join(full, f".corral-write-test-{uuid.uuid4().hex[:8]}")
    try:
        with open(probe, "wb") as fh:
            fh.write(b"corral")
            fh.flush()
            os.fsync(fh.fileno())
        info["writable"] = True
    except OSError as exc:
        info["error"] = f"cannot write in {full}: {exc.strerror or exc}"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)
    try:
        st = os.statvfs(full)
        info["free_bytes"] = st.f_bavail * st.f_frsize
        info["total_bytes"] = st.f_blocks * st.f_frsize
    except OSError:
        pass
    return info


# ----------------------------------------------------------------------- code


def code(params: dict[str, Any]) -> dict[str, Any]:
    """The code tree's manifest and the entry script's hash on this host."""
    out: dict[str, Any] = {}
    code_dir = params.get("code_dir")
    if code_dir:
        from corral.agent import fingerprint  # shipped alongside this module

        root = os.path.abspath(os.path.expanduser(code_dir))
        if not os.path.isdir(root):
            out["tree"] = {"root": root, "missing": True}
        else:
            manifest = fingerprint.build_manifest(
                root, extra_ignores=params.get("extra_ignores") or ()
            )
            out["tree"] = manifest.to_json()
    script = params.get("script")
    if script:
        path = os.path.expanduser(script)
        if not os.path.isabs(path) and params.get("workdir"):
            path = os.path.join(os.path.expanduser(params["workdir"]), path)
        out["script"] = script_facts(path)
    return out


def script_facts(path: str) -> dict[str, Any]:
    """The entry script at ``path``: its SHA-256, or why it cannot be run (``error``).
    A directory runs only with a ``__main__.py`` (as ``runpy.run_path`` does)."""
    from corral.agent import fingerprint  # shipped alongside this module

    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "__main__.py")):
            return {"path": path, "package": True}
        return {"path": path, "error": "is a directory (no __main__.py)"}
    if not os.path.exists(path):
        return {"path": path, "error": "not found", "missing": True}
    try:
        return {"path": path, "sha256": fingerprint.file_digest(path)}
    except OSError as exc:
        return {"path": path, "error": exc.strerror or str(exc)}


# ----------------------------------------------------------------------- session


def facts(params: dict[str, Any], listener: dict[str, Any] | None) -> dict[str, Any]:
    """Everything the checks need from this host."""
    pkgs = packages()
    workdir = params.get("workdir") or ""
    skip = {os.getpid(), os.getppid()}
    result: dict[str, Any] = {
        "event": "facts",
        "hostname": socket.gethostname(),
        "software": software(
            pkgs, params.get("launcher") or "torchrun", params.get("binaries") or ()
        ),
        "packages": pkgs,
        "hardware": hardware(),
        "workdir": {
            "path": workdir,
            "exists": bool(workdir) and os.path.isdir(os.path.expanduser(workdir)),
        },
        "code": code(params),
        **_stale_and_busy(skip, params.get("job_id")),
        "gpu_processes": gpu_processes(),
        "gpu_health": gpu_health(),
        "listener": listener,
    }
    if params.get("master_addr"):
        result["route"] = route_to(params["master_addr"])
    if params.get("checkpoint_dir"):
        result["checkpoint"] = checkpoint_dir(params["checkpoint_dir"])
    result["time"] = time.time()
    return result


def _stale_and_busy(skip: set[int], job_id: str | None) -> dict[str, Any]:
    """The stale check's facts; ``process_scope`` names the set of processes seen
    (machine and network namespace), the same for every node of one machine."""
    stale, busy = classify(corral_processes(skip, job_id))
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return {"stale": stale, "busy": busy, "process_scope": f"{socket.gethostname()} {netns}"}


def main(params: dict[str, Any]) -> int:
    """Listen (master host), print the facts, answer connect requests until EOF."""
    listener_sock = None
    listener = None
    if params.get("listen_port") is not None:
        listener_sock, listener = listen(int(params["listen_port"]))
    _emit(facts(params, listener))
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        if request.get("op") == "connect":
            reply = connect(request["addr"], int(request["port"]), float(request["timeout"]))
            _emit({"event": "connect", **reply})
        elif request.get("op") == "time":
            _emit({"event": "time", "time": time.time()})
    if listener_sock is not None:
        listener_sock.close()
    return 0
