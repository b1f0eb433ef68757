"""The web job page shows what the API's status says of a straggler and a hang (real
headless Chromium against a real ``corral serve``): the straggling rank's chip on its
node card is marked with its section and ratio, the hang report's summary and odd one
out are shown, its rank's chip marked. The events are the ones a supervisor writes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.job.events import (
    AttemptStarted,
    HangReported,
    JobEvent,
    OddRank,
    Progress,
    StragglerFound,
    json_of,
)
from corral.service.eventlog import EVENTS_FILE, append_event
from tests import webkit
from tests.serverlib import LiveServer, live_server
from tests.webkit import Shots, login, open_page

browser = webkit.browser  # fixtures
shots = webkit.shots

SUMMARY = "odd one out: rank 0 on local1 at skip (train.py:9); the others are at all_reduce"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("web-diagnosis")) as srv:
        with srv.client() as client:
            made = client.post(
                "/api/network/machines", json={"name": "local1", "local": True, "slots": 2}
            )
            assert made.status_code == 201, made.text
        yield srv


def _running_job(server: LiveServer) -> str:
    """A job planned on local1 (2 ranks) that its supervisor reports as running, with
    rank 1 named a straggler and a hang report naming rank 0 the odd one out."""
    from corral.store import open_store
    from corral.store.models import Job

    script = server.root / "train.py"
    script.write_text("print('never started')\n")
    body = {"script": str(script), "launcher": "python", "nproc_per_node": 2, "preflight": False}
    with server.client() as client:
        planned = client.post("/api/network/distributed/plan", json=body)
        assert planned.status_code == 200, planned.text
    job_id = str(planned.json()["job_id"])
    with open_store(server.db_url) as store, store.session() as s:
        row = s.get(Job, job_id)
        assert row is not None
        row.state, row.started = "running", time.time()
        path = Path(row.run_dir) / EVENTS_FILE
    events: list[JobEvent] = [
        AttemptStarted(job_id=job_id, number=1, hosts=["local1"], world_size=2),
        *(Progress(job_id=job_id, host="local1", rank=r, step=12, total=50) for r in (0, 1)),
        StragglerFound(
            job_id=job_id,
            host="local1",
            rank=1,
            section="compute",
            ratio=5.1,
            basis="median",
            span=6,
            step=12,
            text="straggler: rank 1 on local1, compute 5.1x the median for 6 steps",
        ),
        HangReported(
            job_id=job_id,
            summary=SUMMARY,
            message="no rank made progress for 5 s",
            odd=[OddRank(host="local1", rank=0, where="skip (train.py:9)", frames=["skip"])],
            report=str(path.parent / "hang" / "report.md"),
        ),
    ]
    for event in events:
        append_event(path, json_of(event))
    return job_id


def test_the_node_card_marks_the_straggler_and_the_page_shows_the_hang(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    job_id = _running_job(server)
    with server.client() as client:
        status = client.get(f"/api/jobs/{job_id}").json()
    assert [(x["rank"], x["ratio"]) for x in status["stragglers"]] == [(1, 5.1)]
    assert status["hang"]["summary"] == SUMMARY
    with open_page(browser, shots) as page:
        login(page, server, next_path=f"/jobs/{job_id}")
        slow = page.locator('.node[data-node="local1"] .chip.slow[data-rank="1"]')
        slow.wait_for()
        assert "straggler: compute 5.1x" in slow.inner_text()
        assert "the median for 6 steps" in (slow.get_attribute("title") or "")
        odd = page.locator('.node[data-node="local1"] .chip.bad[data-rank="0"]')
        assert "odd one out" in odd.inner_text()
        assert "slow" not in (odd.get_attribute("class") or "")
        page.locator("#hang").wait_for()
        assert page.locator("#hang .rc-message").inner_text() == SUMMARY
        assert (
            "rank 0 on local1 at skip (train.py:9)" in page.locator("#hang .hang-odd").inner_text()
        )
        assert page.locator("#hang a", has_text="report.json").count() == 1
        shots.take(page, "diagnosis")
