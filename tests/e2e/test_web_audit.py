"""The admin's page of users and the audit log (``/audit``, also ``/users``) in real
Chromium: the users with their roles and limits, the entries with who, what, before
and after, a user filter; a non-admin gets neither the link nor the data."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests import webkit
from tests.serverlib import LiveServer, live_server
from tests.webkit import login, open_page

browser = webkit.browser  # fixtures
shots = webkit.shots


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("web-audit")
    with live_server(root, args=["--health-interval", "0"]) as srv:
        yield srv


def test_the_admin_sees_users_and_who_changed_what(
    browser: Any, shots: Any, server: LiveServer
) -> None:
    from playwright.sync_api import expect  # here: collecting imports no playwright

    with server.client() as admin:
        alice = admin.post("/api/users", json={"name": "alice", "role": "user"}).json()["token"]
        limited = admin.put("/api/users/alice/limits", json={"jobs": 2, "queued": 7})
        assert limited.status_code == 200, limited.text
    with open_page(browser, shots) as page:
        login(page, server, next_path="/audit")
        page.wait_for_selector("#audit-body tr")
        alice_row = page.locator("#users-body tr[data-user=alice] td").all_inner_texts()
        assert alice_row[:5] == ["alice", "user", "2", "no limit", "7"]
        rows = page.locator("#audit-body tr").all_inner_texts()
        limit_row = next(r for r in rows if "user.limit" in r)
        assert "admin" in limit_row and "alice" in limit_row
        assert '"jobs":null' in limit_row and '"jobs":2' in limit_row
        assert any("user.add" in r and '"role":"user"' in r for r in rows)
        assert any("login" in r for r in rows)  # this very login
        page.fill("#audit-user", "nobody")
        page.click("#audit-filter button[type=submit]")
        expect(page.locator("#audit-count")).to_have_text("0 of 0 entries")
        assert page.locator("#audit-body tr").count() == 0
        shots.take(page, "audit")
        page.goto(f"{server.url}/users")
        page.wait_for_selector("#users-body tr[data-user=alice]")
    with open_page(browser, shots) as page:
        login(page, server, token=alice)
        assert page.locator("nav a[href='/audit']").count() == 0
        page.goto(f"{server.url}/audit")
        assert "for admins" in page.locator("main").inner_text()
        assert page.locator("#audit-body").count() == 0
