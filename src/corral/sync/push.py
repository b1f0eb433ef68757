"""Push a code tree to every host with rsync over SSH, all hosts in parallel.

The file list is exactly the tree of :mod:`corral.agent.fingerprint` (the same
walk the code-consistency check hashes on each host: ``.gitignore`` and
``.corralignore`` honoured), handed to rsync with ``--files-from`` and ``-a``
semantics. One rsync per host runs at once (up to ``fanout``), each over the
ssh command of :mod:`corral.sync.sshargs`; the destination directory is
created when missing. With ``delete`` a small helper shipped to the host
(:mod:`corral.sync.prune`) then removes what the tree no longer has, leaving
files the host's ignore rules exclude alone.

Every successful host is recorded in the sync state file
(:mod:`corral.sync.state`) with the tree's digest, for the pre-flight check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from corral.agent import fingerprint
from corral.cluster.model import Cluster, Host
from corral.defaults import DEFAULT_CONNECT_TIMEOUT
from corral.errors import ConfigError
from corral.remote import python as remote_python
from corral.sync.hashcache import cached_manifest, changed_since, snapshot
from corral.sync.procs import KILL_GRACE, communicate, drain, gather_all, kill_group, spawn
from corral.sync.rsync_output import OUT_FORMAT, RsyncProgress, RsyncReader, exit_meaning
from corral.sync.script import ScriptResult
from corral.sync.sshargs import (
    Resolved,
    askpass_env,
    builtin_algorithms,
    has_hw_aes,
    remote_target,
    resolve_host,
    rsh_command,
    ssh_argv,
    tuning_options,
    write_askpass,
)
from corral.sync.state import SyncRecord, record_syncs
from corral.transport.options import SshOptions

__all__ = [
    "DEFAULT_FANOUT",
    "HostSync",
    "SyncListener",
    "SyncReport",
    "classify_failure",
    "mkdir_rsync_path",
    "normalize_dest",
    "prune_command",
    "rsync_argv",
    "summary_line",
    "sync_tree",
]

DEFAULT_FANOUT = 32
PRUNE_MODULES = ("corral.agent.fingerprint", "corral.sync.prune")
STDERR_KEEP = 64 * 1024
ERROR_LINES = 3
PROGRESS_INTERVAL = 0.1  # seconds between progress callbacks per host
_READ = 64 * 1024

# (pattern in ssh's stderr, cause) for a host ssh could not get into
_SSH_CAUSES = (
    ("remote host identification has changed", "host key mismatch"),
    ("host key verification failed", "unknown host key"),
    ("permission denied (publickey", "auth failed"),
    ("permission denied (password", "auth failed"),
    ("permission denied (keyboard-interactive", "auth failed"),
    ("permission denied (gssapi", "auth failed"),
    ("permission denied (hostbased", "auth failed"),
    ("too many authentication failures", "auth failed"),
    ("connection refused", "connection refused"),
    ("connection timed out", "timeout"),
    ("operation timed out", "timeout"),
    ("no route to host", "unreachable"),
    ("network is unreachable", "unreachable"),
    ("could not resolve hostname", "DNS lookup failed"),
    ("name or service not known", "DNS lookup failed"),
    ("kex_exchange_identification", "connection lost"),
    ("connection reset by", "connection lost"),
    ("connection closed by", "connection lost"),
)
_SSH_EXITS = (255, 12, 10, 14, 5)
_NOISE = (
    "rsync error:",
    "rsync: connection unexpectedly closed",
    "rsync: [sender] write error: broken pipe",
    "warning: permanently added",
    "pseudo-terminal will not be allocated",
)


# --------------------------------------------------------------------------- results


@dataclass
class HostSync:
    """How the sync went on one host."""

    host: str
    ok: bool
    files_transferred: int = 0
    bytes_transferred: int = 0  # size of the files (re)sent
    bytes_sent: int = 0  # bytes written to the connection
    deleted: int = 0
    seconds: float = 0.0
    exit_code: int | None = None
    error: str | None = None  # one line naming what went wrong (without the host)
    cause: str | None = None  # short cause for unreachable hosts ("connection refused", ...)
    unreachable: bool = False
    changed: list[str] = field(default_factory=list, repr=False)  # names sent (capped)
    stderr_tail: list[str] = field(default_factory=list, repr=False)

    @property
    def status(self) -> str:
        """``ok``, ``unreachable`` or ``failed``."""
        return "ok" if self.ok else "unreachable" if self.unreachable else "failed"

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "host": self.host,
            "status": self.status,
            "ok": self.ok,
            "files_transferred": self.files_transferred,
            "bytes_transferred": self.bytes_transferred,
            "bytes_sent": self.bytes_sent,
            "deleted": self.deleted,
            "seconds": round(self.seconds, 3),
            "exit_code": self.exit_code,
            "error": self.error,
            "cause": self.cause,
            "stderr_tail": self.stderr_tail,
        }


@dataclass
class SyncReport:
    """The whole sync: the tree, and one :class:`HostSync` per host in cluster order."""

    src: str
    dest: str
    files: int = 0
    size: int = 0
    digest: str | None = None
    hosts: list[HostSync] = field(default_factory=list)
    local: bool = False  # local:N cluster: nothing to push
    script: ScriptResult | None = None
    warnings: list[str] = field(default_factory=list)
    recorded: bool = False  # the state file was updated
    seconds: float = 0.0
    delete: bool = False

    @property
    def ok(self) -> bool:
        """Every host synced and the sync script (if any) did not block."""
        blocked = self.script is not None and self.script.blocks
        return not blocked and all(h.ok for h in self.hosts)

    @property
    def exit_code(self) -> int:
        """0 all synced; 2 a host was unreachable; 1 a host (or the script) failed."""
        if self.ok:
            return 0
        return 2 if any(h.unreachable for h in self.hosts) else 1

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document."""
        return {
            "src": self.src,
            "dest": self.dest,
            "files": self.files,
            "size": self.size,
            "digest": self.digest,
            "local": self.local,
            "delete": self.delete,
            "ok": self.ok,
            "succeeded": sum(h.ok for h in self.hosts),
            "total": len(self.hosts),
            "seconds": round(self.seconds, 3),
            "recorded": self.recorded,
            "warnings": self.warnings,
            "script": self.script.to_json() if self.script is not None else None,
            "hosts": [h.to_json() for h in self.hosts],
        }


