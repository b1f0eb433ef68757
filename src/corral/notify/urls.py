"""Webhook URLs: what a valid one is, how one is shown (credentials masked), and which
addresses the server may send to.

A URL is checked when it is added (:func:`check_url`: http/https, a host, a port
1-65535, no control characters or spaces, at most :data:`MAX_URL` characters) and
shown back with its credentials masked (:func:`mask_url`: the user-info part, and
the values of query parameters named like credentials or that look like one).

Where a webhook may point is the :class:`AddressRule`: public addresses always;
loopback and private (RFC 1918, unique-local, shared) addresses by default, as a team
server's receivers often run next to it; link-local addresses and the clouds'
metadata endpoints (``169.254.169.254``, ``fd00:ec2::254``, ``metadata.google.internal``)
only when an admin allows ``link_local``; unspecified, multicast and reserved
addresses never. The rule is checked when a URL is added (for a literal address or a
metadata name) and again when it is sent: the host name is resolved then, every
address it has must be allowed, and the request goes to the address checked
(:func:`pinned`), so a name that resolves elsewhere later cannot get around it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field

from corral.redact import looks_secret

MAX_URL = 2000
MASK = "***"
#: Query parameter names whose values are credentials (matched as a part of the name).
SECRET_PARAMS = ("token", "key", "secret", "sig", "signature", "password", "passwd", "pass",
                 "auth", "credential", "code")  # fmt: skip

Kind = Literal["public", "loopback", "private", "link_local", "reserved"]
Relaxable = Literal["loopback", "private", "link_local"]
DEFAULT_ALLOW: tuple[Relaxable, ...] = ("loopback", "private")
#: apprise's schemes that send to the URL's own host (checked like a webhook's when
#: sent, though apprise makes the connection: a name is resolved and checked first).
APPRISE_HOST_SCHEMES = frozenset({"json", "jsons", "xml", "xmls", "form", "forms"})
#: Cloud metadata endpoints that are not in a link-local range themselves.
METADATA_NETS = tuple(ipaddress.ip_network(n) for n in ("fd00:ec2::254/128", "100.100.100.200/32"))
METADATA_NAMES = frozenset(
    {"metadata", "metadata.google.internal", "metadata.goog", "instance-data",
     "instance-data.ec2.internal", "metadata.azure.internal"}
)  # fmt: skip
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT: private to the site
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressRule(BaseModel):
    """Which kinds of address, besides public ones, notifications may be sent to."""

    model_config = ConfigDict(extra="forbid")

    allow: list[Relaxable] = Field(
        default_factory=lambda: list(DEFAULT_ALLOW),
        max_length=3,
        description="Besides public addresses: `loopback` (127.0.0.0/8, ::1), `private` "
        "(10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7) and `link_local` "
        "(169.254/16, fe80::/10 and the clouds' metadata endpoints). Unspecified, "
        "multicast and reserved addresses are never allowed.",
    )

    def allows(self, kind: Kind) -> bool:
        """Whether an address of ``kind`` may be sent to."""
        return kind == "public" or kind in self.allow


class AddressRefused(Exception):
    """A webhook's host is (or resolves to) an address the rule refuses."""


def check_url(url: str) -> str:
    """``url`` when it is a webhook URL the server can send to; ValueError saying what
    is wrong (without the URL, which may hold a credential)."""
    if len(url) > MAX_URL:
        raise ValueError(f"at most {MAX_URL} characters")
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise ValueError("must not contain spaces or control characters")
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL")
    host = parts.hostname
    if not host:
        raise ValueError("must name a host")
    try:
        port = parts.port
    except ValueError:
        port = -1
    if port is not None and not 1 <= port <= 65535:
        raise ValueError("the port must be a number from 1 to 65535")
    if _literal(host) is None and not _valid_name(host):
        raise ValueError(f"{host[:100]!r} is not a valid host name or IP address")
    return url


def _valid_name(host: str) -> bool:
    try:
        ascii_host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        return False
    labels = ascii_host.rstrip(".").split(".")
    return len(ascii_host) <= 253 and all(_LABEL.match(label) for label in labels)


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return None


