"""The stat-cached manifest equals build_manifest and re-hashes exactly what changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import corral.sync.hashcache as hc
from corral.agent.fingerprint import build_manifest, walk


def tree(root: Path) -> None:
    for rel, text in {
        ".gitignore": "*.log\n",
        "a.py": "a",
        "pkg/b.py": "b" * 5000,
        "sp ace/ü.py": "u",
        "x.log": "ignored",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "link").symlink_to("a.py")


def age(monkeypatch: pytest.MonkeyPatch) -> None:
    """Treat every file as older than the racy window (ctime cannot be set back)."""
    monkeypatch.setattr(hc, "RACY_NS", -10_000_000_000)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = hc.file_digest

    def digest(path: str) -> str:
        calls.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(hc, "file_digest", digest)
    return calls


def manifest(root: Path, cache: Path) -> hc.Manifest:
    return hc.cached_manifest(str(root), walk(str(root))[0], cache=cache)


def test_equals_build_manifest_and_reuses_hashes(
    tmp_path: Path, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, cache = tmp_path / "t", tmp_path / "cache.json"
    tree(root)
    age(monkeypatch)
    first = manifest(root, cache)
    want = build_manifest(str(root))
    assert (first.files, first.size, first.digest) == (want.files, want.size, want.digest)
    assert len(counted) == 5 and cache.exists()
    counted.clear()
    assert manifest(root, cache).digest == want.digest
    assert counted == []  # everything from the cache
    (root / "pkg/b.py").write_text("c" * 5000)  # same size; ctime and mtime move
    third = manifest(root, cache)
    assert counted == ["b.py"]
    assert third.digest == build_manifest(str(root)).digest != want.digest


def test_recent_files_are_hashed_every_time(tmp_path: Path, counted: list[str]) -> None:
    root, cache = tmp_path / "t", tmp_path / "cache.json"
    tree(root)  # just written: inside the racy window
    manifest(root, cache)
    counted.clear()
    manifest(root, cache)
    assert len(counted) == 5
    assert not cache.exists()  # nothing worth caching yet


def test_a_cache_for_another_root_or_garbage_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, cache = tmp_path / "t", tmp_path / "cache.json"
    tree(root)
    age(monkeypatch)
    cache.write_text(
        json.dumps(
            {"version": 1, "root": "/elsewhere", "entries": {"a.py": [1, 2, 3, 4, 5, "f" * 64]}}
        )
    )
    assert manifest(root, cache).digest == build_manifest(str(root)).digest
    cache.write_text("not json")
    assert manifest(root, cache).digest == build_manifest(str(root)).digest


def test_default_cache_lives_in_the_state_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_STATE_DIR", str(tmp_path / "state"))
    path = hc.cache_file("/some/tree")
    assert path.parent == tmp_path / "state" / "hash-cache"
    assert path != hc.cache_file("/some/other")


def test_changed_since(tmp_path: Path) -> None:
    root = tmp_path / "t"
    tree(root)
    files = walk(str(root))[0]
    before = hc.snapshot(str(root), files)
    assert hc.changed_since(str(root), before) == []
    (root / "a.py").write_text("A")
    (root / "sp ace/ü.py").unlink()
    assert sorted(hc.changed_since(str(root), before)) == ["a.py", "sp ace/ü.py"]


def test_unreadable_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "t"
    tree(root)

    def boom(path: str) -> str:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(hc, "file_digest", boom)
    m = hc.cached_manifest(str(root), ["a.py"], use_cache=False)
    assert m.files == {} and m.errors == {"a.py": "Permission denied"}