class SyncListener(Protocol):
    """Live progress of a sync (the CLI draws it)."""

    def started(self, host: str) -> None:
        """rsync for ``host`` is starting."""

    def progress(self, host: str, progress: RsyncProgress, phase: str) -> None:
        """``phase`` is ``syncing`` or ``deleting``; called at most every 0.1 s per host."""

    def finished(self, result: HostSync) -> None:
        """``host`` is done (or failed)."""


# --------------------------------------------------------------------------- command lines


def normalize_dest(dest: str | None, src: str) -> str:
    """The destination on the hosts: ``dest`` as given (absolute, ``~/...`` or
    relative to the remote home), default the same absolute path as ``src``."""
    if dest is None or dest == "":
        return src
    if "\0" in dest or "\n" in dest:
        raise ConfigError("invalid destination: no NUL or newline allowed", option="--dest")
    if dest != "/" and dest.endswith("/"):
        dest = dest.rstrip("/") or "/"
    return dest


def _shell_path(path: str) -> str:
    """``path`` for the remote shell, a leading ``~/`` left to expand."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote("./" + path if path.startswith("-") else path)


def mkdir_rsync_path(dest: str, rsync: str = "rsync") -> str:
    """``--rsync-path``: create the destination, then run the host's rsync."""
    return f"mkdir -p {_shell_path(dest)} && {rsync}"


def rsync_argv(
    *,
    src: str,
    dest: str,
    target: str,
    ssh: Sequence[str],
    files_from: str,
    compress: bool = False,
    checksum: bool = False,
    rsync: str = "rsync",
    remote_rsync: str = "rsync",
) -> list[str]:
    """The rsync command that pushes the listed files of ``src`` to ``target:dest``."""
    argv = [
        rsync,
        "-a",
        "--from0",
        f"--files-from={files_from}",
        "--info=progress2",
        "--stats",
        f"--out-format={OUT_FORMAT}",
        # mtimes to the nanosecond: a same-size edit on a host within the same second
        # as the original must not pass rsync's quick check
        "--modify-window=-1",
    ]
    if compress:
        argv.append("-z")
    if checksum:
        argv.append("--checksum")
    argv += [
        f"--rsync-path={mkdir_rsync_path(dest, remote_rsync)}",
        "-e",
        rsh_command(ssh),
        "--",
        src.rstrip("/") + "/",
        f"{remote_target(target)}:{dest.rstrip('/') + '/' if dest != '/' else '/'}",
    ]
    return argv


