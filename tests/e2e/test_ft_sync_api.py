"""``ft_sync`` / ``ft_sync_every`` (``--ft-sync``, ``--ft-sync-every``) from the API:
an in-place plan stores them and the supervisor process's builder gives every rank
``CORRAL_FT_SYNC`` / ``CORRAL_FT_SYNC_EVERY``; a bad value is a 422 naming the field
(a rule of the builder: naming its flag, as ``corral run`` does).
The app runs in Starlette's TestClient over SQLite (the fixture of test_inplace_api)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from corral.job.build import job_spec
from corral.job.describe import JobDescription
from corral.store.models import Job
from tests.e2e.test_inplace_api import _plan, api

__all__ = ["api"]


def test_an_in_place_plan_carries_the_sync_mode_to_the_ranks(api: tuple[TestClient, Any]) -> None:
    client, store = api
    r = _plan(client, recovery="in-place", ft_sync="diloco", ft_sync_every=20)
    assert r.status_code == 200, r.text
    with store.session() as s:
        row = s.get(Job, r.json()["job_id"])
        assert row is not None
        description = JobDescription.from_dict(row.launch)
    assert (description.options.ft_sync, description.options.ft_sync_every) == ("diloco", 20)
    env = job_spec(description.options).env  # what the supervisor process plans with
    assert (env["CORRAL_FT_SYNC"], env["CORRAL_FT_SYNC_EVERY"]) == ("diloco", "20")


BAD: list[tuple[dict[str, Any], str]] = [
    ({"recovery": "in-place", "ft_sync": "gossip"}, "ft_sync"),  # the request's choices
    ({"recovery": "in-place", "ft_sync": "diloco", "ft_sync_every": 0}, "ft_sync_every"),
    ({"ft_sync": "diloco"}, "--ft-sync: needs --recovery in-place"),  # the builder's rules
    ({"recovery": "in-place", "ft_sync": "ddp", "ft_sync_every": 5}, "--ft-sync-every: 5 needs"),
]


def test_bad_sync_requests_are_422_naming_the_field(api: tuple[TestClient, Any]) -> None:
    client, _ = api
    answers = [(_plan(client, **extra), words) for extra, words in BAD]
    assert [r.status_code for r, _ in answers] == [422] * len(BAD), [r.text for r, _ in answers]
    for r, words in answers:
        assert words in r.json()["error"]["message"], r.text