def classify(address: IPAddress) -> Kind:
    """The kind of ``address`` for :class:`AddressRule` (an IPv4 address inside an
    IPv6 one, mapped or NAT64, is judged as itself)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return classify(address.ipv4_mapped)
        if address in _NAT64:
            return classify(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.is_link_local or any(address in net for net in METADATA_NETS):
        return "link_local"
    if address.is_loopback:
        return "loopback"
    if address.is_unspecified or address.is_multicast or address.is_reserved:
        return "reserved"
    if address.is_private or address in _SHARED:
        return "private"
    if not address.is_global:
        return "reserved"
    return "public"


def _refusal(host: str, address: IPAddress, kind: Kind) -> str:
    said = host if host == str(address) else f"{host} ({address})"
    if kind == "reserved":
        return f"{said} is not an address a webhook can be sent to"
    return (
        f"{said} is a {kind.replace('_', '-')} address, which the server's address rule "
        f"refuses (an admin can allow it: PUT /api/notify/addresses)"
    )


def check_host(url: str, rule: AddressRule) -> None:
    """AddressRefused when the URL's host is a literal address or a metadata name the
    rule refuses (a name is resolved when it is sent: :func:`pinned`)."""
    host = urlsplit(url).hostname or ""
    address = _literal(host)
    if address is not None:
        kind = classify(address)
        if not rule.allows(kind):
            raise AddressRefused(_refusal(host, address, kind))
    elif host.rstrip(".").lower() in METADATA_NAMES and not rule.allows("link_local"):
        raise AddressRefused(f"{host} is a cloud metadata endpoint, which the rule refuses")


@dataclass(frozen=True)
class Pinned:
    """A request to the checked address: the URL with the host replaced, the ``Host``
    header and the TLS server name it keeps."""

    url: str
    host_header: str
    sni: str | None


async def resolved(url: str, rule: AddressRule) -> list[IPAddress]:
    """The addresses of the URL's host now (resolved); AddressRefused unless every
    one is allowed by ``rule``."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    check_host(url, rule)
    literal = _literal(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(
                host, parts.port or 0, type=socket.SOCK_STREAM
            )
        except (OSError, UnicodeError, ValueError) as exc:
            raise AddressRefused(f"cannot resolve {host}: {exc}") from exc
        found = (_literal(str(info[4][0])) for info in infos)
        addresses = list(dict.fromkeys(a for a in found if a is not None))
        if not addresses:
            raise AddressRefused(f"{host} has no address")
    for address in addresses:
        kind = classify(address)
        if not rule.allows(kind):
            raise AddressRefused(_refusal(host, address, kind))
    return addresses


async def pinned(url: str, rule: AddressRule) -> Pinned:
    """Resolve the URL's host now; AddressRefused unless every address it has is
    allowed; the request to the first one (the name kept for Host and TLS)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    https = parts.scheme.lower() == "https"
    literal = _literal(host)
    chosen = str((await resolved(url, rule))[0])
    netloc = f"[{chosen}]" if ":" in chosen else chosen
    if parts.port is not None:
        netloc += f":{parts.port}"
    if "@" in parts.netloc:
        netloc = parts.netloc.rpartition("@")[0] + "@" + netloc
    shown_host = f"[{host}]" if ":" in host else host
    header = shown_host + (f":{parts.port}" if parts.port is not None else "")
    target = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return Pinned(target, header, host if https and literal is None else None)


def mask_url(url: str) -> str:
    """``url`` as it may be shown (API, pages, audit, logs): the user-info part and
    the values of query parameters named like credentials (``token``, ``key``,
    ``secret``, ``sig``, ``password``, ...) or that look like one replaced by ``***``.
    Never raises: a URL it cannot parse is shown as its scheme only."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode(
                [(k, MASK if _secret_param(k, v) else v) for k, v in pairs],
                quote_via=quote,
                safe=MASK[0],
            )
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment and MASK))
    except ValueError:
        return url.partition("://")[0] + "://..."


def _secret_param(name: str, value: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in SECRET_PARAMS) or looks_secret(value)
