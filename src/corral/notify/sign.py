"""The signature of a webhook's body: HMAC-SHA256 with the hook's shared secret.

The receiver recomputes it over the raw body it got and compares in constant time
(:func:`verify`), so it knows the body came from this server, unchanged.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Corral-Signature"
"""The header carrying ``sha256=<hex>``."""


def sign(secret: str, body: bytes) -> str:
    """``sha256=`` and the hex HMAC-SHA256 of ``body`` under ``secret``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is the signature of ``body`` under ``secret``."""
    return header is not None and hmac.compare_digest(sign(secret, body), header)
