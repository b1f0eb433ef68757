"""Check "shared_data" (``--shared-data-path P``, seed 003): P exists on every host
and is the *same* filesystem everywhere.

A marker file written in P from the first host that has it must be seen, with
the same content, by every other host (:mod:`corral.checks.shared_probe`).
Each host's filesystem type, source and free space are reported. A host that
lacks P, or sees another directory there, fails with the command that mounts
the writer's export there (or a shared export, when the writer's P is a local
disk). P on a local filesystem type across several machines warns even when
the marker was seen (it cannot be, unless they are one machine: ``local:N``
nodes, or the netns testbed's hosts, share this one).
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status
from corral.checks.shared_probe import SharedProbe
from corral.cluster.model import Host
from corral.errors import ConfigError

NAME = "shared_data"
OPTION = "--shared-data-path"
LOCAL_TYPES = frozenset(
    {
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "zfs",
        "f2fs",
        "bcachefs",
        "tmpfs",
        "ramfs",
        "overlay",
        "vfat",
        "exfat",
        "ntfs",
        "ntfs3",
        "apfs",
        "hfs",
    }
)
GENERIC_EXPORT = "SERVER:/export"
_GIB = float(1 << 30)


def validate_path(path: str | None) -> str | None:
    """``path`` when it is absolute (or ``~``-relative, each host's home); ConfigError
    otherwise: a relative path would be relative to each host's login directory."""
    if path is None:
        return None
    if not path.strip():
        raise ConfigError("must not be empty", option=OPTION)
    if "\n" in path or "\0" in path:
        raise ConfigError("must not contain a newline or NUL", option=OPTION)
    if not (os.path.isabs(path) or path.startswith("~")):
        raise ConfigError(
            f"{path!r} is relative; give the absolute path every host mounts the data at",
            option=OPTION,
        )
    return path


def fs_label(facts: dict[str, Any]) -> str:
    """``nfs4 srv:/export on /data`` (a bind mount's directory after the source)."""
    fs = facts.get("fs") or {}
    if not fs:
        return "an unknown filesystem"
    root = fs.get("root") or "/"
    source = fs.get("source", "?") + (f":{root}" if root != "/" else "")
    return f"{fs.get('type', '?')} {source} on {fs.get('mount_point', '?')}"


def _fs_type(facts: dict[str, Any]) -> str:
    return str((facts.get("fs") or {}).get("type") or "unknown")


def _space(facts: dict[str, Any]) -> str:
    free = facts.get("free_bytes")
    return f", {free / _GIB:.1f} GiB free" if free is not None else ""


def _identity(facts: dict[str, Any]) -> tuple[Any, ...]:
    fs = facts.get("fs") or {}
    return tuple(fs.get(k) for k in ("type", "source", "root", "mount_point"))


def difference(probe: SharedProbe, host: str, one_machine: bool) -> str:
    """What ``host`` has at the path instead of the writer's filesystem."""
    assert probe.writer is not None
    mine, theirs = probe.facts[host], probe.facts[probe.writer]
    devices = (
        f" (device {mine.get('device')}, {probe.writer}'s {theirs.get('device')})"
        if one_machine and mine.get("device") != theirs.get("device")
        else ""
    )
    if _identity(mine) != _identity(theirs) or devices:
        return f"a different filesystem here{devices}: {fs_label(mine)}"
    return f"another directory here, on {fs_label(mine)} like {probe.writer}'s: a local copy"


def _unseen(probe: SharedProbe, failing: list[str]) -> list[str]:
    """The failing hosts that read no marker where the writer put one."""
    return [
        h
        for h in failing
        if h in probe.reads and not probe.reads[h].get("found") and not probe.reads[h].get("error")
    ]


def _error(probe: SharedProbe, hosts: dict[str, HostCheck], failing: list[str]) -> str | None:
    """One sentence per kind of failure, naming the hosts."""
    missing = [h for h in failing if not probe.facts.get(h, {}).get("exists", True)]
    if missing and len(missing) == len(hosts):
        return f"{probe.path} does not exist on any host"
    parts = [f"{probe.path} does not exist on {', '.join(missing)}"] if missing else []
    unseen = _unseen(probe, failing)
    if unseen:
        verb = "does" if len(unseen) == 1 else "do"
        writer = fs_label(probe.facts[str(probe.writer)])
        parts.append(
            f"{', '.join(unseen)} {verb} not see the marker written in {probe.path} from "
            f"{probe.writer} ({writer})"
        )
    parts += [f"{h}: {hosts[h].detail}" for h in failing if h not in missing and h not in unseen]
    return "; ".join(parts) or None


def _host_result(probe: SharedProbe, name: str, one_machine: bool) -> HostCheck:
    path = probe.path
    if name in probe.stuck:
        return HostCheck(Status.FAIL, f"{probe.stuck[name]}: is {path} on a hung network mount?")
    if name not in probe.facts:  # the other checks say why the host is out of reach
        why = probe.unreachable.get(name, "no answer")
        return HostCheck(Status.SKIP, f"host did not answer: {why}")
    facts = probe.facts[name]
    if not facts.get("exists"):
        return HostCheck(Status.FAIL, f"{path} does not exist")
    if facts.get("error"):
        return HostCheck(Status.FAIL, f"{path}: {facts['error']}")
    where = f"{fs_label(facts)}{_space(facts)}"
    if probe.writer is None:
        why = probe.write_errors.get(name, "another host could not")
        return HostCheck(Status.WARN, f"cannot write a marker ({why}); {where}")
    read = probe.reads.get(name)
    if name == probe.writer and read is None:
        return HostCheck(Status.PASS, f"wrote the marker; {where}")
    if read is None:
        why = probe.unreachable.get(name, "no answer")
        return HostCheck(Status.FAIL, f"no answer to the marker read: {why}")
    if read.get("found") and read.get("content") == probe.content:
        return HostCheck(Status.PASS, f"sees the marker from {probe.writer}; {where}")
    if read.get("found"):
        return HostCheck(Status.FAIL, f"the marker from {probe.writer} has other content here")
    if read.get("error"):
        why = read["error"]
        return HostCheck(Status.FAIL, f"cannot read the marker from {probe.writer}: {why}")
    return HostCheck(
        Status.FAIL,
        f"does not see the marker from {probe.writer}: " + difference(probe, name, one_machine),
    )


def _on(ctx: CheckContext, host: Host, command: str) -> str:
    """``command`` (a shell line) as the user runs it on ``host``."""
    return command if ctx.is_local else ctx.ssh(host, [command])


def _mount_line(fs_type: str, source: str, mount_point: str) -> str:
    point = shlex.quote(mount_point)
    return (
        f"sudo mkdir -p {point} && sudo mount -t {shlex.quote(fs_type)} "
        f"{shlex.quote(source)} {point}"
    )


def fixes(ctx: CheckContext, probe: SharedProbe, failing: list[str], one_machine: bool) -> str:
    """The commands that make ``failing`` hosts see the writer's filesystem at the path."""
    path = probe.path
    writer = probe.facts.get(probe.writer or "", {})
    fs = writer.get("fs") or {}
    by_name = {h.name: h for h in ctx.cluster.hosts}
    if probe.writer is None and one_machine:
        return f"mkdir -p {shlex.quote(path)}"
    if fs and fs.get("type") not in LOCAL_TYPES | {"unknown", None}:
        line = _mount_line(str(fs["type"]), str(fs["source"]), str(fs["mount_point"]))
        return "; ".join(_on(ctx, by_name[h], line) for h in failing)
    line = _mount_line("nfs", GENERIC_EXPORT, path)
    if probe.writer is None:
        intro = f"{path} is on no host yet: "
    elif one_machine:  # the writer's directory is shared with the hosts that see it
        intro = ""
    else:
        intro = f"{path} on {probe.writer} is a local {_fs_type(writer)} disk, not shared: "
    where = failing if probe.writer is None or one_machine else [probe.writer, *failing]
    mounts = "; ".join(_on(ctx, by_name[h], line) for h in where)
    return (
        intro
        + f"mount the shared export ({GENERIC_EXPORT}) at {path} on {', '.join(where)}: {mounts}"
    )


def _local_fs_warnings(
    probe: SharedProbe, hosts: dict[str, HostCheck], one_machine: bool
) -> dict[str, HostCheck]:
    """A passing host on a local filesystem type of a cluster of several machines warns."""
    if one_machine:
        return hosts
    out = dict(hosts)
    for name, result in hosts.items():
        kind = _fs_type(probe.facts.get(name, {}))
        if result.status is Status.PASS and kind in LOCAL_TYPES:
            out[name] = HostCheck(
                Status.WARN,
                f"{probe.path} is on {kind}, a local filesystem, on a cluster of several "
                "machines: the marker should not be visible across them (one machine under "
                "several names?)",
            )
    return out


def _data(probe: SharedProbe) -> dict[str, Any]:
    hosts = {}
    for name, facts in probe.facts.items():
        fs = facts.get("fs") or {}
        read = probe.reads.get(name) or {}
        hosts[name] = {
            "exists": facts.get("exists"),
            "fs_type": fs.get("type"),
            "source": fs.get("source"),
            "mount_point": fs.get("mount_point"),
            "device": facts.get("device"),
            "free_bytes": facts.get("free_bytes"),
            "total_bytes": facts.get("total_bytes"),
            "sees_marker": name == probe.writer or bool(read.get("found")),
        }
    return {"path": probe.path, "marker": probe.marker, "writer": probe.writer, "hosts": hosts}


def check(ctx: CheckContext) -> CheckResult:
    """See the module docstring; skipped without ``--shared-data-path``."""
    probe = ctx.shared_data
    if probe is None:
        early = {h.name: HostCheck(Status.SKIP, "no --shared-data-path") for h in ctx.cluster}
        return CheckResult.from_hosts(NAME, early, summary="no --shared-data-path given")
    one_machine = ctx.is_local or probe.one_machine()
    hosts = {h.name: _host_result(probe, h.name, one_machine) for h in ctx.cluster.hosts}
    hosts = _local_fs_warnings(probe, hosts, one_machine)
    failing = [h for h, r in hosts.items() if r.status is Status.FAIL]
    error = _error(probe, hosts, failing)
    fix = fixes(ctx, probe, failing, one_machine) if failing else None
    warning = None
    if probe.writer is None and not failing:
        fix = None
        warning = (
            f"cannot write a marker in {probe.path} on any host (read-only?): not verified "
            "that the hosts share it"
        )
    if probe.remove_error and probe.writer:
        hosts[probe.writer] = HostCheck(
            Status.WARN, f"could not remove the marker: {probe.remove_error}"
        )
    writer = probe.facts.get(probe.writer or "", {})
    where = "local:N nodes share this machine" if ctx.is_local else "every host sees one marker"
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary=f"{probe.path}: {where} ({fs_label(writer)}{_space(writer)})"
        if writer
        else probe.path,
        error=error,
        warning=warning,
        fix_command=fix,
        data=_data(probe),
    )
