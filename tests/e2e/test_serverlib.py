"""The test server's helpers spend little CPU while they wait (issue 30): polls that
back off to at most ``POLL_MAX_S`` apart and end at the timeout, and one TLS context
for all the clients of the process (httpx builds one per client otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import serverlib
from tests.serverlib import POLL_FIRST_S, POLL_MAX_S, LiveServer, polls, tls_context


class _Clock:
    """``time.monotonic`` and ``time.sleep`` of a clock that only sleeps move."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_polls_back_off_to_the_cap_and_end_at_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = _Clock()
    monkeypatch.setattr(serverlib.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(serverlib.time, "sleep", clock.sleep)
    left = list(polls(10.0))
    assert left[0] == 10.0  # the first poll right away
    assert clock.slept[0] == POLL_FIRST_S
    growing = clock.slept[:-1]  # the last pause is what was left of the timeout
    assert growing == sorted(growing), clock.slept
    assert max(clock.slept) == POLL_MAX_S
    assert sum(clock.slept) == pytest.approx(10.0)  # no poll past the timeout
    assert len(left) < 10.0 / POLL_MAX_S + 10  # ~2 polls a second, not 5 or 10
    assert list(polls(0)) == []


def test_the_servers_clients_share_one_tls_context(tmp_path: Path) -> None:
    server = LiveServer(root=tmp_path, db_url="sqlite://")
    with server.client() as one, server.client() as two:
        contexts = [c._transport._pool._ssl_context for c in (one, two)]  # type: ignore[attr-defined]
    assert contexts[0] is contexts[1] is tls_context()