def classify_failure(code: int | None, stderr: str) -> tuple[bool, str | None, str]:
    """(unreachable, cause, message) for a failed rsync from its exit code and stderr."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.lower().startswith(_NOISE)]
    shown = useful[-ERROR_LINES:] or lines[-ERROR_LINES:]
    text = stderr.lower()
    cause = None
    # ssh's own failure is 255, but when rsync hits the closed pipe first it reports
    # a protocol (12), socket (10) or IPC (14) error instead
    if code in _SSH_EXITS:
        cause = next((c for pattern, c in _SSH_CAUSES if pattern in text), None)
    if cause is not None:
        ssh_lines = [ln for ln in useful if not ln.lower().startswith("rsync")]
        detail = " | ".join(ssh_lines[-ERROR_LINES:] or shown)
        return True, cause, f"cannot connect: {detail}"
    if code == 127 or (code in (12, 14) and "command not found" in text):
        detail = " | ".join(shown)
        return False, None, f"rsync not found on the host (install rsync there): {detail}"
    detail = " | ".join(shown) if shown else "no error output"
    return False, None, f"rsync exited with {code} ({exit_meaning(code)}): {detail}"


def prune_command(dest: str, python: str | None) -> tuple[str, bytes]:
    """The remote shell command that runs :func:`corral.sync.prune.main` on a host,
    and what must go first on its stdin (the helper program; the keep list follows)."""
    text = remote_python.program(PRUNE_MODULES, "corral.sync.prune:main", dest)
    command = remote_python.shell_command(python, "corral.sync.prune:main")
    return command, remote_python.stdin_payload(text)


# --------------------------------------------------------------------------- running


@dataclass
class _Job:
    """What every host's task shares."""

    src: str
    dest: str
    options: SshOptions
    files_from: str
    keep: bytes  # NUL-separated file list (for --delete)
    env: dict[str, str]
    password: bool
    delete: bool
    compress: bool
    checksum: bool
    connect_timeout: float | None
    python: str | None
    rsync: str
    ssh: str
    listener: SyncListener | None
    builtin: dict[str, str] = field(default_factory=dict)  # OpenSSH's built-in algorithms
    hw_aes: bool = True


async def _collect(stream: asyncio.StreamReader | None, keep: int) -> bytes:
    """Read a stream to EOF, keeping its last ``keep`` bytes."""
    data = b""
    if stream is None:
        return data
    while chunk := await stream.read(_READ):
        data = (data + chunk)[-keep:]
    return data


async def _run_rsync(job: _Job, host: Host, argv: list[str]) -> tuple[int, RsyncProgress, str]:
    proc = await spawn(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=job.env,  # own session: Ctrl-C is ours to handle, and askpass is used
    )
    reader = RsyncReader()
    errors = asyncio.ensure_future(_collect(proc.stderr, STDERR_KEEP))
    try:
        assert proc.stdout is not None
        last = 0.0
        while chunk := await proc.stdout.read(_READ):
            if reader.feed(chunk) and job.listener is not None:
                now = time.monotonic()
                if now - last >= PROGRESS_INTERVAL:
                    last = now
                    job.listener.progress(host.name, reader.progress, "syncing")
        reader.close()
        stderr = await errors
        code = await proc.wait()
    except BaseException:
        await kill_group(proc)
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(errors), KILL_GRACE)
        await drain(proc, stderr=False)
        raise
    if job.listener is not None:
        job.listener.progress(host.name, reader.progress, "syncing")
    return code, reader.progress, stderr.decode(errors="replace")


