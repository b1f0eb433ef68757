"""The web page's login, session and CSRF rules, its assets and its basic
accessibility, in real headless Chromium against a real ``corral serve`` (local
machines only: no testbed).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests import webkit
from tests.conftest import missing_dependency
from tests.serverlib import LiveServer, live_server, wait_status
from tests.webkit import PHONE, Shots, login, open_page

browser = webkit.browser  # fixtures
shots = webkit.shots

SESSION_COOKIE = "corral_session"
#: A rank that prints a few lines and ends (python launcher, no torch).
HELLO = """\
import os
for i in range(3):
    print(f"hello {i} from rank {os.environ['RANK']}", flush=True)
"""
#: Wait for the page's own script to have built its inputs and rows, ms.
SETTLE_MS = 800


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One server for the module, with a local machine registered and checked."""
    with live_server(tmp_path_factory.mktemp("web-auth")) as srv:
        with srv.client() as client:
            made = client.post("/api/network/machines", json={"name": "local1", "local": True})
            assert made.status_code == 201, made.text
            assert client.post("/api/network/health-check").status_code == 200
        yield srv


@pytest.fixture(scope="module")
def job_id(server: LiveServer) -> str:
    """A finished one-rank job on the local machine (its page has nodes and logs)."""
    script = server.root / "hello.py"
    script.write_text(HELLO)
    request = {"script": str(script), "launcher": "python", "nproc_per_node": 1}
    with server.client() as client:
        planned = client.post("/api/network/distributed/plan", json={**request, "preflight": False})
        assert planned.status_code == 200, planned.text
        found = str(planned.json()["job_id"])
        sent = client.post("/api/network/distributed/dispatch", json={"job_id": found})
        assert sent.status_code == 200, sent.text
        done = wait_status(client, found, ["succeeded", "failed", "lost", "cancelled"], 90)
        assert done["status"] == "succeeded", done
    return found


def _pages(job: str) -> list[str]:
    return ["/", "/jobs/new", "/jobs", f"/jobs/{job}"]


def _fetch(page: Any, method: str, path: str, headers: dict[str, str], body: str = "") -> int:
    """The status of a ``fetch`` made by the page itself (its cookies, its origin)."""
    return int(
        page.evaluate(
            """async ([method, path, headers, body]) => {
                 const r = await fetch(path, {method, headers, body: body || undefined,
                                              credentials: "same-origin", redirect: "manual"});
                 return r.status;
               }""",
            [method, path, headers, body],
        )
    )


def _machine_count(server: LiveServer) -> int:
    with server.client() as client:
        return len(client.get("/api/network/machines").json())


def _settle(page: Any) -> None:
    page.wait_for_load_state("load")
    page.wait_for_timeout(SETTLE_MS)


# -- login and redirects -----------------------------------------------------------------


def test_pages_without_a_session_redirect_to_login(
    browser: Any, shots: Shots, server: LiveServer, job_id: str
) -> None:
    with open_page(browser, shots) as page:
        for path in _pages(job_id):
            page.goto(server.url + path)
            where = urlsplit(page.url)
            assert where.path == "/login", (path, page.url)
            assert parse_qs(where.query).get("next") == [path], page.url
            assert page.locator("#token").is_visible()
        shots.take(page, "login")
        api = page.request.get(server.url + "/api/network/machines")
        assert api.status == 401, api.text()  # the API answers, it does not redirect


