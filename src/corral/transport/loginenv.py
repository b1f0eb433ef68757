"""The environment a node's process gets on ``local:N`` (standard library only: the
entry point starts the agents with it before anything else is imported)."""

from __future__ import annotations

import os

#: What an SSH login would give a process too; everything else must be asked for.
LOGIN_ENV_KEYS = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TMPDIR",
    "TZ",
)


def login_env() -> dict[str, str]:
    """The subset of the coordinator's environment a login shell would also have."""
    return {k: os.environ[k] for k in LOGIN_ENV_KEYS if k in os.environ}
