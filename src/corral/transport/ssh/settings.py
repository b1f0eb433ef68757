"""What the SSH transport reads from the CLUSTER options (a protocol, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["DefaultSettings", "SshSettings"]


class SshSettings(Protocol):
    """What :class:`~corral.transport.ssh.SshTransport` reads from ``SshOptions``."""

    @property
    def user(self) -> str | None: ...
    @property
    def key(self) -> str | None: ...
    @property
    def port(self) -> int | None: ...
    @property
    def config(self) -> str | None: ...
    @property
    def accept_new_host_keys(self) -> bool: ...
    @property
    def insecure_no_host_key_check(self) -> bool: ...
    def password(self) -> str | None:
        """The password (read from the environment variable the user named), or None."""
        ...


@dataclass(frozen=True)
class DefaultSettings:
    """No options given: the user's ssh config and defaults decide."""

    user: str | None = None
    key: str | None = None
    port: int | None = None
    config: str | None = None
    accept_new_host_keys: bool = False
    insecure_no_host_key_check: bool = False

    def password(self) -> str | None:
        """No password."""
        return None
