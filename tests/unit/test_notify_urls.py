"""Webhook URLs (corral.notify.urls): what is valid, how one is shown, which
addresses the rule lets a delivery reach (resolved when it is sent)."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from corral.notify.urls import (
    AddressRefused,
    AddressRule,
    Pinned,
    check_url,
    classify,
    mask_url,
    pinned,
)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://127.0.0.1:99999/x", "port"),
        ("http://127.0.0.1:0/x", "port"),
        ("http://h:x/", "port"),
        ("ftp://h/x", "http"),
        ("javascript:alert(1)", "http"),
        ("http:///x", "host"),
        ("http://h/a\x00b", "control"),
        ("http://h/a\tb", "control"),
        ("http://h/a b", "spaces"),
        ("http://<img/src=x>/", "host name"),
        ("http://a..b/", "host name"),
        ("http://-h.example/", "host name"),
        ("http://h.example/" + "x" * 2000, "2000"),
    ],
)
def test_a_bad_url_is_refused_saying_why(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        check_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "https://hooks.example.org/services/x?y=1",
        "http://[::1]:9/x",
        "https://bücher.example/x",
        "http://receiver_1.lan/x",
    ],
)
def test_a_good_url_is_kept_as_given(url: str) -> None:
    assert check_url(url) == url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://u:hunter2@h:80/p?token=s&a=1", "http://***@h:80/p?token=***&a=1"),
        ("https://TOKENONLY@h/x", "https://***@h/x"),
        ("https://h/x?api_key=k&Signature=s&password=p&team=ml", "https://h/x?api_key=***&Signature=***&password=***&team=ml"),
        ("https://h/x?next=" + "ghp_" + "A" * 30, "https://h/x?next=***"),
        ("https://h/x", "https://h/x"),
        ("http://[::1:/x", "http://..."),
    ],
)  # fmt: skip
def test_credentials_are_masked_wherever_a_url_is_shown(url: str, shown: str) -> None:
    assert mask_url(url) == shown


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("169.254.169.254", "link_local"),
        ("fe80::1", "link_local"),
        ("::ffff:169.254.169.254", "link_local"),
        ("64:ff9b::a9fe:a9fe", "link_local"),
        ("fd00:ec2::254", "link_local"),
        ("100.100.100.200", "link_local"),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.9", "private"),
        ("100.64.0.1", "private"),
        ("fd12::1", "private"),
        ("0.0.0.0", "reserved"),
        ("224.0.0.1", "reserved"),
        ("240.0.0.1", "reserved"),
        ("8.8.8.8", "public"),
        ("2606:4700::1111", "public"),
    ],
)
def test_addresses_are_classified_as_the_rule_needs(address: str, kind: str) -> None:
    assert classify(ipaddress.ip_address(address)) == kind


def test_the_rule_is_checked_on_what_a_name_resolves_to_when_sent() -> None:
    default, strict = AddressRule(), AddressRule(allow=[])
    sent = asyncio.run(pinned("http://localhost:8080/x?a=1", default))
    assert sent.host_header == "localhost:8080" and sent.sni is None
    assert sent.url in ("http://127.0.0.1:8080/x?a=1", "http://[::1]:8080/x?a=1")
    with pytest.raises(AddressRefused, match="loopback"):
        asyncio.run(pinned("http://localhost:8080/x", strict))
    with pytest.raises(AddressRefused, match="link-local"):
        asyncio.run(pinned("http://169.254.169.254/latest", default))
    with pytest.raises(AddressRefused, match="metadata"):
        asyncio.run(pinned("http://metadata.google.internal/", default))
    relaxed = AddressRule(allow=["link_local"])
    assert asyncio.run(pinned("http://169.254.169.254/x", relaxed)).url == (
        "http://169.254.169.254/x"
    )
    https = asyncio.run(pinned("https://u:p@localhost/x", default))
    assert https.sni == "localhost" and https.url.startswith("https://u:p@")


def test_a_pinned_request_keeps_an_ipv6_literal_bracketed() -> None:
    assert asyncio.run(pinned("http://[::1]:9/x", AddressRule())) == Pinned(
        "http://[::1]:9/x", "[::1]:9", None
    )
