"""The :class:`Testbed`: N simulated hosts on one Linux machine, each a network
namespace on a bridge with its own hostname, ``/etc/hosts``, ``/srv``, ``/tmp``, home
directory and sshd.

Layout of a host ``tbK`` (address ``.K`` of the subnet):

- network namespace ``corral-tbK``; a veth pair ``crl-tbK`` (root side, on the
  bridge ``crlbr0`` that carries the coordinator's address) / ``nic-tbK`` (inside);
- a *holder* process (``sleep infinity``) started by ``ip netns exec ... unshare
  --uts --mount`` that owns the host's UTS and mount namespaces, where the
  hostname is set and the host's own ``/etc/hosts`` and ``/etc/hostname`` are
  bind-mounted, then its private ``/srv``, ``/tmp`` and root's home (backed by
  ``STATE_DIR/hosts/tbK/fs/``), through which the state dir (sshd's files) and the
  Python environment running corral stay visible at their own paths;
- an OpenSSH ``sshd -D`` entered into the holder's namespaces with ``nsenter``.

A machine can have several testbeds side by side, one per *instance* (0..99, one
per test worker): each has its own namespaces, links, bridge, subnet, registry and
lock (:class:`~corral.testbed._model.InstanceNames`); instance 0 is the testbed by hand.

The kernel's neighbour (ARP) table is one for all namespaces, so ``up`` raises its
limits (``net.ipv4.neigh.default.gc_thresh1..3``) for the full mesh of every
testbed up, never lowering them, and the last ``down`` puts back what was raised
(one that goes down before another hands its record over to it).

Everything created is recorded in ``STATE_DIR/state.json`` (and a copy in
``/run/corral/testbed.json``, ``testbed-I.json`` for instance ``I``) before or as it
is created, so ``down`` removes exactly that, processes by PID *and* start time,
even after a crashed ``up``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pwd
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import corral
from corral.errors import CommandTimeout, ConfigError, LaunchError
from corral.testbed import _system as sysx
from corral.testbed._model import (
    SRV_DIR,
    HostRecord,
    InstanceNames,
    MountPlan,
    TestbedState,
    check_state_dir,
    hand_over_sysctls,
    neighbour_limits,
    new_state,
    peer_ifname,
    plan_mounts,
    plan_network,
    render_etc_hosts,
    render_hostfile,
    render_known_hosts,
    render_ssh_config,
    render_sshd_config,
)
from corral.testbed._registry import check_free, read_registry, registered, registry_path
from corral.testbed._report import (
    DownResult,
    HostStatus,
    TestbedHost,
    TestbedStatus,
    UpResult,
)

SSH_PORT = 22
START_TIMEOUT = 20.0

# Runs as the holder: configure the host's interface, hostname and private
# files inside fresh UTS + mount namespaces, then become ``sleep infinity``.
# MOUNTS is replaced by the host's MountPlan.script().
_HOLDER_SCRIPT = """set -e
name=$1; cidr=$2; dir=$3; dev=$4
ip link set lo up
ip addr add "$cidr" dev "$dev"
ip link set "$dev" up
hostname "$name"
mount --bind "$dir/etc-hosts" /etc/hosts
if [ -e /etc/hostname ]; then mount --bind "$dir/etc-hostname" /etc/hostname; fi
MOUNTS
exec sleep infinity
"""

# Files ``up`` writes directly in the state dir (``hosts/`` holds the per-host ones).
_STATE_FILES = (
    "state.json",
    "hostfile",
    "ssh_config",
    "known_hosts",
    "authorized_keys",
    "id_ed25519",
    "id_ed25519.pub",
)


def default_state_dir(instance: int = 0) -> Path:
    """``$XDG_CACHE_HOME/corral/testbed``, else ``~/.cache/corral/testbed`` (``testbed-I``
    for instance ``I`` > 0)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    tag = f"-{instance}" if InstanceNames(instance).instance else ""
    return Path(base) / "corral" / f"testbed{tag}"


