"""The user's OpenSSH client config: which files, and what they say about host keys.

asyncssh reads Host aliases, HostName, User, Port, IdentityFile, ProxyJump,
UserKnownHostsFile and ConnectTimeout itself. Settings that would turn host
key checking off (``UserKnownHostsFile none`` or ``/dev/null``,
``StrictHostKeyChecking no``) are not obeyed silently: corral always verifies
host keys, so such a config is refused with the options that say what to do
instead (:func:`host_key_files`).
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from asyncssh.config import SSHClientConfig, SSHConfig

from corral.errors import ConfigError, ConnectError
from corral.transport.ssh.known_hosts import (
    GLOBAL_KNOWN_HOSTS,
    default_known_hosts,
    known_hosts_files,
)

__all__ = [
    "ACCEPT_NEW_OPTION",
    "INSECURE_OPTION",
    "Target",
    "config_file_name",
    "config_paths",
    "disabling_settings",
    "host_key_files",
    "strict_host_key_checking",
]

#: The CLI option that accepts (and records) unknown host keys.
ACCEPT_NEW_OPTION = "--accept-new-host-keys"
#: The CLI option that turns host key verification off altogether.
INSECURE_OPTION = "--insecure-no-host-key-check"


@dataclass(frozen=True)
class Target:
    """Where a host alias resolved to (for messages)."""

    host: str
    port: int
    user: str

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def _default_config() -> Path:
    return Path("~", ".ssh", "config").expanduser()


def config_paths(config: str | None) -> list[str] | tuple[()]:
    """The config files to read: only ``--ssh-config FILE`` when given (like ``ssh -F``),
    else ``()`` (asyncssh then reads ``~/.ssh/config`` if it exists)."""
    if config is None:
        return ()
    path = Path(config).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"ssh config {config!r} not found: expected an OpenSSH client config file",
            option="--ssh-config",
        )
    return [str(path)]


def _readable(paths: Sequence[str]) -> list[str]:
    if paths:
        return list(paths)
    default = _default_config()
    return [str(default)] if os.access(default, os.R_OK) else []


def config_file_name(paths: Sequence[str]) -> str:
    """The config file to name in messages."""
    files = _readable(paths)
    return files[0] if files else str(_default_config())


class _HostKeyConfig(SSHClientConfig):
    """asyncssh's client config parser, also keeping ``StrictHostKeyChecking``."""

    _handlers = {  # noqa: RUF012 - same (class-level) table as asyncssh's own
        **SSHClientConfig._handlers,
        "stricthostkeychecking": ("StrictHostKeyChecking", SSHConfig._set_string),
    }


def strict_host_key_checking(
    paths: Sequence[str], host: str, *, user: str | None = None, port: int | None = None
) -> str | None:
    """The ``StrictHostKeyChecking`` value the config gives ``host`` (asyncssh ignores it).

    Raises ValueError/OSError like asyncssh's own parse of the same files.
    """
    files = _readable(paths)
    if not files:
        return None
    try:
        local_user = getpass.getuser()
    except KeyError:  # no user name in the environment: asyncssh refuses it first
        return None
    config = _HostKeyConfig.load(
        None,
        files,
        False,
        False,
        False,
        local_user,
        user if user else (),
        host,
        port if port else (),
    )
    value = config.get("StrictHostKeyChecking")
    return value if isinstance(value, str) else None


def _is_devnull(path: object) -> bool:
    return isinstance(path, str | os.PathLike) and Path(os.fspath(path)).expanduser() == Path(
        os.devnull
    )


def disabling_settings(user_known_hosts: object, strict: str | None) -> list[str]:
    """The config settings, as written, that would turn host key checking off.

    ``user_known_hosts`` is asyncssh's parsed ``UserKnownHostsFile`` (None when
    unset, ``[]`` for ``none``); ``strict`` is ``StrictHostKeyChecking``.
    """
    found: list[str] = []
    if isinstance(user_known_hosts, list | tuple):
        if not user_known_hosts:
            found.append("UserKnownHostsFile none")
        elif all(_is_devnull(value) for value in user_known_hosts):
            found.append("UserKnownHostsFile " + " ".join(map(str, user_known_hosts)))
    if strict is not None and strict.lower() in ("no", "off", "false"):
        found.append(f"StrictHostKeyChecking {strict}")
    return found


def host_key_files(
    known_hosts: object,
    disabled_by: Sequence[str],
    *,
    host: str,
    config_file: str,
    accept_new: bool = False,
    insecure: bool = False,
) -> list[Path] | None:
    """The known_hosts files ``host``'s key is verified against (the first gets new keys).

    ``known_hosts`` is asyncssh's resolved ``known_hosts`` option and
    ``disabled_by`` what :func:`disabling_settings` found. None (no verification)
    only with ``insecure``. A config that turns checking off is refused with a
    ConnectError naming ``config_file`` and ``host``, unless ``accept_new``:
    then unknown keys are recorded in ``~/.ssh/known_hosts`` (never changed ones).
    ``/dev/null`` never receives new keys.
    """
    if insecure:
        return None
    if disabled_by and not accept_new:
        settings = " and ".join(f"'{setting}'" for setting in disabled_by)
        raise ConnectError(
            f"ssh config {config_file} sets {settings} for {host}, which turns host key "
            f"checking off: corral always verifies host keys. Remove that setting, or rerun "
            f"with {ACCEPT_NEW_OPTION} (records unknown keys in {default_known_hosts()}, never "
            f"accepts a changed key) or {INSECURE_OPTION} (no verification at all)",
            host=host,
            cause="host key checking disabled",
        )
    files = known_hosts_files(known_hosts)
    if files is None:
        files = [default_known_hosts(), *GLOBAL_KNOWN_HOSTS]
    if not files or _is_devnull(files[0]):
        files = [default_known_hosts(), *(f for f in files if not _is_devnull(f))]
    return files
