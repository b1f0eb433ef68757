"""The team server's token file: read, checked for strength, made when missing (0600).

Standard library only, so that ``corral serve user ...`` and ``serve audit``, which
need the token but no web server, do not load FastAPI for it (:mod:`corral.api.auth`
checks requests against it).
"""

from __future__ import annotations

import math
import os
import secrets
import string
from pathlib import Path

from corral.errors import ConfigError
from corral.private import private_dir, write_private

#: The least a token must carry: as much as the one corral makes (32 random bytes).
MIN_TOKEN_BITS = 256
#: Fewer distinct characters than this is a pattern, whatever its length.
MIN_DISTINCT = 10
_ALPHABETS = (
    (16, frozenset(string.hexdigits.lower())),
    (16, frozenset(string.hexdigits.upper())),
    (64, frozenset(string.ascii_letters + string.digits + "+/=-_")),
    (95, frozenset(string.printable) - frozenset("\t\n\r\x0b\x0c")),
)


def load_or_create_token(path: Path) -> str:
    """The token in ``path``; a new random one written there (0600) when missing."""
    try:
        token = path.read_text().strip()
        if token:
            if path.stat().st_mode & 0o077:
                os.chmod(path, 0o600)
            check_strength(token, path)
            return token
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(
            f"cannot read the token file {path}: {exc.strerror}", option="--token-file"
        ) from exc
    token = secrets.token_urlsafe(32)
    try:
        private_dir(path.parent)
        write_private(path, token + "\n")
    except OSError as exc:
        raise ConfigError(
            f"cannot write the token file {path}: {exc.strerror}", option="--token-file"
        ) from exc
    return token


def token_bits(token: str) -> float:
    """An estimate of a token's entropy in bits: its length times log2 of the smallest
    usual token alphabet holding all its characters (hex 16, base64 64, printable
    ASCII 95, else 256); a token of fewer than :data:`MIN_DISTINCT` distinct
    characters is a pattern and gets log2(distinct) bits per character."""
    chars = set(token)
    if not chars:
        return 0.0
    alphabet = next((size for size, allowed in _ALPHABETS if chars <= allowed), 256)
    if len(chars) < MIN_DISTINCT:
        alphabet = len(chars)
    return len(token) * math.log2(alphabet) if alphabet > 1 else 0.0


def check_strength(token: str, path: Path) -> None:
    bits = token_bits(token)
    if bits < MIN_TOKEN_BITS:
        raise ConfigError(
            f"the token in {path} is too weak (about {bits:.0f} bits; at least "
            f"{MIN_TOKEN_BITS}, 32 random bytes, are needed): delete the file to have "
            "corral make one, or write e.g. "
            "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`",
            option="--token-file",
        )
