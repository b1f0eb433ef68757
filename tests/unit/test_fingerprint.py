"""Code-tree fingerprints: gitignore semantics, manifests, diffs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.agent.fingerprint import (
    build_manifest,
    diff_manifests,
    filter_files,
    is_ignored,
    parse_ignore,
    tree_digest,
)


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("patterns", "path", "is_dir", "ignored"),
    [
        ("*.log", "a/b/x.log", False, True),
        ("*.log\n!keep.log", "a/keep.log", False, False),
        ("/top.txt", "top.txt", False, True),
        ("/top.txt", "sub/top.txt", False, False),
        ("build/", "build", True, True),
        ("build/", "build", False, False),  # dir-only pattern, a file called build
        ("docs/*.md", "docs/a.md", False, True),
        ("docs/*.md", "docs/sub/a.md", False, False),
        ("a/**/z", "a/b/c/z", False, True),
        ("a/**/z", "a/z", False, True),
        ("**/cache", "deep/er/cache", True, True),
        ("logs/**", "logs/x/y", False, True),
        ("file[0-9].txt", "file7.txt", False, True),
        ("file[!0-9].txt", "file7.txt", False, False),
        ("# comment\n\n  ", "anything", False, False),
        ("\\#hash", "#hash", False, True),
        ("x?", "xy", False, True),
        ("x?", "x/y", False, False),
    ],
)
def test_gitignore_patterns(patterns: str, path: str, is_dir: bool, ignored: bool) -> None:
    assert is_ignored(parse_ignore(patterns), path, is_dir) is ignored


def test_manifest_honours_nested_ignore_files_and_builtins(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            ".gitignore": "data/\n*.log\n!keep.log\n",
            "train.py": "print(1)\n",
            "keep.log": "k",
            "noise.log": "n",
            "data/big.bin": "x" * 100,
            "pkg/__init__.py": "",
            "pkg/.corralignore": "local_only.py\n",
            "pkg/local_only.py": "secret",
            "pkg/sub/local_only.py": "also ignored (pattern without slash)",
            "pkg/mod.py": "A = 1\n",
            ".git/HEAD": "ref",
            "pkg/__pycache__/mod.cpython-311.pyc": "bytecode",
            ".venv/bin/python": "",
        },
    )
    os.symlink("train.py", tmp_path / "link.py")
    manifest = build_manifest(str(tmp_path), extra_ignores=["/runs/"])
    assert sorted(manifest.files) == [
        ".gitignore",
        "keep.log",
        "link.py",
        "pkg/.corralignore",
        "pkg/__init__.py",
        "pkg/mod.py",
        "train.py",
    ]
    assert manifest.files["link.py"] != manifest.files["train.py"]  # the link, not its target
    assert manifest.digest == tree_digest(manifest.files)
    assert not manifest.truncated and not manifest.errors


def test_digest_changes_with_content_and_diff_names_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        _tree(root, {"x.py": "1", "y.py": "2", "z.py": "3"})
    (b / "y.py").write_text("changed")
    (b / "z.py").unlink()
    (b / "extra.py").write_text("new")
    ma, mb = build_manifest(str(a)), build_manifest(str(b))
    assert ma.digest != mb.digest
    assert diff_manifests(ma.files, mb.files) == (["y.py"], ["z.py"], ["extra.py"])
    (b / "y.py").write_text("2")
    (b / "z.py").write_text("3")
    (b / "extra.py").unlink()
    assert build_manifest(str(b)).digest == ma.digest


def test_manifest_stops_at_max_files(tmp_path: Path) -> None:
    _tree(tmp_path, {f"f{i}.py": str(i) for i in range(5)})
    manifest = build_manifest(str(tmp_path), max_files=3)
    assert manifest.truncated and len(manifest.files) == 3


def test_filter_files_equals_a_walk_with_the_extra_ignores(tmp_path: Path) -> None:
    (tmp_path / "runs" / "a").mkdir(parents=True)
    (tmp_path / "runs" / "a" / "log.txt").write_text("x")
    (tmp_path / "pkg" / "runs").mkdir(parents=True)
    (tmp_path / "pkg" / "runs" / "keep.py").write_text("y")
    (tmp_path / "train.py").write_text("z")
    (tmp_path / "notes.tmp").write_text("t")
    ignores = ("/runs/", "*.tmp")
    full = build_manifest(str(tmp_path)).files
    filtered = filter_files(full, ignores)
    assert filtered == build_manifest(str(tmp_path), extra_ignores=ignores).files
    assert sorted(filtered) == ["pkg/runs/keep.py", "train.py"]
    assert filter_files(full, ()) == full
