"""The web machines page's link heatmap data: ``POST /api/network/links`` on a real
``corral serve`` measures the registered testbed machines with the same function as
``corral check --links``; ``GET`` returns the last matrix; bad input is a 4xx."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.testbed import Testbed
from tests.serverlib import LiveServer, live_server

pytestmark = pytest.mark.netns

HOSTS = ("tb1", "tb2", "tb3")


@pytest.fixture
def server(testbed: Testbed, tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(tmp_path / "srv", args=["--ssh-config", str(testbed.ssh_config)]) as srv:
        yield srv


def test_the_link_matrix_of_the_registered_machines(server: LiveServer) -> None:
    client = server.client(timeout=180)
    assert client.get("/api/network/links").json() == {
        "measured": False,
        "measured_at": None,
        "data": {},
    }
    bad = client.post("/api/network/links", json={"min_ratio": 2})
    assert bad.status_code == 422 and "min_ratio" in bad.text
    for name in HOSTS[:1]:
        assert client.post("/api/network/machines", json={"name": name}).status_code == 201
    few = client.post("/api/network/links", json={})
    assert few.status_code == 409 and "two or more remote machines" in few.text
    for name in HOSTS[1:]:
        assert client.post("/api/network/machines", json={"name": name}).status_code == 201
    measured = client.post("/api/network/links", json={"seconds": 3})
    assert measured.status_code == 200, measured.text
    data = measured.json()["data"]
    assert data["hosts"] == list(HOSTS)
    assert len(data["pairs"]) == 3 and all(p["gbs"] > 0 for p in data["pairs"])
    assert [[c["level"] for c in row][i] for i, row in enumerate(data["grid"])] == ["self"] * 3
    assert {c["level"] for row in data["grid"] for c in row} <= {"self", "good", "fair"}
    assert data["score"]["culprits"] == []
    again = client.get("/api/network/links").json()
    assert again["measured"] is True and again["data"]["pairs"] == data["pairs"]
    page = client.get("/static/links.js")
    assert page.status_code == 200 and "/api/network/links" in page.text
