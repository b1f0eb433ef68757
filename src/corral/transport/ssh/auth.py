"""Client authentication material: the ``--ssh-key`` file.

ssh-agent (``SSH_AUTH_SOCK``) and the ssh config's IdentityFile are used by
asyncssh itself; the password comes from the environment variable the user
named (``SshOptions.password``) and is never logged.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import asyncssh

from corral.errors import ConfigError

__all__ = ["load_key"]


def load_key(path: str) -> Any:
    """Load ``--ssh-key`` once (ConfigError naming the option if it is unusable)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"key file {path!r} not found", option="--ssh-key")
    try:
        return asyncssh.load_keypairs([str(file)])
    except (asyncssh.KeyEncryptionError, asyncssh.KeyImportError) as exc:
        if "passphrase" not in str(exc).lower() and not isinstance(
            exc, asyncssh.KeyEncryptionError
        ):
            raise ConfigError(f"cannot load key file {path!r}: {exc}", option="--ssh-key") from exc
        raise ConfigError(
            f"key file {path!r} is passphrase-protected: load it into ssh-agent (ssh-add "
            f"{shlex.quote(path)}) and omit --ssh-key ({exc})",
            option="--ssh-key",
        ) from exc
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load key file {path!r}: {exc}", option="--ssh-key") from exc