class Testbed:
    """A simulated multi-host cluster whose state lives in ``state_dir``.

    Needs Linux and root. ``up(n)`` creates hosts ``tb1..tbN``; ``down()``
    removes them; the fault helpers (:meth:`cut_link`, :meth:`kill_sshd`, ...)
    act on one host. ``instance`` (0..99) is which of the machine's testbeds ``up``
    creates: its names, subnet and registry (what is up keeps its recorded ones).
    """

    __test__ = False

    def __init__(
        self, state_dir: str | os.PathLike[str] | None = None, *, instance: int = 0
    ) -> None:
        raw = Path(state_dir) if state_dir is not None else default_state_dir(instance)
        self.state_dir: Path = check_state_dir(raw)
        self.names = InstanceNames(instance)

    @property
    def instance(self) -> int:
        """Which of the machine's testbeds this is (0: the one by hand)."""
        return self.names.instance

    def __repr__(self) -> str:
        tag = f", instance={self.instance}" if self.instance else ""
        return f"Testbed({str(self.state_dir)!r}{tag})"

    # ------------------------------------------------------------------ paths

    @property
    def state_file(self) -> Path:
        """``state.json``: what ``up`` created."""
        return self.state_dir / "state.json"

    @property
    def hostfile(self) -> Path:
        """Hostfile for ``corral run --hosts``."""
        return self.state_dir / "hostfile"

    @property
    def ssh_config(self) -> Path:
        """OpenSSH client config mapping each host name to its address."""
        return self.state_dir / "ssh_config"

    @property
    def key_path(self) -> Path:
        """The client's private key (ed25519)."""
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """Host keys of every host, under both name and address."""
        return self.state_dir / "known_hosts"

    def host_dir(self, name: str) -> Path:
        """Per-host files (configs, keys, logs; ``fs/`` backs its private directories)."""
        return self.state_dir / "hosts" / name

    def host_path(self, name: str, path: str | os.PathLike[str]) -> Path:
        """Where ``path`` on host ``name`` (in its private ``/srv``, ``/tmp`` or home) is
        seen from here, e.g. ``/srv/corral/ck`` -> ``STATE_DIR/hosts/NAME/fs/srv/corral/ck``.

        A path the host keeps visible (the state dir, the Python environment) is itself;
        ConfigError for an unknown host, a relative path or one outside the private
        directories (the host shares those with this machine).
        """
        self._require().host(name)
        here = self._mount_plan(name).locate(os.fspath(path))
        if here is None:
            raise ConfigError(f"{path} is not in a private directory of host {name}")
        return Path(here)

    def _mount_plan(self, name: str) -> MountPlan:
        """Host ``name``'s private directories, keeping visible the state dir and the
        Python environment (and source tree) corral runs from."""
        home = "/root"
        with contextlib.suppress(KeyError):
            home = pwd.getpwnam("root").pw_dir
        keep: list[str | Path] = [
            self.state_dir,
            sys.prefix,
            sys.base_prefix,
            Path(corral.__file__).parents[1],
        ]
        dirs = [os.path.realpath(p) for p in keep]
        return plan_mounts(self.host_dir(name), home, [d for d in dirs if os.path.isdir(d)])

    # ------------------------------------------------------------------ state

    @classmethod
    def running(cls, instance: int = 0) -> Testbed | None:
        """The testbed of ``instance`` registered on this machine (whatever its state dir)."""
        rec = read_registry(instance)
        return cls(rec.state_dir, instance=rec.instance) if rec is not None else None

    @classmethod
    def all_running(cls) -> list[Testbed]:
        """Every testbed registered on this machine, by instance."""
        return [cls(rec.state_dir, instance=rec.instance) for rec in registered()]

    def _load(self) -> TestbedState | None:
        """This dir's state; the registry copy when the state dir was lost (or is unreadable)."""
        error: ConfigError | None = None
        if self.state_file.exists():
            try:
                return self._adopt(TestbedState.from_json(self.state_file.read_text()))
            except ConfigError as exc:
                error = exc
        for rec in registered():
            if Path(rec.state_dir) == self.state_dir:
                return self._adopt(rec)
        if error is not None:
            raise ConfigError(
                f"{error.message}; remove the testbed's namespaces, links and processes by hand",
                source=str(self.state_file),
            ) from error
        return None

    def _adopt(self, state: TestbedState) -> TestbedState:
        """Take the instance of the testbed recorded here (a repair's ``up`` keeps it)."""
        self.names = InstanceNames(state.instance)
        return state

    def _require(self) -> TestbedState:
        state = self._load()
        if state is None:
            raise ConfigError(
                f"no testbed in {self.state_dir}; start one with `corral testbed up N"
                f"{self._dir_flag()}`"
            )
        return state

    def _save(self, state: TestbedState) -> None:
        _write_state(state)

    def _dir_flag(self) -> str:
        return "" if self.state_dir == default_state_dir() else f" --state-dir {self.state_dir}"

    @property
    def hosts(self) -> list[TestbedHost]:
        """The hosts of the recorded testbed (empty when none)."""
        state = self._load()
        if state is None:
            return []
        return [TestbedHost(h.name, h.address, h.netns, h.veth) for h in state.hosts]

    @property
    def subnet(self) -> str:
        """The recorded testbed's subnet (ConfigError when none is up here)."""
        return self._require().subnet

    @property
    def bridge(self) -> str:
        """The recorded testbed's bridge (ConfigError when none is up here)."""
        return self._require().bridge

    def host(self, name: str) -> TestbedHost:
        """The host called ``name`` (ConfigError if the testbed has none such)."""
        h = self._require().host(name)
        return TestbedHost(h.name, h.address, h.netns, h.veth)

    # ------------------------------------------------------------------ up

    def up(self, n: int, *, subnet: str | None = None, slots: int = 1) -> UpResult:
        """Create hosts ``tb1..tbN`` (on ``subnet``, by default the instance's
        ``10.77.I.0/24``); a no-op when the same testbed is already healthy.

        Raises LaunchError when requirements are missing or a previous testbed
        is half up, ConfigError for bad arguments or a conflicting testbed.
        """
        if slots < 1:
            raise ConfigError(f"slots must be at least 1, not {slots}", option="--slots")
        plan = plan_network(subnet if subnet is not None else self.names.subnet, n)
        sysx.check_requirements()
        started = time.monotonic()
        with sysx.locked():
            existing = self._load()
            if existing is not None:
                wanted = str(plan.subnet) if subnet is not None else existing.subnet
                return self._reuse(existing, n, wanted, slots, started)
            other = read_registry(self.instance)
            if other is not None:
                raise LaunchError(
                    f"a testbed{self._instance_words()} is already up with state dir "
                    f"{other.state_dir}; run `corral testbed down --state-dir "
                    f"{other.state_dir}` first"
                )
            state = new_state(self.state_dir, plan, slots, self.instance)
            check_free(state)
            try:
                self._create(state)
            except BaseException:
                with contextlib.suppress(Exception):
                    self._teardown(state)
                raise
        hosts = tuple(TestbedHost(h.name, h.address, h.netns, h.veth) for h in state.hosts)
        return UpResult(self.state_dir, hosts, already_up=False, seconds=time.monotonic() - started)

    def _reuse(
        self, state: TestbedState, n: int, subnet: str, slots: int, started: float
    ) -> UpResult:
        st = self._inspect(state)
        if not st.healthy:
            problems = st.problems()
            if len(problems) > 4:
                problems = [*problems[:3], f"... {len(problems) - 3} more"]
            raise LaunchError(
                f"a previous testbed in {self.state_dir} is half up ("
                + "; ".join(problems)
                + f"); run `corral testbed down{self._dir_flag()}` first"
            )
        if len(state.hosts) != n or state.subnet != subnet or state.slots != slots:
            raise ConfigError(
                f"a testbed of {len(state.hosts)} hosts on {state.subnet} (slots={state.slots}) "
                f"is already up in {self.state_dir}; run `corral testbed down"
                f"{self._dir_flag()}` first to change it"
            )
        hosts = tuple(TestbedHost(h.name, h.address, h.netns, h.veth) for h in state.hosts)
        return UpResult(self.state_dir, hosts, already_up=True, seconds=time.monotonic() - started)

    def _create(self, state: TestbedState) -> None:
        ip, keygen = sysx.tool("ip"), sysx.tool("ssh-keygen")
        sd = self.state_dir
        sd.mkdir(mode=0o700, parents=True, exist_ok=True)
        sd.chmod(0o700)
        plans = {h.name: self._mount_plan(h.name) for h in state.hosts}
        Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        for p in plans[state.hosts[0].name].private:  # mount points, the same on every host
            if not os.path.isdir(p.path):
                os.makedirs(p.path, mode=p.mode)
                state.created_paths.append(p.path)
        for h in state.hosts:
            for directory, mode in plans[h.name].directories():
                Path(directory).mkdir(mode=mode, parents=True, exist_ok=True)
                os.chmod(directory, mode)
            srv = plans[h.name].locate(SRV_DIR)  # in the private /srv: never None
            assert srv is not None
            Path(srv).mkdir(mode=0o755, exist_ok=True)
        self._save(state)  # recorded before anything exists in the kernel

        # Keys: one client key and a host key per host, generated in parallel.
        jobs = [(self.key_path, "corral-testbed-client")] + [
            (self.host_dir(h.name) / "ssh_host_ed25519_key", f"corral-testbed-{h.name}")
            for h in state.hosts
        ]
        keygens = []
        for path, comment in jobs:
            for old in (path, path.with_name(path.name + ".pub")):
                old.unlink(missing_ok=True)
            keygens.append(
                subprocess.Popen(
                    [keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )

        # The neighbour table is shared by every namespace: size it for the full mesh of
        # this testbed and of every other one up on the machine.
        others = [len(o.hosts) for o in registered() if o.instance != state.instance]
        state.sysctls = sysx.raise_sysctls(neighbour_limits(len(state.hosts), *others))
        self._save(state)

        # Network: bridge, namespaces and veth pairs in one `ip -batch`.
        plen = ipaddress.ip_network(state.subnet).prefixlen
        lines = [
            f"link add name {state.bridge} type bridge forward_delay 0",
            f"addr add {state.bridge_address}/{plen} dev {state.bridge}",
            f"link set {state.bridge} up",
        ]
        for h in state.hosts:
            lines += [
                f"netns add {h.netns}",
                f"link add {h.veth} type veth peer name {peer_ifname(h.name)} netns {h.netns}",
                f"link set {h.veth} master {state.bridge} up",
            ]
        sysx.run([ip, "-batch", "-"], input="\n".join(lines) + "\n")
        for h in state.hosts:
            h.netns_inode = sysx.netns_inode(h.netns)
        self._save(state)

        # Per-host files, then the holders (one per host, all in parallel).
        etc_hosts = render_etc_hosts(state.hosts, state.bridge_address)
        for h in state.hosts:
            d = self.host_dir(h.name)
            (d / "etc-hosts").write_text(etc_hosts)
            (d / "etc-hostname").write_text(h.name + "\n")
        unshare = sysx.tool("unshare")
        holders = {}
        for h in state.hosts:
            argv = [ip, "netns", "exec", h.netns, unshare, "--uts", "--mount"]
            script = _HOLDER_SCRIPT.replace("MOUNTS\n", plans[h.name].script())
            argv += ["--propagation", "private", "sh", "-c", script, "corral-holder"]
            argv += [h.name, f"{h.address}/{plen}", str(self.host_dir(h.name))]
            argv.append(peer_ifname(h.name))
            log = self.host_dir(h.name) / "holder.log"
            holders[h.name] = sysx.spawn(argv, stdout=None, log=log).pid

        for proc, (path, _) in zip(keygens, jobs, strict=True):
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise LaunchError(f"ssh-keygen for {path} failed: {err.decode().strip()}")
        pub = self.key_path.with_name("id_ed25519.pub").read_text()
        (sd / "authorized_keys").write_text(pub)
        host_keys = []
        for h in state.hosts:
            d = self.host_dir(h.name)
            key_type, key = (d / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            host_keys.append((h, f"{key_type} {key}"))
            (d / "sshd_config").write_text(
                render_sshd_config(
                    h,
                    host_key=d / "ssh_host_ed25519_key",
                    pid_file=d / "sshd.pid",
                    authorized_keys=sd / "authorized_keys",
                )
            )
        self.known_hosts.write_text(render_known_hosts(host_keys))
        self.ssh_config.write_text(render_ssh_config(state.hosts, self.key_path, self.known_hosts))
        self.hostfile.write_text(render_hostfile(state.hosts, state.slots))

        failed = sysx.wait_comm(list(holders.values()), "sleep", START_TIMEOUT)
        for h in state.hosts:
            if holders[h.name] not in failed:
                h.holder = sysx.record(holders[h.name])
        self._save(state)
        if failed:
            name = next(n for n, pid in holders.items() if pid in failed)
            raise LaunchError(
                "setting up the host failed: " + self._log_tail(name, "holder.log"), host=name
            )

        sshds = {h.name: self._spawn_sshd(h) for h in state.hosts}
        self._wait_sshd(state, sshds)
        state.phase = "up"
        self._save(state)

    def _spawn_sshd(self, h: HostRecord) -> int:
        assert h.holder is not None
        d = self.host_dir(h.name)
        argv = [sysx.tool("nsenter"), f"--target={h.holder.pid}", "--net", "--uts", "--mount"]
        argv += ["--", sysx.tool("sshd"), "-D", "-f", str(d / "sshd_config")]
        argv += ["-E", str(d / "sshd.log")]
        return sysx.spawn(argv, stdout=None, log=d / "sshd.log").pid

    def _wait_sshd(self, state: TestbedState, pids: Mapping[str, int]) -> None:
        """Record each new sshd and wait until it accepts TCP connections."""
        failed = sysx.wait_comm(list(pids.values()), "sshd", START_TIMEOUT)
        for h in state.hosts:
            if h.name in pids and pids[h.name] not in failed:
                h.sshd = sysx.record(pids[h.name])
        self._save(state)
        if failed:
            name = next(n for n, pid in pids.items() if pid in failed)
            raise LaunchError("sshd failed: " + self._log_tail(name, "sshd.log"), host=name)
        pending = [h for h in state.hosts if h.name in pids]
        deadline = time.monotonic() + START_TIMEOUT
        while pending:
            for h in pending:
                if not sysx.alive(pids[h.name]):
                    raise LaunchError(
                        "sshd exited: " + self._log_tail(h.name, "sshd.log"), host=h.name
                    )
            pending = [h for h in pending if not sysx.tcp_answers(h.address, SSH_PORT, 0.2)]
            if pending and time.monotonic() > deadline:
                raise LaunchError(
                    f"sshd does not answer on {pending[0].address}:{SSH_PORT} after "
                    f"{START_TIMEOUT:.0f} s",
                    host=pending[0].name,
                )
            if pending:
                time.sleep(0.01)

    def _log_tail(self, name: str, log: str, lines: int = 5) -> str:
        path = self.host_dir(name) / log
        try:
            tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            tail = []
        return " / ".join(tail) or f"no output (see {path})"

    # ------------------------------------------------------------------ down

    def down(self) -> DownResult:
        """Remove exactly what ``up`` recorded: processes (by PID and start time) and every
        process left inside the hosts' namespaces, veths, namespaces, the bridge, the
        state dir's generated files (including each host's ``/srv``, ``/tmp`` and home). A no-op
        when there is no testbed here."""
        sysx.check_requirements()
        with sysx.locked():
            state = self._load()
            if state is None:
                return DownResult(self.state_dir)
            removed = self._teardown(state)
        return DownResult(self.state_dir, tuple(removed))

    def _teardown(self, state: TestbedState) -> list[str]:
        removed: list[str] = []
        inodes: set[int] = set()
        for h in state.hosts:
            ino = sysx.netns_inode(h.netns)
            if ino is not None and h.netns_inode in (None, ino):
                inodes.add(ino)
            if sysx.is_ours(h.holder):
                assert h.holder is not None
                hino = sysx.netns_inode_of_pid(h.holder.pid)
                if hino is not None:
                    inodes.add(hino)
        victims = [
            rec.pid
            for h in state.hosts
            for rec in (h.sshd, h.holder)
            if rec is not None and sysx.is_ours(rec)
        ]
        victims += sysx.pids_in_netns(inodes)
        victims = list(dict.fromkeys(victims))
        stuck: LaunchError | None = None
        if victims:
            try:
                sysx.terminate(victims)
            except LaunchError as exc:  # unkillable (D state): remove the rest anyway
                stuck = exc
            removed.append(f"{len(victims)} processes")

        lines: list[str] = []
        for h in state.hosts:
            if sysx.link_exists(h.veth):
                lines.append(f"link del {h.veth}")
                removed.append(f"link {h.veth}")
            ino = sysx.netns_inode(h.netns)
            if ino is not None and h.netns_inode in (None, ino):
                lines.append(f"netns del {h.netns}")
                removed.append(f"netns {h.netns}")
        if sysx.link_exists(state.bridge):
            lines.append(f"link del {state.bridge}")
            removed.append(f"bridge {state.bridge}")
        if lines:
            sysx.run([sysx.tool("ip"), "-force", "-batch", "-"], input="\n".join(lines) + "\n")

        removed += self._release_shared(state)
        sd = Path(state.state_dir)
        mounted = sysx.mounts_under(sd / "hosts")
        if mounted:  # never delete through a mount into the hosts' files
            raise LaunchError(
                f"{', '.join(mounted)} still mounted here; unmount and run `corral testbed "
                f"down{self._dir_flag()}` again"
            )
        shutil.rmtree(sd / "hosts", ignore_errors=True)
        for name in _STATE_FILES:
            (sd / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            sd.rmdir()
        rec = read_registry(state.instance)
        if rec is not None and rec.state_dir == state.state_dir:
            registry_path(state.instance).unlink(missing_ok=True)
        if stuck is not None:
            raise stuck
        return removed

    @staticmethod
    def _release_shared(state: TestbedState) -> list[str]:
        """Put back what ``state``'s ``up`` changed on the machine (kernel settings, mount
        point directories it made), unless another testbed is still up: that one takes
        the record over (its hosts use them; the last one down puts them back)."""
        others = [o for o in registered() if o.state_dir != state.state_dir]
        if not others:
            removed = [f"sysctl {name} restored" for name in sysx.restore_sysctls(state.sysctls)]
            for path in state.created_paths:
                with contextlib.suppress(OSError):
                    Path(path).rmdir()
                    removed.append(path)
            return removed
        heir = others[0]
        now = sysx.read_sysctls([*state.sysctls, *heir.sysctls])
        merged = hand_over_sysctls(state.sysctls, heir.sysctls, now)
        paths = list(dict.fromkeys([*heir.created_paths, *state.created_paths]))
        if merged != heir.sysctls or paths != heir.created_paths:
            heir.sysctls, heir.created_paths = merged, paths
            _write_state(heir)
        left = [f"sysctl {name}" for name in state.sysctls] + state.created_paths
        return [f"{what} left to the testbed in {heir.state_dir}" for what in left]

    def _instance_words(self) -> str:
        return f" (instance {self.instance})" if self.instance else ""

    # ------------------------------------------------------------------ status

    def status(self, *, timeout: float = 1.0) -> TestbedStatus:
        """Each host's namespace, processes, link and whether its sshd answers."""
        state = self._load()
        if state is None:
            other = read_registry(self.instance) or next(iter(registered()), None)
            return TestbedStatus(
                str(self.state_dir),
                exists=False,
                other_state_dir=other.state_dir if other is not None else None,
            )
        return self._inspect(state, timeout=timeout)

    def _inspect(self, state: TestbedState, *, timeout: float = 1.0) -> TestbedStatus:
        def one(h: HostRecord) -> HostStatus:
            ino = sysx.netns_inode(h.netns)
            netns = ino is not None and ino == h.netns_inode
            sshd = sysx.is_ours(h.sshd)
            link = sysx.link_is_up(h.veth)
            answers = sshd and link and sysx.tcp_answers(h.address, SSH_PORT, timeout)
            return HostStatus(
                name=h.name,
                address=h.address,
                netns=netns,
                holder=sysx.is_ours(h.holder),
                sshd=sshd,
                link_up=link,
                ssh_answers=answers,
            )

        with ThreadPoolExecutor(max_workers=min(32, max(1, len(state.hosts)))) as pool:
            hosts = tuple(pool.map(one, state.hosts))
        return TestbedStatus(
            state_dir=state.state_dir,
            exists=True,
            phase=state.phase,
            subnet=state.subnet,
            bridge=state.bridge,
            bridge_present=sysx.link_exists(state.bridge),
            hosts=hosts,
        )

    # ------------------------------------------------------------------ faults

    def _holder_pid(self, h: HostRecord) -> int:
        if h.holder is None or not sysx.is_ours(h.holder):
            raise LaunchError(
                f"the host is not running (its namespace holder is gone); run "
                f"`corral testbed down{self._dir_flag()}` and `up` again",
                host=h.name,
            )
        return h.holder.pid

    def run_on(
        self,
        host: str,
        argv: Sequence[str],
        *,
        timeout: float | None = 30.0,
        cwd: str | None = None,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``host``'s network, UTS and mount namespaces (no ssh).

        The working directory is ``cwd`` or ``/``; the environment is ``env`` or
        ours. Raises CommandTimeout after ``timeout`` seconds.
        """
        pid = self._holder_pid(self._require().host(host))
        cmd = [sysx.tool("nsenter"), f"--target={pid}", "--net", "--uts", "--mount"]
        cmd += [f"--wd={cwd or '/'}", "--", *argv]
        try:
            return subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=timeout,
                input=input,
                env=dict(env) if env is not None else None,
                check=check,
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandTimeout(
                f"timed out after {timeout} s", host=host, command=" ".join(argv)
            ) from exc

    def pids_on(self, host: str, *, include_daemons: bool = False) -> list[int]:
        """PIDs of the processes on ``host`` (its network namespace); without
        ``include_daemons`` the holder and the sshd listener are left out."""
        h = self._require().host(host)
        inodes = {i for i in (sysx.netns_inode(h.netns),) if i is not None}
        pids = sysx.pids_in_netns(inodes)
        if not include_daemons:
            own = {rec.pid for rec in (h.holder, h.sshd) if rec is not None}
            pids = [p for p in pids if p not in own]
        return pids

    def sshd_pid(self, host: str) -> int:
        """The pid of ``host``'s sshd listener (e.g. for :class:`corral.testbed.CpuQuota`:
        every SSH session on the host descends from it). LaunchError when it is not
        running."""
        h = self._require().host(host)
        if h.sshd is None or not sysx.is_ours(h.sshd):
            raise LaunchError(
                "its sshd is not running (Testbed.start_sshd starts it again, or run "
                f"`corral testbed down{self._dir_flag()}` and `up`)",
                host=host,
            )
        return h.sshd.pid

    def cut_link(self, host: str) -> None:
        """Cut ``host`` off the network both ways (its bridge-side veth goes down)."""
        h = self._require().host(host)
        sysx.run([sysx.tool("ip"), "link", "set", h.veth, "down"])

    def restore_link(self, host: str) -> None:
        """Undo :meth:`cut_link`; stale neighbour entries are flushed on both ends so new
        connections do not wait for ARP to recover."""
        state = self._require()
        h = state.host(host)
        ip = sysx.tool("ip")
        sysx.run([ip, "link", "set", h.veth, "up"])
        sysx.run([ip, "neigh", "flush", "to", h.address, "dev", state.bridge], check=False)
        sysx.run([ip, "-n", h.netns, "neigh", "flush", "dev", peer_ifname(h.name)], check=False)

    def kill_sshd(self, host: str) -> None:
        """Stop ``host``'s sshd listener (open sessions live on); new connections are refused."""
        with sysx.locked():
            state = self._require()
            h = state.host(host)
            if h.sshd is not None and sysx.is_ours(h.sshd):
                sysx.terminate([h.sshd.pid])
            h.sshd = None
            self._save(state)

    def start_sshd(self, host: str) -> None:
        """Start ``host``'s sshd again (no-op when running); returns once it answers."""
        with sysx.locked():
            state = self._require()
            h = state.host(host)
            if sysx.is_ours(h.sshd):
                return
            self._holder_pid(h)
            self._wait_sshd(state, {h.name: self._spawn_sshd(h)})

    def repair(self) -> None:
        """Bring a damaged testbed back to healthy (for fault tests): links up and missing
        sshds started; a host whose namespace or holder is gone means down + up again."""
        state = self._require()
        st = self._inspect(state)
        if st.healthy:
            return
        broken = not st.bridge_present or state.phase != "up"
        if broken or any(not h.netns or not h.holder for h in st.hosts):
            self.down()
            self.up(len(state.hosts), subnet=state.subnet, slots=state.slots)
            return
        for h in st.hosts:
            if not h.link_up:
                self.restore_link(h.name)
            if not h.sshd:
                self.start_sshd(h.name)

    def ssh_argv(self, host: str, *command: str) -> list[str]:
        """An OpenSSH client command line for ``host`` (BatchMode, this testbed's config)."""
        return ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", host, *command]


def _write_state(state: TestbedState) -> None:
    """Write ``state`` to its state dir (when that still exists) and its registry."""
    text = state.to_json()
    target = Path(state.state_dir) / "state.json"
    if target.parent.is_dir():
        tmp = target.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(target)
    sysx.RUN_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    registry = registry_path(state.instance)
    reg_tmp = registry.with_suffix(".tmp")
    reg_tmp.write_text(text)
    reg_tmp.replace(registry)


__all__ = ["Testbed", "default_state_dir"]
