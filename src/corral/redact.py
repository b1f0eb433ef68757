"""Secret environment values: which are secret, and how they are shown.

A value reaches the rank's environment unchanged; everywhere else (``plan.json``,
a node's ``spec.json``, ``corral plan``, logs, the API) it is replaced by
:data:`REDACTED`. A key is secret when the user listed it (``--secret-env K``), when
its name contains one of :data:`SECRET_MARKERS` or has one of :data:`SECRET_WORDS`
as a word (case-insensitive: ``DB_PASS``, ``HF_AUTH``, ``SENTRY_DSN``), when it is
one of :data:`SECRET_NAMES` (``DATABASE_URL``), or when its value looks like a
credential (:func:`looks_secret`: a URL with a password, a known token format such
as ``hf_...``, ``ghp_...``, ``sk-...``, ``AKIA...``, a JWT, a private key).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "<redacted>"
SECRET_MARKERS = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "CREDENTIAL", "APIKEY"
)  # fmt: skip
#: Words of a name (split at ``_``, ``-``, ``.``) that make it secret.
SECRET_WORDS = frozenset({"PASS", "PWD", "AUTH", "AUTHORIZATION", "DSN", "COOKIE", "SIG"})
SECRET_NAMES = frozenset({"DATABASE_URL", "DB_URL", "REDIS_URL", "AMQP_URL", "BROKER_URL"})
_WORD = re.compile(r"[^A-Z0-9]+")
#: Values that are credentials whatever their name.
_SECRET_VALUE = re.compile(
    r"""
    [a-z][a-z0-9+.-]*://[^/?#@\s:]*:[^/?#@\s]+@      # a URL with a password
    | (?<![A-Za-z0-9])(?:
        hf_[A-Za-z0-9]{20,}                            # Hugging Face
      | gh[pousr]_[A-Za-z0-9]{20,}                     # GitHub
      | github_pat_[A-Za-z0-9_]{20,}
      | glpat-[A-Za-z0-9_-]{16,}                       # GitLab
      | sk-[A-Za-z0-9_-]{16,}                          # OpenAI, Anthropic, Stripe (sk-...)
      | sk_(?:live|test)_[A-Za-z0-9]{16,}
      | xox[abposr]-[A-Za-z0-9-]{10,}                  # Slack
      | (?:AKIA|ASIA)[A-Z0-9]{16}                      # AWS access key ids
      | AIza[A-Za-z0-9_-]{30,}                         # Google API keys
      | npm_[A-Za-z0-9]{30,}
      | pypi-[A-Za-z0-9_-]{30,}
      | eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*  # a JWT
      )
    | -----BEGIN[A-Z ]*PRIVATE\ KEY-----
    """,
    re.VERBOSE,
)


def looks_secret(value: str) -> bool:
    """True when ``value`` looks like a credential: a URL with a password (``scheme://
    user:pass@host``), a known token format, a JWT or a private key."""
    return bool(value) and _SECRET_VALUE.search(value) is not None


def is_secret(key: str, extra: Iterable[str] = (), value: str | None = None) -> bool:
    """True when ``key`` names a secret (listed in ``extra``, named like one) or its
    ``value`` (when given) looks like one."""
    upper = key.upper()
    if key in set(extra) or upper in SECRET_NAMES:
        return True
    if any(marker in upper for marker in SECRET_MARKERS):
        return True
    if any(word in SECRET_WORDS for word in _WORD.split(upper)):
        return True
    return value is not None and looks_secret(value)


def secret_keys(env: Mapping[str, str], extra: Iterable[str] = ()) -> list[str]:
    """The keys of ``env`` whose values are secret (by name, listed, or by value)."""
    listed = set(extra)
    return [k for k, v in env.items() if is_secret(k, listed, v)]


def redact_env(env: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """A copy of ``env`` with every secret value replaced by :data:`REDACTED`."""
    listed = set(extra)
    return {k: (REDACTED if is_secret(k, listed, v) else v) for k, v in env.items()}


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
