"""Fan-out benchmark: ``true`` on 32 SSH hosts with corral vs pdsh vs a sequential ssh loop.

Starts 32 OpenSSH ``sshd`` on 127.0.0.1 ports (temp host key, temp authorized_keys,
``StrictModes no``, ``UsePAM no``) and a generated ssh_config giving each a Host
alias (``h01``..``h32``), so pdsh, ssh and corral reach exactly the same hosts.
As root, the sshds see /bin/sh as the login shell (see ``_lean_shell_wrapper``).

Measured (median of several rounds, seconds):

* ``pdsh``        ``pdsh -R ssh -f 32 -w h01,...,h32 true`` (OpenSSH underneath).
* ``ssh_loop``    ``ssh h01 true; ssh h02 true; ...`` one after the other.
* ``corral_cold_cli``     ``corral exec --hosts ... -- true``: a new process, new connections.
* ``corral_cold``         in-process :func:`run_on_hosts` on a fresh SshTransport
                          (connect + run + close), i.e. the API/coordinator cost.
* ``corral_warm``         repeated :func:`run_on_hosts` on one transport (connections reused).

Run: ``.venv/bin/python benchmarks/bench_fanout.py [--hosts 32] [--rounds 5]``.
Writes ``benchmarks/results/fanout.json``. Needs sshd, ssh, ssh-keygen and pdsh.
Targets: corral_cold <= 1.0x pdsh, corral_warm <= 0.2x pdsh.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from corral.cli.common import SshOptions
from corral.cluster import Host
from corral.fleet.fanout import check_connectivity, run_on_hosts
from corral.transport.ssh import SshTransport

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "fanout.json"

_CLI = (
    "import sys, corral.cli as c\n"
    "if 'exec' not in c._VERB_MODULES:\n"
    "    c._VERB_MODULES = (*c._VERB_MODULES, 'exec')\n"
    "from corral.cli.main import main\n"
    "sys.argv[0] = 'corral'\n"
    "main()\n"
)


@dataclass
class Cluster:
    """32 loopback sshds and the files that reach them."""

    root: Path
    names: list[str]
    ssh_config: Path
    hostfile: Path


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait_listening(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"sshd on 127.0.0.1:{port} did not start")


@contextlib.contextmanager
def loopback_cluster(n: int) -> Iterator[Cluster]:
    """Start ``n`` sshd on 127.0.0.1 and write ssh_config/known_hosts/hostfile for them."""
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    root = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        host_key, client_key = root / "host_ed25519", root / "id_ed25519"
        for key in (host_key, client_key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
            )
        authorized = root / "authorized_keys"
        authorized.write_text((root / "id_ed25519.pub").read_text())
        host_pub = (root / "host_ed25519.pub").read_text().split()[:2]
        user = pwd.getpwuid(os.getuid()).pw_name
        wrapper = _lean_shell_wrapper(root, user)
        ports = _free_ports(n)
        names = [f"h{i + 1:02d}" for i in range(n)]
        known, config = [], []
        for name, port in zip(names, ports, strict=True):
            conf = root / f"sshd_{name}.conf"
            conf.write_text(
                f"ListenAddress 127.0.0.1:{port}\nHostKey {host_key}\n"
                f"PidFile {root / f'sshd_{name}.pid'}\nAuthorizedKeysFile {authorized}\n"
                "PubkeyAuthentication yes\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
                "UsePAM no\nStrictModes no\nUseDNS no\nPrintMotd no\nPrintLastLog no\n"
                "X11Forwarding no\nMaxSessions 64\nMaxStartups 128:30:256\nLogLevel ERROR\n"
            )
            procs.append(
                subprocess.Popen(
                    [*wrapper, sshd, "-D", "-e", "-f", str(conf)],
                    stdout=subprocess.DEVNULL,
                    stderr=open(root / f"sshd_{name}.log", "wb"),  # noqa: SIM115
                )
            )
            known.append(f"[127.0.0.1]:{port} {' '.join(host_pub)}")
            config.append(
                f"Host {name}\n    HostName 127.0.0.1\n    Port {port}\n    User {user}\n"
                f"    IdentityFile {client_key}\n    IdentitiesOnly yes\n"
                f"    UserKnownHostsFile {root / 'known_hosts'}\n"
                "    GlobalKnownHostsFile /dev/null\n    StrictHostKeyChecking yes\n"
                "    BatchMode yes\n    LogLevel ERROR\n"
            )
        (root / "known_hosts").write_text("\n".join(known) + "\n")
        ssh_config = root / "ssh_config"
        ssh_config.write_text("\n".join(config))
        hostfile = root / "hostfile"
        hostfile.write_text("\n".join(names) + "\n")
        for port in ports:
            _wait_listening(port)
        yield Cluster(root=root, names=names, ssh_config=ssh_config, hostfile=hostfile)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        shutil.rmtree(root, ignore_errors=True)


def _lean_shell_wrapper(root: Path, user: str) -> list[str]:
    """Run sshd where ``user``'s login shell is /bin/sh (private mount namespace, root only).

    All 32 "hosts" share this machine's CPUs, so a heavy ~/.bashrc (pyenv init, ...)
    run by every session would dominate and serialise every tool alike; on a real
    cluster that work runs in parallel on separate machines. The bind mount of an
    edited /etc/passwd is visible only to these sshd processes.
    """
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        return []
    lines = []
    for line in Path("/etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if len(fields) == 7 and fields[0] == user:
            fields[6] = "/bin/sh"
        lines.append(":".join(fields))
    passwd = root / "passwd"
    passwd.write_text("\n".join(lines) + "\n")
    passwd.chmod(0o644)
    script = f'mount --bind {passwd} /etc/passwd && exec "$@"'
    return [unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _check(result: subprocess.CompletedProcess[bytes], what: str) -> None:
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}): {result.stderr.decode()[-500:]}")


def bench_pdsh(c: Cluster) -> float:
    env = dict(os.environ, PDSH_RCMD_TYPE="ssh", PDSH_SSH_ARGS=f"-F {c.ssh_config} %h")
    argv = ["pdsh", "-R", "ssh", "-f", str(len(c.names)), "-w", ",".join(c.names), "true"]

    def run() -> None:
        _check(subprocess.run(argv, env=env, capture_output=True, check=False), "pdsh")

    return _timed(run)


def bench_ssh_loop(c: Cluster) -> float:
    def run() -> None:
        for name in c.names:
            argv = ["ssh", "-F", str(c.ssh_config), name, "true"]
            _check(subprocess.run(argv, capture_output=True, check=False), "ssh")

    return _timed(run)


def bench_corral_cli(c: Cluster) -> float:
    argv = [sys.executable, "-c", _CLI, "exec", "--hosts", str(c.hostfile)]
    argv += ["--ssh-config", str(c.ssh_config), "--", "true"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}

    def run() -> None:
        _check(subprocess.run(argv, capture_output=True, env=env, check=False), "corral exec")

    return _timed(run)


def _hosts(c: Cluster) -> list[Host]:
    return [Host(name=n) for n in c.names]


async def _corral_cold(c: Cluster) -> float:
    hosts = _hosts(c)
    start = time.perf_counter()
    transport = SshTransport(SshOptions(config=str(c.ssh_config)))
    try:
        errors = await check_connectivity(transport, hosts)
        if errors:
            raise RuntimeError(f"unreachable: {errors}")
        results = await run_on_hosts(transport, hosts, "true")
    finally:
        await transport.close()
    elapsed = time.perf_counter() - start
    if not all(r.ok for r in results):
        raise RuntimeError(f"corral fan-out failed: {[r.status for r in results]}")
    return elapsed


async def _corral_warm(c: Cluster, rounds: int) -> list[float]:
    hosts = _hosts(c)
    times = []
    async with SshTransport(SshOptions(config=str(c.ssh_config))) as transport:
        await run_on_hosts(transport, hosts, "true")  # connect
        for _ in range(rounds):
            start = time.perf_counter()
            results = await run_on_hosts(transport, hosts, "true")
            times.append(time.perf_counter() - start)
            if not all(r.ok for r in results):
                raise RuntimeError(f"corral fan-out failed: {[r.status for r in results]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="cold rounds per tool")
    parser.add_argument("--warm-rounds", type=int, default=20)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    missing = [t for t in ("sshd", "ssh", "ssh-keygen", "pdsh") if not shutil.which(t)]
    if not Path("/usr/sbin/sshd").exists() and "sshd" in missing:
        sys.exit(f"missing tools: {', '.join(missing)} (apt-get install openssh-server pdsh)")
    missing = [t for t in missing if t != "sshd"]
    if missing:
        sys.exit(f"missing tools: {', '.join(missing)} (apt-get install openssh-client pdsh)")

    samples: dict[str, list[float]] = {
        "pdsh": [],
        "ssh_loop": [],
        "corral_cold": [],
        "corral_cold_cli": [],
    }
    with loopback_cluster(args.hosts) as cluster:
        bench_pdsh(cluster)  # warm up page cache / sshd re-exec paths
        for _ in range(args.rounds):  # interleaved so load changes hit every tool alike
            samples["pdsh"].append(bench_pdsh(cluster))
            samples["corral_cold"].append(asyncio.run(_corral_cold(cluster)))
            samples["corral_cold_cli"].append(bench_corral_cli(cluster))
        for _ in range(max(1, args.rounds // 2)):
            samples["ssh_loop"].append(bench_ssh_loop(cluster))
        samples["corral_warm"] = asyncio.run(_corral_warm(cluster, args.warm_rounds))

    med = {k: statistics.median(v) for k, v in samples.items()}
    pdsh = med["pdsh"]
    doc = {
        "benchmark": "fanout",
        "command": "true",
        "hosts": args.hosts,
        "rounds": args.rounds,
        "warm_rounds": args.warm_rounds,
        "remote_login_shell": "/bin/sh (private mount namespace)"
        if os.geteuid() == 0 and shutil.which("unshare")
        else "the user's own",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_avg": os.getloadavg(),
        },
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "samples_s": {k: [round(x, 4) for x in v] for k, v in samples.items()},
        "ratios": {
            "corral_cold/pdsh": round(med["corral_cold"] / pdsh, 3),
            "corral_cold_cli/pdsh": round(med["corral_cold_cli"] / pdsh, 3),
            "corral_warm/pdsh": round(med["corral_warm"] / pdsh, 3),
            "ssh_loop/pdsh": round(med["ssh_loop"] / pdsh, 3),
        },
        "targets": {"corral_cold/pdsh": 1.0, "corral_warm/pdsh": 0.2},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=2) + "\n")

    print(f"fan-out of `true` on {args.hosts} loopback sshd hosts (median seconds)")
    print(f"  {'tool':<18}{'median s':>10}{'x pdsh':>9}")
    for key in ("pdsh", "ssh_loop", "corral_cold_cli", "corral_cold", "corral_warm"):
        print(f"  {key:<18}{med[key]:>10.3f}{med[key] / pdsh:>9.2f}")
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
