"""Comparing jobs: ``GET /api/compare`` (Starlette's TestClient over SQLite and
PostgreSQL) returns several jobs' metric series in one bounded answer, and the jobs
page (real headless Chromium against a real ``corral serve``) selects two jobs and
overlays their loss curves on one chart over steps.

The jobs are rows written straight into the store with the progress events their
supervisors would have ingested: what is compared is what the store holds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.api.services import Services
from corral.service.compare import MAX_JOBS
from corral.service.settings import ServerSettings
from corral.store import Store, open_store
from corral.store.models import Event, Job
from tests import webkit
from tests.serverlib import LiveServer, live_server
from tests.webkit import Shots, login, open_page

browser = webkit.browser  # fixtures
shots = webkit.shots

TOKEN = "compare-test-token-" + "Zk4mW8qP2vN6rT1yB5cX9hJ3"


def add_reported_job(
    store: Store, job_id: str, name: str, reports: list[dict[str, Any]], started: float
) -> None:
    """A finished job and its progress reports (each: rank, step, metrics), one second
    apart from ``started``."""
    with store.session() as s:
        s.add(
            Job(
                id=job_id,
                state="succeeded",
                request={"name": name, "script": "train.py"},
                created=started - 1,
                started=started,
                ended=started + len(reports) + 1,
                exit_code=0,
            )
        )
        s.flush()
        for k, report in enumerate(reports):
            s.add(
                Event(
                    job_id=job_id,
                    pos=100 * k,
                    time=started + k + 1,
                    kind="progress",
                    data={"host": "local1", **report},
                )
            )


def losses(rank: int, steps: int, scale: float, **extra: float) -> list[dict[str, Any]]:
    return [
        {"rank": rank, "step": step, "total": steps, "metrics": {"loss": scale / step, **extra}}
        for step in range(1, steps + 1)
    ]


@pytest.fixture
def app(store_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, Store]]:
    store = open_store(store_url)
    svc = Services.build(store, ServerSettings(run_dir=tmp_path / "runs", health_interval=0))
    try:
        with TestClient(create_app(svc, TOKEN, background=False)) as client:
            client.headers["Authorization"] = f"Bearer {TOKEN}"
            yield client, store
    finally:
        store.close()


def test_two_jobs_series_in_one_answer(app: tuple[TestClient, Store]) -> None:
    client, store = app
    now = time.time() - 600
    # job a: rank 1 reports too (only the lowest rank's series is shown); a flag and a
    # text are no series
    reports_a = losses(0, 10, 2.0, lr=0.1) + losses(1, 10, 9.0)
    reports_a.append({"rank": 0, "step": 11, "metrics": {"done": True, "note": "x"}})
    add_reported_job(store, "job-a", "baseline", reports_a, now)
    add_reported_job(store, "job-b", "bigger-lr", losses(0, 6, 1.0, acc=0.5), now + 100)

    r = client.get("/api/compare", params={"job_id": ["job-a", "job-b", "job-a"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [j["job_id"] for j in body["jobs"]] == ["job-a", "job-b"]
    a, b = body["jobs"]
    assert (a["name"], a["status"], a["rank"]) == ("baseline", "succeeded", 0)
    assert set(a["series"]) == {"loss", "lr"} and set(b["series"]) == {"loss", "acc"}
    assert body["shared"] == ["loss"]
    assert a["series"]["loss"][0] == [1, 1.0, 2.0]
    assert [p[0] for p in a["series"]["loss"]] == list(range(1, 11))
    assert [p[2] for p in b["series"]["loss"]] == [1.0 / s for s in range(1, 7)]
    assert a["reported"] == {"loss": 10, "lr": 10}

    only = client.get("/api/compare", params={"job_id": ["job-a", "job-b"], "metric": "loss"})
    assert [set(j["series"]) for j in only.json()["jobs"]] == [{"loss"}, {"loss"}]


def test_what_is_compared_is_what_the_one_decoder_reads(app: tuple[TestClient, Store]) -> None:
    """The stored reports are read as the engine's Progress events (the decoder every
    view uses): a report it refuses (a step that is no number) is no point here either,
    and its fields are the typed ones (a rank written as text is that rank)."""
    client, store = app
    reports = losses(0, 3, 1.0)
    reports.append({"rank": 0, "step": "late", "metrics": {"loss": 9.0}})
    reports.append({"rank": "0", "step": 4, "metrics": {"loss": 0.25}})
    add_reported_job(store, "typed", "typed", reports, time.time() - 60)
    job = client.get("/api/compare", params={"job_id": "typed"}).json()["jobs"][0]
    assert [p[0] for p in job["series"]["loss"]] == [1, 2, 3, 4]
    assert job["reported"] == {"loss": 4}


def test_series_are_downsampled_to_the_bound(app: tuple[TestClient, Store]) -> None:
    client, store = app
    add_reported_job(store, "long", "long", losses(0, 1000, 1.0), time.time() - 3600)
    r = client.get("/api/compare", params={"job_id": "long", "points": 50})
    assert r.status_code == 200, r.text
    job = r.json()["jobs"][0]
    steps = [p[0] for p in job["series"]["loss"]]
    assert len(steps) == 50 and steps[0] == 1 and steps[-1] == 1000
    assert steps == sorted(steps)
    assert job["reported"]["loss"] == 1000
    default = client.get("/api/compare", params={"job_id": "long"}).json()
    assert len(default["jobs"][0]["series"]["loss"]) == default["points"] == 500


def test_unknown_jobs_and_bounds_are_refused(app: tuple[TestClient, Store]) -> None:
    client, store = app
    add_reported_job(store, "known", "known", losses(0, 3, 1.0), time.time() - 60)
    r = client.get("/api/compare", params={"job_id": ["known", "nope"]})
    assert r.status_code == 404, r.text
    assert r.json()["error"]["details"] == {"job_id": "nope"}
    too_many = [f"j{i}" for i in range(MAX_JOBS + 1)]
    r = client.get("/api/compare", params={"job_id": too_many})
    assert r.status_code == 422, r.text
    assert f"at most {MAX_JOBS} jobs" in r.json()["error"]["message"]
    for params in ({}, {"job_id": "known", "points": 1}, {"job_id": "known", "points": 10**6}):
        r = client.get("/api/compare", params=params)
        assert r.status_code == 422, (params, r.text)
    r = client.get("/api/compare", params={"job_id": "x" * 200})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"] == {"field": "job_id"}
    assert (
        client.get(
            "/api/compare", params={"job_id": "known"}, headers={"Authorization": "Bearer wrong"}
        ).status_code
        == 401
    )


# -- the page ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("compare")) as srv:
        with open_store(srv.db_url) as store:
            now = time.time() - 3600
            add_reported_job(store, "cmp-one", "lr-1e-3", losses(0, 20, 3.0), now)
            add_reported_job(store, "cmp-two", "lr-3e-3", losses(0, 12, 1.5), now + 60)
            add_reported_job(store, "cmp-three", "other", losses(0, 5, 1.0), now + 120)
        yield srv


def test_the_jobs_page_compares_two_selected_jobs(
    browser: Any, shots: Shots, server: LiveServer
) -> None:
    with open_page(browser, shots) as page:
        login(page, server, next_path="/jobs")
        page.locator("tr[data-job=cmp-one]").wait_for()
        compare = page.locator("#compare-selected")
        assert compare.is_disabled()
        page.locator("tr[data-job=cmp-one] input.compare-pick").check()
        assert compare.is_disabled()  # one job: nothing to compare with
        page.locator("tr[data-job=cmp-two] input.compare-pick").check()
        with page.expect_navigation():
            compare.click()
        assert "/compare?" in page.url
        page.wait_for_function(
            "() => document.querySelectorAll('#compare-chart svg path[data-job]').length === 2"
        )
        svg = page.locator("#compare-chart svg")
        assert svg.get_attribute("data-x") == "step"
        assert svg.get_attribute("data-metric") == "loss"
        drawn = page.locator("#compare-chart svg path[data-job]")
        assert sorted(drawn.nth(i).get_attribute("data-job") or "" for i in range(2)) == [
            "cmp-one",
            "cmp-two",
        ]
        legend = page.locator("#compare-legend").inner_text()
        assert "lr-1e-3" in legend and "lr-3e-3" in legend and "other" not in legend
        assert page.locator("#compare-metric").input_value() == "loss"
        page.locator("#compare-x").select_option("time")
        page.wait_for_function(
            "() => document.querySelector('#compare-chart svg').dataset.x === 'time'"
        )
        shots.take(page, "compare")
