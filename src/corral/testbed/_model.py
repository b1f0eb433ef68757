"""Pure parts of the testbed: names, addresses, the state record and file renderers.

Nothing here touches the system, so it is unit-tested without root.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from corral.errors import ConfigError

HOST_PREFIX = "tb"
"""Host names are ``tb1``, ``tb2``, ... (valid hostnames, short to type)."""
NETNS_PREFIX = "corral-"
"""Network namespace of host ``tbK`` is ``corral-tbK``."""
VETH_PREFIX = "crl-"
"""Root-side veth of host ``tbK`` is ``crl-tbK`` (the peer inside is ``nic-tbK``)."""
BRIDGE = "crlbr0"
"""The bridge in the root namespace that connects every host and the coordinator."""
PEER_PREFIX = "nic-"
"""Host ``tbK``'s interface inside its namespace is ``nic-tbK``: every host's device
has its own name, as on real clusters where NICs are named differently."""
COORDINATOR_NAME = "corral-coordinator"
"""Name under which hosts reach the root namespace (the bridge address)."""
DEFAULT_SUBNET = "10.77.0.0/24"
"""The subnet of instance 0; instance ``I`` has ``10.77.I.0/24`` (:func:`default_subnet`)."""
MAX_INSTANCES = 100
"""Testbeds one machine can have side by side, numbered 0..99 (one per pytest-xdist
worker): each has its own names, subnet, registry and lock (:class:`InstanceNames`)."""
SRV_DIR = "/srv/corral"
"""A directory every host has, empty and private (it lies in the host's private ``/srv``)."""
PRIVATE_DIRS = ("/srv", "/tmp")
"""Directories each host has its own of (besides the login user's home)."""
HOST_FS = "fs"
"""Per-host dir (under ``hosts/<name>``) that backs the private directories at their
own paths: the host's ``/tmp/x`` is ``hosts/<name>/fs/tmp/x`` here."""
MAX_HOSTS = 250
STATE_VERSION = 1
NEIGH_SYSCTLS = {
    "net/ipv4/neigh/default/gc_thresh1": 128,
    "net/ipv4/neigh/default/gc_thresh2": 512,
    "net/ipv4/neigh/default/gc_thresh3": 1024,
}
"""The kernel's IPv4 neighbour (ARP) table limits (under ``/proc/sys``), with their
defaults. The table is one for the whole machine, every network namespace
included: past ``gc_thresh3`` entries no new neighbour is created, so an ARP
request goes unanswered and a connect fails with "No route to host"."""

_UNSAFE_PATH = re.compile(r"[\s\"'%\\#]")


def neighbour_limits(*n_hosts: int) -> dict[str, int]:
    """The neighbour table limits testbeds of ``n_hosts`` hosts each need together
    (the table is the machine's one): the defaults plus each one's full mesh (each
    host resolves every other host and the coordinator, the coordinator every host:
    ``n * (n + 1)`` entries). At 64 hosts that is 4160 entries, past the default hard
    limit of 1024 (issue 23: gloo's full mesh at 64 ranks failed with "No route to
    host")."""
    mesh = sum(n * (n + 1) for n in n_hosts)
    return {name: default + mesh for name, default in NEIGH_SYSCTLS.items()}


def hand_over_sysctls(
    mine: dict[str, list[int]], theirs: dict[str, list[int]], current: dict[str, int]
) -> dict[str, list[int]]:
    """The record (``{name: [before, after]}``) another live testbed takes over when
    one goes down while it stays up: the settings are the machine's, so the one going
    down must not put its ``before`` back under the other's hosts; instead the other
    one's record gets the earliest ``before`` (what the last testbed down restores)
    and the value now set as ``after``. A setting someone else changed since (it
    reads neither testbed's ``after``) keeps the other's record as it is."""
    merged = {name: list(rec) for name, rec in theirs.items()}
    for name, (before, after) in mine.items():
        now = current.get(name)
        other = theirs.get(name)
        if now is None or now not in (after, *(other[1:] if other else ())):
            continue
        merged[name] = [min(before, other[0]) if other else before, now]
    return merged


@dataclass(frozen=True)
class InstanceNames:
    """What testbed instance ``instance`` calls its kernel objects: instance 0 has
    the names of a testbed by hand (``corral-tbK``, ``crl-tbK``, ``crlbr0``,
    10.77.0.0/24), instance ``I`` ``corralI-tbK``, ``crlI-tbK``, ``crlbrI`` and
    10.77.I.0/24, so two testbeds never share a namespace, link, route or lock.
    Host names (``tbK``) are the same in every instance: each host resolves them in
    its own ``/etc/hosts``, the coordinator through the instance's ssh_config."""

    instance: int

    def __post_init__(self) -> None:
        if not 0 <= self.instance < MAX_INSTANCES:
            raise ConfigError(
                f"the testbed instance must be 0 to {MAX_INSTANCES - 1}, not {self.instance}",
                option="--instance",
            )

    @property
    def _tag(self) -> str:
        return "" if self.instance == 0 else str(self.instance)

    @property
    def netns_prefix(self) -> str:
        """Prefix of the instance's namespaces (``corral-``, ``corral1-``, ...)."""
        return NETNS_PREFIX.replace("-", self._tag + "-")

    @property
    def bridge(self) -> str:
        """The instance's bridge (``crlbr0``, ``crlbr1``, ...)."""
        return BRIDGE[:-1] + str(self.instance)

    @property
    def subnet(self) -> str:
        """The instance's default subnet (``10.77.I.0/24``)."""
        net = ipaddress.ip_network(DEFAULT_SUBNET)
        return str(ipaddress.ip_network((int(net.network_address) + (self.instance << 8), 24)))

    def netns(self, host: str) -> str:
        """Network namespace of ``host``."""
        return self.netns_prefix + host

    def veth(self, host: str) -> str:
        """Root-side veth of ``host`` (at most 11 of the kernel's 15 characters)."""
        return VETH_PREFIX.replace("-", self._tag + "-") + host


def default_subnet(instance: int = 0) -> str:
    """The subnet of testbed ``instance`` when none is given."""
    return InstanceNames(instance).subnet


def peer_ifname(host: str) -> str:
    """Name of ``host``'s network interface inside its namespace."""
    return PEER_PREFIX + host


def host_name(index: int) -> str:
    """Name of the ``index``-th host (1-based)."""
    return f"{HOST_PREFIX}{index}"


@dataclass(frozen=True)
class NetworkPlan:
    """Addresses for a testbed: hosts get ``.1 .. .N``, the bridge the last usable address."""

    subnet: ipaddress.IPv4Network
    host_addresses: tuple[str, ...]
    bridge_address: str

    @property
    def prefixlen(self) -> int:
        """The subnet's prefix length (``24`` for a /24)."""
        return self.subnet.prefixlen


def plan_network(subnet: str, n: int) -> NetworkPlan:
    """Check ``subnet`` (a private IPv4 network large enough for ``n`` hosts) and plan it."""
    if n < 1 or n > MAX_HOSTS:
        raise ConfigError(f"the number of hosts must be between 1 and {MAX_HOSTS}, not {n}")
    try:
        net = ipaddress.ip_network(subnet, strict=True)
    except ValueError as exc:
        raise ConfigError(f"not a network address: {subnet!r} ({exc})", option="--subnet") from exc
    if not isinstance(net, ipaddress.IPv4Network):
        raise ConfigError(f"{subnet} is not an IPv4 network", option="--subnet")
    if not net.is_private or net.is_loopback or net.is_link_local:
        raise ConfigError(
            f"{subnet} is not a private network; use one inside 10.0.0.0/8, "
            "172.16.0.0/12 or 192.168.0.0/16 (default 10.77.0.0/24)",
            option="--subnet",
        )
    usable = net.num_addresses - 2
    if usable < n + 1:
        raise ConfigError(
            f"{subnet} has room for {max(usable - 1, 0)} hosts, not {n}", option="--subnet"
        )
    first = int(net.network_address)
    hosts = tuple(str(ipaddress.IPv4Address(first + i)) for i in range(1, n + 1))
    bridge = str(ipaddress.IPv4Address(int(net.broadcast_address) - 1))
    return NetworkPlan(subnet=net, host_addresses=hosts, bridge_address=bridge)


def check_state_dir(path: Path) -> Path:
    """The absolute state dir, refusing characters that ssh/sshd config files cannot hold."""
    path = path.expanduser().absolute()
    if _UNSAFE_PATH.search(str(path)):
        raise ConfigError(
            f"{path}: the state dir path must not contain whitespace, quotes, '%', '#' or "
            "backslashes (it is written into ssh_config and sshd_config)",
            option="--state-dir",
        )
    return path


# --------------------------------------------------------------------------- mounts


@dataclass(frozen=True)
class PrivateDir:
    """A directory the host has its own of: ``source`` (in the state dir) is mounted on
    ``path`` inside the host's mount namespace."""

    path: str
    source: str
    mode: int


@dataclass(frozen=True)
class KeptPath:
    """A coordinator directory hidden by a private directory that must stay visible on
    the host (the state dir with sshd's files, the Python environment): bind-mounted
    on ``mountpoint`` inside the private directory's source before that is mounted."""

    path: str
    mountpoint: str


@dataclass(frozen=True)
class MountPlan:
    """The host's private directories and the paths kept visible through them."""

    private: tuple[PrivateDir, ...]
    kept: tuple[KeptPath, ...]

    def directories(self) -> list[tuple[str, int]]:
        """Directories to create (path, mode) before the holder mounts anything."""
        dirs = [(p.source, p.mode) for p in self.private]
        return dirs + [(k.mountpoint, 0o755) for k in self.kept]

    def locate(self, path: str) -> str | None:
        """Where the host's absolute ``path`` is seen from the coordinator: under the
        source of its private directory, itself inside a kept path; None elsewhere."""
        target = PurePosixPath(path)
        if not target.is_absolute():
            return None
        if any(_within(target, PurePosixPath(k.path)) for k in self.kept):
            return str(target)
        for p in self.private:
            if _within(target, PurePosixPath(p.path)):
                return str(PurePosixPath(p.source) / target.relative_to(p.path))
        return None

    def script(self) -> str:
        """Shell lines (for the holder) that make the mounts: kept paths first, while
        everything is still visible, then each private directory, recursively; the one
        that holds the sources (the state dir under ``/tmp``, say) last, so that no
        source is looked up through a private directory already mounted."""
        lines = [
            f"mount --bind {shlex.quote(k.path)} {shlex.quote(k.mountpoint)}" for k in self.kept
        ]
        last = sorted(
            self.private, key=lambda p: _within(PurePosixPath(p.source), PurePosixPath(p.path))
        )
        lines += [f"mount --rbind {shlex.quote(p.source)} {shlex.quote(p.path)}" for p in last]
        return "".join(line + "\n" for line in lines)


def _within(path: PurePosixPath, top: PurePosixPath) -> bool:
    return path == top or top in path.parents


def plan_mounts(host_dir: Path, home: str, keep: Sequence[str]) -> MountPlan:
    """The private ``/srv``, ``/tmp`` and ``home`` of the host whose files are in
    ``host_dir``, keeping each directory of ``keep`` that they would hide visible.

    ConfigError when ``home`` is not a separate absolute directory, or a kept path
    is a private directory itself (nothing would be private then).
    """
    tops = [PurePosixPath(d) for d in (*PRIVATE_DIRS, home)]
    home_path = tops[-1]
    if not home_path.is_absolute() or any(
        _within(home_path, t) or _within(t, home_path) for t in tops[:-1]
    ):
        raise ConfigError(
            f"the login user's home {home!r} must be an absolute directory outside "
            f"{' and '.join(PRIVATE_DIRS)} for the testbed to give each host its own"
        )
    base = Path(host_dir) / HOST_FS
    private = tuple(
        PrivateDir(
            path=str(t),
            source=str(base / t.relative_to("/")),
            mode=0o1777 if str(t) == "/tmp" else 0o700 if t == home_path else 0o755,
        )
        for t in tops
    )
    wanted = sorted({PurePosixPath(k) for k in keep}, key=lambda p: len(p.parts))
    kept: list[KeptPath] = []
    for path in wanted:
        top = next((t for t in tops if _within(path, t)), None)
        if top is None or any(_within(path, PurePosixPath(k.path)) for k in kept):
            continue
        if path == top:
            raise ConfigError(
                f"{path} is needed on every host, so it cannot be a private directory "
                "of each; move it (state dir, Python environment) elsewhere"
            )
        kept.append(KeptPath(str(path), str(base / path.relative_to("/"))))
    return MountPlan(private=private, kept=tuple(kept))


# --------------------------------------------------------------------------- state


@dataclass(frozen=True)
class ProcessRecord:
    """A process the testbed started, identified beyond its PID.

    ``start_time`` is field 22 of ``/proc/PID/stat`` (clock ticks after boot)
    and ``exe`` the target of ``/proc/PID/exe``: a PID is only ours while both
    still match, so a recycled PID is never killed.
    """

    pid: int
    start_time: int
    exe: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        """Parse the JSON form written by :func:`dataclasses.asdict`."""
        return cls(pid=int(data["pid"]), start_time=int(data["start_time"]), exe=str(data["exe"]))


@dataclass
class HostRecord:
    """Everything created for one host."""

    name: str
    address: str
    netns: str
    veth: str
    netns_inode: int | None = None
    holder: ProcessRecord | None = None
    sshd: ProcessRecord | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostRecord:
        """Parse the JSON form."""
        holder = data.get("holder")
        sshd = data.get("sshd")
        inode = data.get("netns_inode")
        return cls(
            name=str(data["name"]),
            address=str(data["address"]),
            netns=str(data["netns"]),
            veth=str(data["veth"]),
            netns_inode=int(inode) if inode is not None else None,
            holder=ProcessRecord.from_json(holder) if holder else None,
            sshd=ProcessRecord.from_json(sshd) if sshd else None,
        )


@dataclass
class TestbedState:
    """The ``state.json`` of a testbed: exactly what ``up`` created.

    ``phase`` is ``"creating"`` until every host answers, then ``"up"``.
    ``created_paths`` lists directories outside the state dir that ``up``
    created (removed by ``down`` when still empty). ``sysctls`` maps each kernel
    setting ``up`` raised to ``[before, after]`` (``down`` puts ``before`` back
    while the setting still reads ``after``).
    """

    __test__ = False  # not a pytest test class

    state_dir: str
    subnet: str
    bridge: str
    bridge_address: str
    slots: int
    hosts: list[HostRecord]
    phase: str = "creating"
    created_paths: list[str] = field(default_factory=list)
    sysctls: dict[str, list[int]] = field(default_factory=dict)
    version: int = STATE_VERSION
    instance: int = 0

    def to_json(self) -> str:
        """Serialise (stable key order, indented)."""
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> TestbedState:
        """Parse ``state.json``; a ConfigError names what is wrong."""
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            if int(data.get("version", 0)) != STATE_VERSION:
                raise ValueError(f"unsupported version {data.get('version')!r}")
            return cls(
                state_dir=str(data["state_dir"]),
                subnet=str(data["subnet"]),
                bridge=str(data["bridge"]),
                bridge_address=str(data["bridge_address"]),
                slots=int(data["slots"]),
                hosts=[HostRecord.from_json(h) for h in data["hosts"]],
                phase=str(data.get("phase", "creating")),
                created_paths=[str(p) for p in data.get("created_paths", [])],
                sysctls={
                    str(k): [int(v[0]), int(v[1])] for k, v in data.get("sysctls", {}).items()
                },
                instance=InstanceNames(int(data.get("instance", 0))).instance,
            )
        except (ValueError, KeyError, TypeError, AttributeError, ConfigError) as exc:
            raise ConfigError(f"unreadable testbed state: {exc}") from exc

    def host(self, name: str) -> HostRecord:
        """The record of host ``name``; ConfigError naming the hosts if absent."""
        for h in self.hosts:
            if h.name == name:
                return h
        known = ", ".join(h.name for h in self.hosts) or "none"
        raise ConfigError(f"no testbed host {name!r} (hosts: {known})")


def new_state(state_dir: Path, plan: NetworkPlan, slots: int, instance: int = 0) -> TestbedState:
    """The initial record for a testbed (of ``instance``) about to be created."""
    names = InstanceNames(instance)
    hosts = [
        HostRecord(
            name=host_name(i),
            address=addr,
            netns=names.netns(host_name(i)),
            veth=names.veth(host_name(i)),
        )
        for i, addr in enumerate(plan.host_addresses, start=1)
    ]
    return TestbedState(
        state_dir=str(state_dir),
        subnet=str(plan.subnet),
        bridge=names.bridge,
        bridge_address=plan.bridge_address,
        slots=slots,
        hosts=hosts,
        instance=instance,
    )


# --------------------------------------------------------------------------- renderers


def render_etc_hosts(hosts: Sequence[HostRecord], bridge_address: str) -> str:
    """The ``/etc/hosts`` every host sees: localhost, every testbed host, the coordinator."""
    lines = [
        "# corral testbed (generated)",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        *(f"{h.address}\t{h.name}" for h in hosts),
        f"{bridge_address}\t{COORDINATOR_NAME}",
    ]
    return "\n".join(lines) + "\n"


def render_hostfile(hosts: Sequence[HostRecord], slots: int) -> str:
    """The hostfile for ``corral run --hosts``: one line per host, by name."""
    return "".join(f"{h.name} slots={slots}\n" for h in hosts)


def render_ssh_config(hosts: Sequence[HostRecord], identity_file: Path, known_hosts: Path) -> str:
    """Client config: a ``Host`` entry per host name mapping it to its address."""
    blocks = ["# corral testbed (generated); use: ssh -F THIS_FILE tb1\n"]
    for h in hosts:
        blocks.append(
            f"Host {h.name}\n"
            f"    HostName {h.address}\n"
            "    User root\n"
            "    Port 22\n"
            f"    IdentityFile {identity_file}\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {known_hosts}\n"
            "    GlobalKnownHostsFile /dev/null\n"
            "    StrictHostKeyChecking yes\n"
            "    ConnectTimeout 5\n"
        )
    return "\n".join(blocks)


def render_known_hosts(entries: Sequence[tuple[HostRecord, str]]) -> str:
    """``known_hosts`` lines, each host key recorded under both name and address."""
    return "".join(f"{h.name},{h.address} {key.strip()}\n" for h, key in entries)


def render_sshd_config(
    host: HostRecord, *, host_key: Path, pid_file: Path, authorized_keys: Path
) -> str:
    """sshd_config for one host: key-only root login, forwarded variables accepted."""
    return (
        f"# corral testbed host {host.name} (generated)\n"
        f"ListenAddress {host.address}:22\n"
        f"HostKey {host_key}\n"
        f"PidFile {pid_file}\n"
        f"AuthorizedKeysFile {authorized_keys}\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "AcceptEnv *\n"
        "UseDNS no\n"
        "PrintMotd no\n"
        "PrintLastLog no\n"
        "X11Forwarding no\n"
        "MaxSessions 256\n"
        "MaxStartups 256:30:512\n"
        "ClientAliveInterval 5\n"
        "ClientAliveCountMax 3\n"
        "Subsystem sftp internal-sftp\n"
        "LogLevel INFO\n"
    )
