"""The sync state file: recording, reading, and the per-host sync status."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from corral.sync.state import (
    SyncRecord,
    describe_age,
    load_records,
    record_sync,
    record_syncs,
    recorded_manifest,
    records_for_dest,
    state_path,
    sync_state,
    sync_status,
    verify_sync,
)


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def test_default_location_follows_env(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert state_path() == state_dir / "sync-state.json"
    monkeypatch.delenv("CORRAL_STATE_DIR")
    assert state_path() == Path.home() / ".corral" / "sync-state.json"


def test_record_and_read_back(state_dir: Path) -> None:
    rec = record_sync("tb1", "/srv/code", digest="d1", src="/home/me/code", files=3, when=100.0)
    assert sync_state("tb1", "/srv/code") == rec
    assert sync_state("tb1", "/srv/other") is None
    assert sync_state("tb2", "/srv/code") is None
    doc = json.loads((state_dir / "sync-state.json").read_text())
    assert doc["version"] == 1
    assert doc["entries"] == [
        {
            "host": "tb1",
            "dest": "/srv/code",
            "digest": "d1",
            "src": "/home/me/code",
            "time": 100.0,
            "files": 3,
        }
    ]


def test_later_sync_replaces_entry_and_keeps_others() -> None:
    record_sync("tb1", "/d", digest="old", src="/s", files=1, when=1.0)
    record_sync("tb2", "/d", digest="old", src="/s", files=1, when=1.0)
    record_sync("tb1", "/d", digest="new", src="/s", files=2, when=2.0)
    got = {(r.host, r.digest) for r in load_records()}
    assert got == {("tb1", "new"), ("tb2", "old")}


def test_unreadable_or_malformed_file_reads_as_empty(state_dir: Path) -> None:
    state_dir.mkdir(parents=True)
    (state_dir / "sync-state.json").write_text("{not json")
    assert load_records() == []
    (state_dir / "sync-state.json").write_text(
        json.dumps(
            {
                "entries": [
                    {"host": "tb1"},
                    "junk",
                    {
                        "host": "tb2",
                        "dest": "/d",
                        "digest": "x",
                        "src": "/s",
                        "time": 1,
                        "files": 1,
                    },
                ]
            }
        )
    )
    assert [r.host for r in load_records()] == ["tb2"]
    record_sync("tb3", "/d", digest="x", src="/s", files=1)  # rewrites a clean file
    assert {r.host for r in load_records()} == {"tb2", "tb3"}


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.json"

    def write(i: int) -> None:
        for j in range(10):
            record_syncs([SyncRecord(f"h{i}", f"/d{j}", "x", "/s", 1.0, 1)], path=path)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(load_records(path=path)) == 60


def test_sync_status_pass_warn_skip() -> None:
    record_sync("tb1", "/srv/code", digest="cur", src="/s", files=1, when=1000.0)
    record_sync("tb2", "/srv/code", digest="old", src="/s", files=1, when=400.0)
    record_sync("tb3", "/srv/elsewhere", digest="cur", src="/s", files=1, when=1000.0)
    status = sync_status(["tb1", "tb2", "tb3"], "/srv/code", "cur", now=1030.0)
    assert status["tb1"][0] == "pass" and "30 s ago" in status["tb1"][1]
    assert status["tb2"][0] == "warn"
    assert "changed since the last sync" in status["tb2"][1] and "10 min ago" in status["tb2"][1]
    assert status["tb3"] == ("skip", "never synced to /srv/code by corral sync")


def test_describe_age_units() -> None:
    assert describe_age(0.0, now=5.0).endswith("5 s ago")
    assert describe_age(0.0, now=3 * 3600).endswith("3.0 h ago")
    assert describe_age(0.0, now=3 * 86400).endswith("3.0 days ago")


def test_trailing_slashes_do_not_matter() -> None:
    record_sync("tb1", "/srv/code/", digest="d", src="/s", files=1)
    assert sync_state("tb1", "/srv/code") is not None
    assert sync_status(["tb1"], "/srv/code//", "d")["tb1"][0] == "pass"


def test_verify_sync_checks_the_hosts_tree_against_what_was_pushed() -> None:
    pushed = {"a.py": "1", "runs/log.txt": "2", "b.py": "3"}
    record_sync("tb1", "/srv/code", digest="D", src="/s", files=3, when=0.0, manifest=pushed)
    record_sync("tb2", "/srv/code", digest="E", src="/s", files=3, when=0.0)
    here = {"a.py": "1", "b.py": "3"}  # walked with the run directory ignored
    verdicts = verify_sync(
        ["tb1", "tb2"],
        "/srv/code",
        local_digest="not-D",  # the digest here differs only by the ignored run dir
        local_files=here,
        host_trees={"tb1": {"a.py": "1", "b.py": "X", "c.py": "4"}, "tb2": here},
        ignores=("/runs/",),
        now=60.0,
    )
    tb1 = verdicts["tb1"]
    assert tb1.status == "warn" and tb1.verified and tb1.changed == ("b.py", "c.py")
    assert "changed on the host since the last sync" in tb1.detail and "b.py, c.py" in tb1.detail
    # no stored manifest and a digest that differs: only "changed here" can be said
    assert verdicts["tb2"].status == "warn" and not verdicts["tb2"].verified

    verdicts = verify_sync(
        ["tb1"],
        "/srv/code",
        local_digest="x",
        local_files=here,
        host_trees={"tb1": here},
        ignores=("/runs/",),
    )
    assert verdicts["tb1"].status == "pass" and "verified on the host" in verdicts["tb1"].detail


def test_manifests_are_kept_only_while_referenced(state_dir: Path) -> None:
    record_sync("tb1", "/d", digest="A", src="/s", files=1, manifest={"a": "1"})
    assert recorded_manifest("A") == {"a": "1"}
    record_sync("tb1", "/d", digest="B", src="/s", files=1, manifest={"a": "2"})
    assert recorded_manifest("A") is None and recorded_manifest("B") == {"a": "2"}


def test_records_for_dest_match_home_relative_spellings() -> None:
    record_sync("tb1", "~/code", digest="A", src="/s", files=1, when=1.0)
    record_sync("tb2", "code/", digest="A", src="/t", files=1, when=2.0)
    assert [r.src for r in records_for_dest(["tb1", "tb2", "tb3"], "code")] == ["/t", "/s"]
    assert sync_state("tb1", "./code") is not None
