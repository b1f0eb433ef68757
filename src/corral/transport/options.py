"""How to reach SSH hosts: the CLUSTER options as one value (no I/O)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from corral.errors import ConfigError


@dataclass(frozen=True)
class SshOptions:
    """How to reach SSH hosts (ignored for ``local:N``)."""

    user: str | None = None
    key: str | None = None
    port: int | None = None
    password_env: str | None = None
    config: str | None = None
    accept_new_host_keys: bool = False
    #: Skip host key verification entirely (``--insecure-no-host-key-check``).
    insecure_no_host_key_check: bool = False

    def password(self) -> str | None:
        """The password from the named environment variable (ConfigError if unset)."""
        if self.password_env is None:
            return None
        value = os.environ.get(self.password_env)
        if value is None:
            raise ConfigError(
                f"environment variable {self.password_env} is not set",
                option="--ssh-password-env",
            )
        return value