def test_wrong_token_stays_on_login_then_right_token_opens_machines(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    with open_page(browser, shots) as page:
        login(page, server, token="not-the-token")
        assert urlsplit(page.url).path == "/login", page.url
        alert = page.get_by_role("alert")
        assert "token" in alert.inner_text().lower(), alert.inner_text()
        assert not [c for c in page.context.cookies() if c["name"] == SESSION_COOKIE]
        shots.take(page, "wrong-token")

        login(page, server)
        assert page.url == server.url + "/", page.url
        assert page.locator("h1").first.inner_text().strip().lower().startswith("machines")
        page.locator("[data-machine=local1]").first.wait_for()
        shots.take(page, "machines")


def test_login_form_without_its_csrf_token_is_refused(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    with open_page(browser, shots) as page:
        page.goto(server.url + "/login")
        page.fill("#token", "x")  # replaced below: only the CSRF field is missing
        page.evaluate(
            """(token) => {
                 document.querySelector("input[name=csrf_token]").remove();
                 document.querySelector("#token").value = token;
               }""",
            server.token_file.read_text().strip(),
        )
        with page.expect_navigation():
            page.locator("form[action='/login'] [type=submit]").click()
        assert urlsplit(page.url).path == "/login", page.url
        assert parse_qs(urlsplit(page.url).query).get("error") == ["csrf"], page.url
        assert not [c for c in page.context.cookies() if c["name"] == SESSION_COOKIE]


@pytest.mark.parametrize(
    "target",
    ["//evil.example", "//evil.example/path", "https://evil.example/", "/\\evil.example"],
)
def test_login_next_never_leaves_the_site(
    browser: Any, shots: Shots, server: LiveServer, target: str
) -> None:
    off_site: list[str] = []
    with open_page(browser, shots) as page:

        def guard(route: Any) -> None:
            if route.request.url.startswith(server.url):
                route.continue_()
            else:
                off_site.append(route.request.url)
                route.abort()

        page.route("**/*", guard)
        page.goto(f"{server.url}/login?next={target}")
        # the server's own next, and then one forged into the form as well
        page.evaluate("(t) => { document.querySelector('input[name=next]').value = t; }", target)
        page.fill("#token", server.token_file.read_text().strip())
        # an off-site navigation is aborted (an error here): asserted below
        with contextlib.suppress(Exception), page.expect_navigation():
            page.locator("form[action='/login'] [type=submit]").click()
        page.wait_for_timeout(300)
        assert not off_site, off_site
        assert page.url.startswith(server.url + "/"), page.url


# -- the session cookie and CSRF -----------------------------------------------------------


def test_session_cookie_is_httponly_and_samesite_strict(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    with open_page(browser, shots) as page:
        login(page, server)
        cookies = [c for c in page.context.cookies() if c["name"] == SESSION_COOKIE]
        assert len(cookies) == 1, page.context.cookies()
        cookie = cookies[0]
        assert cookie["httpOnly"] is True, cookie
        assert cookie["sameSite"] == "Strict", cookie
        assert cookie["path"] == "/", cookie
        assert SESSION_COOKIE not in page.evaluate("document.cookie")  # scripts cannot read it
        assert server.token_file.read_text().strip() not in page.content()  # nor the token


def test_api_change_needs_the_csrf_header(browser: Any, shots: Shots, server: LiveServer) -> None:
    before = _machine_count(server)
    body = '{"name": "csrf-probe", "local": true}'
    json_type = {"Content-Type": "application/json"}
    with open_page(browser, shots) as page:
        login(page, server)
        csrf = page.locator('meta[name="csrf-token"]').get_attribute("content")
        assert csrf, "the page carries its session's CSRF token"
        # reading needs no CSRF token; changing does
        assert _fetch(page, "GET", "/api/network/machines", {}) == 200
        assert _fetch(page, "POST", "/api/network/machines", json_type, body) == 403
        wrong = {**json_type, "X-CSRF-Token": "forged"}
        assert _fetch(page, "POST", "/api/network/machines", wrong, body) == 403
        # Playwright's own request context sends the cookie too: same answer
        plain = page.request.post(
            server.url + "/api/network/machines", data=body, headers=json_type
        )
        assert plain.status == 403 and plain.json()["error"]["type"] == "csrf", plain.text()
        assert _machine_count(server) == before  # nothing was made
        right = {**json_type, "X-CSRF-Token": csrf}
        assert _fetch(page, "POST", "/api/network/machines", right, body) == 201
        deleted = _fetch(page, "DELETE", "/api/network/machines/by-name/csrf-probe", {})
        assert deleted == 403
        assert _machine_count(server) == before + 1
        gone = _fetch(
            page, "DELETE", "/api/network/machines/by-name/csrf-probe", {"X-CSRF-Token": csrf}
        )
        assert gone in (200, 204), gone
    assert _machine_count(server) == before


def test_logout_needs_csrf_and_ends_the_session(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    with open_page(browser, shots) as page:
        login(page, server)
        assert _fetch(page, "POST", "/logout", form, "") == 403
        assert _fetch(page, "POST", "/logout", form, "csrf_token=forged") == 403
        page.goto(server.url + "/")
        assert urlsplit(page.url).path == "/", page.url  # still logged in
        cookie = next(c for c in page.context.cookies() if c["name"] == SESSION_COOKIE)

        with page.expect_navigation():
            page.locator("form[action='/logout'] [type=submit]").click()
        assert urlsplit(page.url).path == "/login", page.url
        page.goto(server.url + "/jobs")
        assert urlsplit(page.url).path == "/login", page.url
        # the old cookie, put back, is dead on the server too
        page.context.add_cookies([cookie])
        page.goto(server.url + "/")
        assert urlsplit(page.url).path == "/login", page.url
        assert _fetch(page, "GET", "/api/network/machines", {}) == 401


def test_pages_work_under_the_csp_and_queue_a_task_with_post(
    browser: Any, shots: Shots, server: LiveServer, job_id: str
) -> None:
    request = {
        "script": str(server.root / "hello.py"),
        "launcher": "python",
        "nproc_per_node": 1,
        "preflight": False,
    }
    with server.client() as client:
        made = client.post("/api/tasks", json={"name": "csp-task", "request": request})
        assert made.status_code == 201, made.text
        task = made.json()["id"]
    refused: list[str] = []
    sent: list[tuple[str, str]] = []
    with open_page(browser, shots) as page:
        page.on("console", lambda m: "Content Security Policy" in m.text and refused.append(m.text))
        page.on("request", lambda r: sent.append((r.method, urlsplit(r.url).path)))
        login(page, server)
        for path in _pages(job_id):
            page.goto(server.url + path)
            _settle(page)
        page.goto(server.url + "/jobs")
        queue = page.locator(f'tr[data-task="{task}"] button[data-action=queue]')
        queue.click()  # the rows exist: the page's own script ran under the CSP
        page.locator("#flash").filter(has_text="Queued").wait_for()
    assert ("POST", f"/api/tasks/{task}/queue_distributed") in sent
    # a task is queued with POST, never the seed's GET (the queue itself is read with GET)
    assert not [s for s in sent if s[0] == "GET" and re.match(r"/api/tasks/.+/queue", s[1])], sent
    assert refused == []


# -- assets and accessibility --------------------------------------------------------------


def test_pages_load_nothing_from_elsewhere(
    browser: Any, shots: Shots, server: LiveServer, job_id: str
) -> None:
    requested: list[str] = []
    failed: list[str] = []
    with open_page(browser, shots) as page:
        page.on("request", lambda r: requested.append(r.url))
        page.on("requestfailed", lambda r: failed.append(f"{r.failure} {r.url}"))
        page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
        login(page, server)
        for path in _pages(job_id):
            page.goto(server.url + path)
            _settle(page)
            shots.take(page, "page" + path.replace("/", "-"))
            for tag, attr in (("script[src]", "src"), ("link[href]", "href")):
                for ref in page.eval_on_selector_all(
                    tag, f"els => els.map(e => e.getAttribute('{attr}'))"
                ):
                    # our own files, or an inline data: URL (the empty favicon)
                    local = ref.startswith("/") and not ref.startswith("//")
                    assert local or ref.startswith("data:"), (path, ref)
    elsewhere = [u for u in requested if not u.startswith((server.url + "/", "data:"))]
    assert not elsewhere, elsewhere
    assert any(u.endswith(".js") for u in requested) and any(u.endswith(".css") for u in requested)
    # requests cut short by the next navigation (ERR_ABORTED) are the only acceptable failures
    assert not [u for u in failed if "ERR_ABORTED" not in u], failed


def test_every_input_has_a_label(
    browser: Any, shots: Shots, server: LiveServer, job_id: str
) -> None:
    unlabelled: dict[str, list[str]] = {}
    with open_page(browser, shots) as page:
        page.goto(server.url + "/login")
        paths = ["/login", *_pages(job_id)]
        for path in paths:
            if path != "/login":
                if path == "/":
                    login(page, server)
                page.goto(server.url + path)
            _settle(page)
            missing = page.evaluate(
                """() => [...document.querySelectorAll(
                       'input:not([type=hidden]), select, textarea')]
                     .filter(e => !(e.labels && [...e.labels].some(l => l.innerText.trim()))
                                  && !(e.getAttribute('aria-label') || '').trim()
                                  && !(e.getAttribute('aria-labelledby') || '').trim()
                                  && !(e.getAttribute('title') || '').trim())
                     .map(e => e.outerHTML.slice(0, 120))"""
            )
            count = page.locator("input:not([type=hidden]), select, textarea").count()
            assert count or path in ("/jobs",), f"{path}: no inputs at all?"
            if missing:
                unlabelled[path] = missing
    assert not unlabelled, unlabelled


@pytest.mark.parametrize("path", ["/", "/jobs/new", "/jobs", "job"])
def test_phone_width_has_no_horizontal_scroll(
    browser: Any, shots: Shots, server: LiveServer, job_id: str, path: str
) -> None:
    target = f"/jobs/{job_id}" if path == "job" else path
    with open_page(browser, shots, viewport=PHONE) as page:
        login(page, server, next_path=target)
        _settle(page)
        if target == "/":
            page.locator("[data-machine=local1]").first.wait_for()
        shots.take(page, "phone")
        width = page.evaluate("document.documentElement.scrollWidth")
        wide = page.evaluate(
            """() => [...document.querySelectorAll('body *')]
                 .filter(e => e.getBoundingClientRect().right > innerWidth + 2)
                 .filter(e => !e.closest('.table-wrap, pre, [data-scroll]'))
                 .slice(0, 5).map(e => e.tagName + (e.id ? '#' + e.id : '')
                                       + '.' + e.className)"""
        )
        assert width <= PHONE["width"] + 2, (target, width, wide)


def test_the_pages_are_driven_by_debians_headless_shell() -> None:
    """When Debian's chromium-headless-shell is installed (``make test`` installs it),
    it is the browser: about a quarter of the CPU of ``chromium --headless`` per page."""
    shell = Path(webkit.HEADLESS_SHELL)
    if not os.access(shell, os.X_OK) and shutil.which(shell.name) is None:
        missing_dependency(f"needs Debian's {shell.name} (apt-get install {shell.name})")
    assert Path(webkit.chromium_path() or "").name == shell.name, webkit.chromium_path()


def test_the_login_page_asks_for_the_users_own_token(server: LiveServer) -> None:
    """Not the admin's: no hint at the command that prints the server's token."""
    page = httpx.get(f"{server.url}/login", timeout=30)
    assert page.status_code == 200
    assert "--print-token" not in page.text
    assert "Your API token" in page.text and "ask the server's admin" in page.text


def test_static_files_are_open(server: LiveServer) -> None:
    """The login page's CSS and JS load without a session (``/static`` is open),
    and nothing outside the static dir is reachable through it."""
    for name in ("corral.css", "corral.js"):
        resp = httpx.get(f"{server.url}/static/{name}", timeout=30)
        assert resp.status_code == 200, (name, resp.status_code)
        assert server.token_file.read_text().strip() not in resp.text
    escaped = httpx.get(f"{server.url}/static/%2e%2e/token", timeout=30)
    assert server.token_file.read_text().strip() not in escaped.text, escaped.status_code


def test_a_viewer_logs_in_with_their_token_and_sees_no_actions(
    browser: Any, shots: Shots, server: LiveServer, job_id: str
) -> None:
    with server.client() as client:
        made = client.post("/api/users", json={"name": "vera", "role": "viewer"})
        assert made.status_code == 201, made.text
        token = str(made.json()["token"])
    with open_page(browser, shots) as page:
        login(page, server, token=token)
        assert page.url == server.url + "/", page.url
        page.locator("[data-machine=local1]").first.wait_for()
        assert page.locator("#add-machine, button[data-action=remove]").count() == 0
        assert page.get_by_role("link", name="New job").count() == 0
        page.goto(f"{server.url}/jobs/{job_id}")
        _settle(page)
        assert page.locator("#stop-all, #stop-dialog").count() == 0
        # the job is admin's: its output is not shown to a viewer, and the page says why
        assert "hello 0 from rank 0" not in page.locator("#logs").inner_text()
        assert "owner (admin) and admins only" in page.locator("#logs-empty").inner_text()
        page.goto(server.url + "/jobs")
        _settle(page)
        assert page.locator(f"tr[data-job='{job_id}']").count() >= 1  # a viewer reads
        assert page.locator("button[data-action=cancel], button[data-action=queue]").count() == 0
        page.goto(server.url + "/queue")
        _settle(page)
        assert "vera (viewer)" in page.locator(".whoami").inner_text()
        assert page.locator("button[data-action=top]").count() == 0
        shots.take(page, "viewer-queue")
        csrf = page.locator("meta[name=csrf-token]").get_attribute("content") or ""
        refused = _fetch(
            page, "POST", f"/api/network/distributed/stop/{job_id}", {"X-CSRF-Token": csrf}
        )
        assert refused == 403
