"""Host key policy of the SSH transport: OpenSSH's ``known_hosts`` rules.

* A host whose key is listed is accepted.
* A host with **no** entry is *unknown*: refused with the command that records
  its key, unless ``accept_new`` is set (OpenSSH ``StrictHostKeyChecking
  accept-new``), in which case the key is appended to the first known_hosts
  file and accepted.
* A host listed with a **different** key is refused, always: that is either a
  reinstalled host or a man-in-the-middle, and only the user can tell which.

The policy is consulted by asyncssh (``validate_host_public_key``) only for a
key that is *not* already trusted, and it records why it said no so the
transport can report ``unknown host key`` and ``host key mismatch`` apart.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import asyncssh

DEFAULT_PORT = 22

#: Read (never written) when the ssh config names no known_hosts files, as OpenSSH does.
GLOBAL_KNOWN_HOSTS = (Path("/etc/ssh/ssh_known_hosts"), Path("/etc/ssh/ssh_known_hosts2"))


def default_known_hosts() -> Path:
    """``~/.ssh/known_hosts``, OpenSSH's default user file."""
    return Path("~", ".ssh", "known_hosts").expanduser()


def host_pattern(host: str, port: int | None) -> str:
    """How OpenSSH names a host in known_hosts: ``host`` or ``[host]:port``."""
    if port is None or port == DEFAULT_PORT:
        return host
    return f"[{host}]:{port}"


def keyscan_command(host: str, port: int | None, known_hosts: Path | str) -> str:
    """The shell command that records ``host``'s current key (run it only if you trust it)."""
    port_flag = f"-p {port} " if port is not None and port != DEFAULT_PORT else ""
    return f"ssh-keyscan {port_flag}{shlex.quote(host)} >> {shlex.quote(str(known_hosts))}"


def keygen_remove_command(host: str, port: int | None, known_hosts: Path | str) -> str:
    """The shell command that forgets ``host``'s recorded key (``ssh-keygen -R``)."""
    pattern = shlex.quote(host_pattern(host, port))
    return f"ssh-keygen -R {pattern} -f {shlex.quote(str(known_hosts))}"


class HostKeyVerdict(Enum):
    """Why a host key was refused (or that a new key was recorded)."""

    UNKNOWN = "unknown host key"
    MISMATCH = "host key mismatch"
    RECORDED = "recorded new host key"


@dataclass
class HostKeyDecision:
    """What the policy decided for one connection attempt."""

    verdict: HostKeyVerdict | None = None
    lookup_host: str = ""
    port: int | None = None
    fingerprint: str = ""


class KnownHostsPolicy:
    """Known-hosts files plus the accept-new switch, shared by all connections.

    ``files`` are read in order (all of them are trusted); new keys go into the
    first one. ``files=None`` disables verification; the transport uses it only
    with ``--insecure-no-host-key-check`` (see :mod:`corral.transport.ssh.config`).
    """

    def __init__(self, files: Sequence[Path] | None, *, accept_new: bool = False) -> None:
        self.files: list[Path] | None = None if files is None else list(files)
        self.accept_new = accept_new
        self._known: asyncssh.SSHKnownHosts | None = None

    @property
    def enabled(self) -> bool:
        """False when host key checking is turned off by the user's ssh config."""
        return self.files is not None

    @property
    def primary(self) -> Path:
        """The file new keys are written to and that fix commands name."""
        return self.files[0] if self.files else default_known_hosts()

    def known_hosts(self) -> asyncssh.SSHKnownHosts:
        """All entries of the existing files, loaded once (missing files are empty)."""
        if self._known is None:
            known = asyncssh.SSHKnownHosts()
            for path in self.files or ():
                try:
                    text = path.read_text(encoding="utf-8", errors="replace")
                except FileNotFoundError:
                    continue
                known.load(text)
            self._known = known
        return self._known

    def listed(self, host: str, addr: str, port: int | None) -> bool:
        """Whether any key or CA for ``host`` (or its address) is listed."""
        match: Any = self.known_hosts().match(host, addr, _lookup_port(port))
        trusted_keys, trusted_cas = match[0], match[1]
        return bool(trusted_keys) or bool(trusted_cas)

    def decide(
        self, decision: HostKeyDecision, host: str, addr: str, port: int | None, key: Any
    ) -> bool:
        """Judge a key that is not in known_hosts; fills ``decision``; True to accept."""
        decision.lookup_host = host
        decision.port = port
        decision.fingerprint = str(key.get_fingerprint())
        if self.listed(host, addr, port):
            decision.verdict = HostKeyVerdict.MISMATCH
            return False
        if not self.accept_new:
            decision.verdict = HostKeyVerdict.UNKNOWN
            return False
        self.record(host, port, key)
        decision.verdict = HostKeyVerdict.RECORDED
        return True

    def record(self, host: str, port: int | None, key: Any) -> None:
        """Append ``host``'s key to the primary known_hosts file (created 0600 if needed)."""
        line = f"{host_pattern(host, port)} {key.export_public_key('openssh').decode().strip()}\n"
        path = self.primary
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        needs_newline = path.exists() and path.stat().st_size > 0 and not _ends_with_newline(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(("\n" if needs_newline else "") + line)
        self.known_hosts().load(line)


def _lookup_port(port: int | None) -> int | None:
    return None if port is None or port == DEFAULT_PORT else port


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def known_hosts_files(config_value: object) -> list[Path] | None:
    """The known_hosts files an asyncssh ``known_hosts`` option names.

    asyncssh turns the ssh config's ``UserKnownHostsFile`` (+ global files) into
    a list of paths; an empty list means "not configured" (use the default file)
    and ``None`` means ``UserKnownHostsFile none`` (which the transport refuses
    unless told otherwise: :func:`corral.transport.ssh.config.host_key_files`).
    """
    if config_value is None:
        return None
    if isinstance(config_value, str | os.PathLike):
        values: list[object] = [config_value]
    elif isinstance(config_value, list | tuple):
        values = list(config_value)
    else:
        values = []
    paths = [Path(os.fspath(v)).expanduser() for v in values if isinstance(v, str | os.PathLike)]
    return paths or [default_known_hosts(), *GLOBAL_KNOWN_HOSTS]
