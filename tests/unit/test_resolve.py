"""Turning what the user asked for into a JobSpec: validation names the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.cluster import load_cluster
from corral.errors import ConfigError
from corral.job.resolve import parse_env, resolve
from corral.plan.spec import JobSpec


def _spec(tmp_path: Path, **kw: object) -> JobSpec:
    script = tmp_path / "t.py"
    script.write_text("")
    return JobSpec(script=str(script), run_dir=str(tmp_path / "runs"), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [-1.0, 0.0])
def test_a_timeout_that_is_not_positive_is_refused(tmp_path: Path, timeout: float) -> None:
    with pytest.raises(ConfigError, match="must be more than 0 s") as info:
        resolve(_spec(tmp_path, timeout=timeout), load_cluster("local:1"), dry_run=True)
    assert info.value.option == "--timeout"


def test_a_secret_env_key_must_be_passed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="HF_TOKEN is not passed with --env") as info:
        resolve(_spec(tmp_path, secret_env=("HF_TOKEN",)), load_cluster("local:1"), dry_run=True)
    assert info.value.option == "--secret-env"


def test_a_port_out_of_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="70000 is not a TCP port"):
        resolve(_spec(tmp_path, master_port=70000), load_cluster("local:1"), dry_run=True)


def test_local_resolution_makes_paths_absolute_and_takes_this_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.chdir(tmp_path)
    spec = JobSpec(script="t.py", run_dir="runs", checkpoint_dir="ck", replicate_checkpoints=True)
    (tmp_path / "t.py").write_text("")
    resolved = resolve(spec, load_cluster("local:2"), dry_run=True)
    assert resolved.script == str(tmp_path / "t.py")
    assert resolved.run_dir == str(tmp_path / "runs")
    assert resolved.checkpoint_dir == str(tmp_path / "ck")
    assert resolved.python == sys.executable
    assert resolved.replicate_checkpoints is False  # one filesystem: no replica


def test_bare_env_keys_take_this_shells_value() -> None:
    env = parse_env(["A=1", "TOKEN", "B=x=y"], environ={"TOKEN": "s3cret"})
    assert env == {"A": "1", "TOKEN": "s3cret", "B": "x=y"}
    with pytest.raises(ConfigError, match="MISSING is not set here") as info:
        parse_env(["MISSING"], environ={})
    assert info.value.option == "--env"
    with pytest.raises(ConfigError, match="not a valid environment variable name"):
        parse_env(["1X=2"], environ={})


def test_the_launch_dir_is_fixed_once_so_a_re_plan_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan reads no working directory: the one the job was resolved in is the
    SSH hosts' cwd and local nodes' CORRAL_LAUNCH_DIR in every attempt's plan, even
    after the supervisor's process changed directory."""
    from corral.contract import LAUNCH_DIR_ENV
    from corral.plan.render import plan_job

    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    local = resolve(_spec(tmp_path), load_cluster("local:2"), dry_run=True)
    remote = resolve(_spec(tmp_path), load_cluster("h1,h2"), dry_run=True)
    monkeypatch.chdir(tmp_path / "elsewhere")
    for attempt in (0, 1):
        assert {
            c.env[LAUNCH_DIR_ENV] for c in plan_job(local, load_cluster("local:2"), attempt)
        } == {str(tmp_path)}
        assert {c.cwd for c in plan_job(remote, load_cluster("h1,h2"), attempt)} == {str(tmp_path)}