async def _run_prune(
    job: _Job, host: Host, ssh: list[str], target: str
) -> tuple[int, dict[str, Any], str]:
    command, program = prune_command(job.dest, job.python)
    code, out, err = await communicate(*ssh, target, command, input=program + job.keep, env=job.env)
    report: dict[str, Any] = {}
    for line in reversed(out.decode(errors="replace").splitlines()):
        with contextlib.suppress(ValueError):
            parsed = json.loads(line)
            if isinstance(parsed, dict):
                report = parsed
                break
    return code, report, err.decode(errors="replace")


async def _sync_host(job: _Job, host: Host, resolved: Resolved) -> HostSync:
    started = time.monotonic()
    timeout = job.connect_timeout
    if timeout is None and not resolved.config_timeout:
        timeout = DEFAULT_CONNECT_TIMEOUT
    ssh = ssh_argv(
        job.options,
        host,
        connect_timeout=timeout,
        password=job.password,
        tuning=tuning_options(resolved, job.builtin, hw_aes=job.hw_aes),
        ssh=job.ssh,
    )
    argv = rsync_argv(
        src=job.src,
        dest=job.dest,
        target=resolved.target,
        ssh=ssh,
        files_from=job.files_from,
        compress=job.compress,
        checksum=job.checksum,
        rsync=job.rsync,
    )
    if job.listener is not None:
        job.listener.started(host.name)
    code, progress, stderr = await _run_rsync(job, host, argv)
    result = HostSync(
        host=host.name,
        ok=code == 0,
        files_transferred=progress.files_transferred,
        bytes_transferred=progress.bytes_transferred,
        bytes_sent=progress.bytes_sent,
        exit_code=code,
        changed=list(progress.changed),
    )
    if code != 0:
        result.unreachable, result.cause, result.error = classify_failure(code, stderr)
        result.stderr_tail = stderr.strip().splitlines()[-20:]
    elif job.delete:
        if job.listener is not None:
            job.listener.progress(host.name, progress, "deleting")
        pcode, report, perr = await _run_prune(job, host, ssh, resolved.target)
        deleted = report.get("deleted")
        result.deleted = len(deleted) if isinstance(deleted, list) else 0
        if pcode != 0 or "error" in report or not report:
            result.ok = False
            result.exit_code = pcode
            why = report.get("error") or " | ".join(perr.strip().splitlines()[-ERROR_LINES:])
            result.error = f"--delete failed on the host (exit {pcode}): {why or 'no output'}"
            result.stderr_tail = perr.strip().splitlines()[-20:]
        elif report.get("errors"):
            errs = report["errors"]
            result.ok = False
            first = ", ".join(f"{p}: {e}" for p, e in list(errs.items())[:ERROR_LINES])
            result.error = f"--delete could not remove {len(errs)} path(s): {first}"
    result.seconds = time.monotonic() - started
    if job.listener is not None:
        job.listener.finished(result)
    return result


def _keep_list(files: Sequence[str]) -> bytes:
    return b"".join(os.fsencode(f) + b"\0" for f in files)


