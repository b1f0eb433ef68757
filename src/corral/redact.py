"""Secret environment values: which keys are secret, and how they are shown.

A value reaches the rank's environment unchanged; everywhere else (``plan.json``,
a node's ``spec.json``, ``corral plan``, logs, the API) it is replaced by
:data:`REDACTED`. A key is secret when its name contains one of
:data:`SECRET_MARKERS` (case-insensitive) or when the user listed it
(``--secret-env K``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "<redacted>"
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")


def is_secret(key: str, extra: Iterable[str] = ()) -> bool:
    """True when ``key`` names a secret: it contains a marker, or is in ``extra``."""
    upper = key.upper()
    return key in set(extra) or any(marker in upper for marker in SECRET_MARKERS)


def redact_env(env: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """A copy of ``env`` with every secret value replaced by :data:`REDACTED`."""
    listed = set(extra)
    return {k: (REDACTED if is_secret(k, listed) else v) for k, v in env.items()}


def redacted_node(node: Mapping[str, Any]) -> dict[str, Any]:
    """A node's start message (``NodeCommand.to_json()``) with every secret env value
    redacted: the keys named like secrets and those listed in its ``secret_env``."""
    extra = tuple(node.get("secret_env") or ())
    redacted = dict(node)
    redacted["env"] = redact_env(node.get("env") or {}, extra)
    redacted["ranks"] = [
        {**spec, "env": redact_env(spec.get("env") or {}, extra)}
        for spec in node.get("ranks") or []
    ]
    return redacted
