"""Playwright helpers of the web tests: Debian's headless Chromium, never a browser
download. Debian's ``chromium-headless-shell`` when installed (``make test`` installs
it): the same Blink as ``chromium``, without the full browser that ``chromium
--headless`` starts, it spends about a quarter of the CPU per page (issue 30);
else ``chromium``.

A test module takes the fixtures it uses as module names (``browser = webkit.browser``):

- ``browser`` (module): one headless Chromium. Without the ``playwright`` package
  or a Chromium (:func:`chromium_path`) the test is skipped, or fails under
  ``CI=true`` (:func:`tests.conftest.missing_dependency`).
- ``shots``: where the test's screenshots go (kept after the test, unlike the
  netns testbed's ``tmp_path``), and ``shots.take(page, name)``.

Helpers: :func:`open_page` (a fresh browser context, so a fresh cookie jar, that
saves a ``failure`` screenshot when the block raises), :func:`login`,
:func:`doc_screenshot` (``docs/screenshots/*.png``, only with
``CORRAL_UPDATE_SCREENSHOTS=1``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import missing_dependency
from tests.serverlib import TOKEN, LiveServer

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

REPO = Path(__file__).resolve().parents[1]
DOC_SCREENSHOTS = REPO / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
HEADLESS_SHELL = "/usr/bin/chromium-headless-shell"
#: Playwright's default wait for a locator or navigation, ms (a loaded 2-core box is slow).
DEFAULT_TIMEOUT_MS = 20_000
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


def chromium_path() -> str | None:
    """Debian's headless shell (``/usr/bin/chromium-headless-shell``, else on PATH),
    else its chromium (``/usr/bin/chromium``, else on PATH); None without either."""
    for path in (HEADLESS_SHELL, CHROMIUM):
        found = path if os.access(path, os.X_OK) else shutil.which(Path(path).name)
        if found:
            return found
    return None


class _Shared:
    """The one Playwright driver and browser of the process. Each module that takes
    the ``browser`` fixture has its own session-scoped copy of it, but Playwright's
    sync API runs one driver at a time: the copies share this, the last one out
    closes it."""

    playwright: Any = None
    browser: Any = None
    users = 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Headless Debian chromium driven by Playwright, for one test module: stopped at
    the module's end, because Playwright's sync API keeps an event loop running in
    the main thread, which would break every later test that calls asyncio.run()."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        missing_dependency(f"needs the playwright package (make setup): {exc}")
    path = chromium_path()
    if path is None:
        missing_dependency(
            "needs Debian's chromium (apt-get install chromium-headless-shell; make test does)"
        )
    if _Shared.browser is None:
        _Shared.playwright = sync_playwright().start()
        try:
            _Shared.browser = _Shared.playwright.chromium.launch(executable_path=path)
        except BaseException:
            _Shared.playwright.stop()
            _Shared.playwright = None
            raise
    _Shared.users += 1
    try:
        yield _Shared.browser
    finally:
        _Shared.users -= 1
        if _Shared.users == 0:
            _Shared.browser.close()
            _Shared.playwright.stop()
            _Shared.browser = _Shared.playwright = None


class Shots:
    """A test's screenshot directory."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory

    def take(self, page: Page, name: str, full_page: bool = True) -> Path:
        """Save ``<dir>/<name>.png`` of the page and return its path."""
        path = self.dir / f"{name}.png"
        page.screenshot(path=str(path), full_page=full_page)
        return path


@pytest.fixture
def shots(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Shots:
    """The test's screenshots: ``<pytest basetemp>/<test>-shotsN/`` (kept after the run)."""
    name = re.sub(r"\W", "_", request.node.name)[:40]
    return Shots(tmp_path_factory.mktemp(f"{name}-shots"))


@contextmanager
def open_page(browser: Browser, shots: Shots, viewport: dict[str, int] = DESKTOP) -> Iterator[Page]:
    """A page in a new context (its own cookies); a ``failure`` screenshot if the
    block raises; the context closed after."""
    context = browser.new_context(viewport=viewport)
    context.set_default_timeout(DEFAULT_TIMEOUT_MS)
    page = context.new_page()
    try:
        yield page
    except BaseException:
        with contextlib.suppress(Exception):  # the test's own error is the one to report
            shots.take(page, "failure")
        raise
    finally:
        context.close()


def login(page: Page, server: LiveServer, token: str = TOKEN, next_path: str = "") -> None:
    """Log in through the login form (``next_path``: where to land) and wait for the page."""
    url = f"{server.url}/login" + (f"?next={next_path}" if next_path else "")
    page.goto(url)
    page.fill("#token", token)
    with page.expect_navigation():
        page.locator("form[action='/login'] [type=submit]").click()
    if token == TOKEN:
        assert "/login" not in page.url, page.url


def doc_screenshot(page: Page, name: str) -> Path | None:
    """Rewrite ``docs/screenshots/<name>.png`` (the README's) from this page at
    1280x800, only when ``CORRAL_UPDATE_SCREENSHOTS=1``: normal runs leave the
    tracked files alone."""
    if os.environ.get("CORRAL_UPDATE_SCREENSHOTS", "") != "1":
        return None
    page.set_viewport_size(DESKTOP)
    DOC_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = DOC_SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path