async def sync_tree(
    cluster: Cluster,
    src: str | os.PathLike[str],
    dest: str | None,
    ssh_options: SshOptions,
    *,
    delete: bool = False,
    compress: bool = False,
    checksum: bool = False,
    fanout: int = DEFAULT_FANOUT,
    connect_timeout: float | None = None,
    python: str | None = None,
    listener: SyncListener | None = None,
    record: bool = True,
    state_file: Path | None = None,
    hash_cache: bool = True,
    rsync: str = "rsync",
    ssh: str = "ssh",
) -> SyncReport:
    """Push the code tree ``src`` to ``dest`` on every host of ``cluster``.

    ``dest`` None means the same absolute path as ``src``. Raises ConfigError for
    bad input (missing source, no rsync here, bad ssh config, unset password
    variable); a host that fails is reported in its :class:`HostSync`, never
    raised, and the other hosts still sync. ``local:N`` clusters share this
    machine's filesystem: nothing is pushed (``report.local``). The tree's digest
    is computed while rsync runs (``hash_cache``: reuse hashes of unchanged files,
    see :mod:`corral.sync.hashcache`); it is recorded for every host that synced
    unless a file changed meanwhile.
    """
    started = time.monotonic()
    root = os.path.abspath(os.path.expanduser(os.fspath(src)))
    if not os.path.isdir(root):
        raise ConfigError(f"source directory {os.fspath(src)!r} not found", option="SRC")
    target_dir = normalize_dest(dest, root)
    report = SyncReport(src=root, dest=target_dir, delete=delete)
    if cluster.is_local:
        report.local = True
        report.seconds = time.monotonic() - started
        return report
    if any(h.local for h in cluster.hosts):
        raise ConfigError("a cluster cannot mix local:N nodes and SSH hosts", option="--hosts")
    if delete and target_dir in ("/", "~", "~/", "."):
        raise ConfigError(f"refusing --delete into {target_dir!r}", option="--dest")
    if fanout < 1:
        raise ConfigError(f"invalid fanout {fanout}: expected at least 1", option="--fanout")
    rsync_path = shutil.which(rsync)
    if rsync_path is None:
        raise ConfigError(f"{rsync!r} not found here: install rsync (apt-get install rsync)")
    password = ssh_options.password()  # ConfigError when the variable is unset

    files, walk_errors, truncated = await asyncio.to_thread(fingerprint.walk, root)
    if truncated:
        raise ConfigError(
            f"{root} has more than {fingerprint.MAX_FILES:,} files: exclude data and build "
            "outputs with .gitignore or .corralignore",
            option="SRC",
        )
    for rel, why in walk_errors.items():
        report.warnings.append(f"cannot read {rel}: {why} (left out)")
    report.files = len(files)
    stamps = await asyncio.to_thread(snapshot, root, files)  # before anything is sent
    hashing = asyncio.ensure_future(
        asyncio.to_thread(cached_manifest, root, files, use_cache=hash_cache)
    )
    try:
        hosts = list(cluster.hosts)
        builtin = await builtin_algorithms(ssh=ssh)
        resolved = await gather_all(*(resolve_host(ssh_options, h, ssh=ssh) for h in hosts))
        with tempfile.TemporaryDirectory(prefix="corral-sync-") as tmp:
            files_from = Path(tmp) / "files"
            keep = _keep_list(files)
            files_from.write_bytes(keep)
            env = dict(os.environ)
            if password is not None:
                assert ssh_options.password_env is not None
                env = askpass_env(write_askpass(Path(tmp), ssh_options.password_env), env)
            job = _Job(
                src=root,
                dest=target_dir,
                options=ssh_options,
                files_from=str(files_from),
                keep=keep,
                env=env,
                password=password is not None,
                delete=delete,
                compress=compress,
                checksum=checksum,
                connect_timeout=connect_timeout,
                python=python,
                rsync=rsync_path,
                ssh=ssh,
                listener=listener,
                builtin=builtin,
                hw_aes=has_hw_aes(),
            )
            limit = asyncio.Semaphore(fanout)

            async def one(host: Host, res: Resolved) -> HostSync:
                async with limit:
                    return await _sync_host(job, host, res)

            report.hosts = await gather_all(
                *(one(h, r) for h, r in zip(hosts, resolved, strict=True))
            )
        manifest = await hashing
    except BaseException:
        hashing.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await hashing
        raise
    moved = await asyncio.to_thread(changed_since, root, stamps)
    report.size = manifest.size
    report.digest = manifest.digest
    if moved or manifest.errors:
        names = sorted({*moved, *manifest.errors})
        shown = ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")
        report.warnings.append(
            f"files changed while they were synced or could not be read ({shown}): the sync "
            "is not recorded; run corral sync again"
        )
    elif record:
        now = time.time()
        records = [
            SyncRecord(
                host=h.host,
                dest=target_dir,
                digest=manifest.digest,
                src=root,
                time=now,
                files=len(files),
            )
            for h in report.hosts
            if h.ok
        ]
        if records:
            try:
                record_syncs(records, path=state_file, manifest=manifest.files)
                report.recorded = True
            except OSError as exc:
                report.warnings.append(f"cannot write the sync state file: {exc}")
    report.seconds = time.monotonic() - started
    return report


def summary_line(report: SyncReport) -> str:
    """``3/3 hosts synced ...`` in one line."""
    ok = sum(h.ok for h in report.hosts)
    size = report.size / 1e6
    return (
        f"{ok}/{len(report.hosts)} hosts synced {report.src} ({report.files:,} files, "
        f"{size:.1f} MB) to {report.dest} in {report.seconds:.1f} s"
    )
