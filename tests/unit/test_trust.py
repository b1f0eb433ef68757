"""The trust boundary's pure rules (:mod:`corral.service.trust`, the tracking targets'
paths in :mod:`corral.track.targets`): what a target writes or reaches, the
allow-list, link-local addresses. The whole boundary over HTTP is
``tests/e2e/test_trust_boundary.py``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.errors import ConfigError, Forbidden
from corral.service.trust import admit_target, link_local, parse_allow, url_allowed
from corral.track.targets import parse_target, rebased, remote_url, written_path


@pytest.mark.parametrize(
    ("target", "path", "url"),
    [
        ("tensorboard:tb", "tb", None),
        ("mlflow:sqlite:///m.db", "m.db", None),
        ("mlflow:sqlite:////abs/m.db?timeout=5", "/abs/m.db", None),
        ("mlflow:sqlite://", None, None),  # in memory: nothing written, nothing reached
        ("mlflow:file:./mlruns", "./mlruns", None),
        ("mlflow:file:///abs/mlruns", "/abs/mlruns", None),
        ("mlflow:file://host/abs/mlruns", "/abs/mlruns", None),
        ("mlflow:mlruns", "mlruns", None),
        ("mlflow:http://mlflow:5000", None, "http://mlflow:5000"),
        ("mlflow:postgresql://db/mlflow", None, "postgresql://db/mlflow"),
        ("mlflow:runs", "runs", None),  # MLflow reads a bare word as a path...
        ("mlflow:databricks", None, "databricks"),  # ...but for its remote services
        ("wandb:proj", None, None),
    ],
)
def test_what_a_target_writes_or_reaches(target: str, path: str | None, url: str | None) -> None:
    parsed = parse_target(target)
    assert (written_path(parsed), remote_url(parsed)) == (path, url)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("tensorboard:tb", "tensorboard:/runs/j/tb"),
        ("tensorboard:../j2/tb", "tensorboard:/runs/j2/tb"),
        ("mlflow:sqlite:///m.db?timeout=5", "mlflow:sqlite:////runs/j/m.db?timeout=5"),
        ("mlflow:file:./mlruns", "mlflow:file:///runs/j/mlruns"),
        ("mlflow:mlruns", "mlflow:/runs/j/mlruns"),
        ("mlflow:sqlite:////abs/m.db", "mlflow:sqlite:////abs/m.db"),
        ("tensorboard:~/tb", "tensorboard:~/tb"),
        ("mlflow:http://mlflow:5000", "mlflow:http://mlflow:5000"),
    ],
)
def test_relative_paths_land_in_the_job_dir(target: str, expected: str) -> None:
    assert str(rebased(parse_target(target), "/runs/j")) == expected


def test_the_allow_list_takes_absolute_paths_and_url_prefixes(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert parse_allow([str(tmp_path / "link"), "http://mlflow:5000", f"file://{tmp_path}"]) == (
        str((tmp_path / "real").resolve()),
        "http://mlflow:5000",
        str(tmp_path.resolve()),
    )
    refused = (("runs/tb", "must be absolute"), ("http:///x", "needs a host"), ("", "not a path"))
    for bad, why in refused:
        with pytest.raises(ConfigError, match=why) as caught:
            parse_allow([bad])
        assert caught.value.option == "--tracking-allow"


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://mlflow:5000", True),
        ("http://MLflow:5000/", True),
        ("http://mlflow:5000/api/x", True),
        ("http://mlflow:5000.evil.example/", False),
        ("http://mlflow:5001/", False),
        ("https://mlflow:5000/", False),
        ("http://evil.example/?u=http://mlflow:5000", False),
        ("http://user@mlflow:5000", True),
        ("https://lab.example/mlflow/x", True),
        ("https://lab.example/mlflowx", False),
        ("https://lab.example:443/mlflow", True),
    ],
)
def test_a_url_is_allowed_under_a_prefix_only(url: str, allowed: bool) -> None:
    allow = ("http://mlflow:5000", "https://lab.example/mlflow", "/some/path")
    assert url_allowed(url, allow) is allowed


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("169.254.169.254", True),
        ("169.254.0.1", True),
        ("[fe80::1]", True),
        ("::ffff:169.254.169.254", True),
        ("fd00:ec2::254", True),
        ("metadata.google.internal", True),
        ("METADATA.google.internal.", True),
        ("100.100.100.200", True),
        ("10.0.0.1", False),
        ("127.0.0.1", False),
        ("mlflow", False),
    ],
)
def test_link_local_and_metadata_hosts(host: str, expected: bool) -> None:
    assert link_local(host) is expected


def test_admission_of_targets(tmp_path: Path) -> None:
    job = str(tmp_path / "runs" / "j")
    allow = parse_allow([str(tmp_path / "shared"), "http://mlflow:5000"])
    ok = {"job_dir": job, "allow": allow}
    assert str(admit_target("tensorboard:tb", **ok, trusted=False)) == f"tensorboard:{job}/tb"
    shared = f"tensorboard:{tmp_path / 'shared' / 'tb'}"
    assert str(admit_target(shared, **ok, trusted=False)) == shared
    # a symlink in the job dir that points out of it is out of bounds
    os.makedirs(job)
    os.symlink("/etc", os.path.join(job, "out"))
    for target in ("tensorboard:out/tb", "tensorboard:../k/tb", "mlflow:http://other:5000"):
        with pytest.raises(Forbidden, match="tracking-allow") as caught:
            admit_target(target, **ok, trusted=False)
        assert caught.value.info["rule"] == "tracking-allow-list"
        assert admit_target(target, **ok, trusted=True)  # an admin is not held to it
    with pytest.raises(Forbidden, match="metadata") as metadata:
        admit_target("mlflow:http://169.254.169.254/", **ok, trusted=True)
    assert metadata.value.info["rule"] == "link-local"
    allowed = parse_allow(["http://169.254.169.254"])
    assert admit_target("mlflow:http://169.254.169.254/", job_dir=job, allow=allowed, trusted=False)
