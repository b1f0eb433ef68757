"""corral.sdk rank info and output_dir (scale_config: test_sdk_config.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from corral import sdk

pytestmark = pytest.mark.usefixtures("clean_dist_env")


def set_env(monkeypatch: pytest.MonkeyPatch, **values: object) -> None:
    for key, value in values.items():
        monkeypatch.setenv(key, str(value))


def test_defaults_describe_a_single_process() -> None:
    me = sdk.info()
    assert me == sdk.DistInfo(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=29500,
        job_id=None,
        attempt=0,
    )
    assert not sdk.is_distributed()
    assert sdk.is_main_process()
    assert sdk.should_save_outputs()


def test_corral_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(
        monkeypatch,
        RANK=5,
        LOCAL_RANK=1,
        WORLD_SIZE=8,
        LOCAL_WORLD_SIZE=2,
        NODE_RANK=2,
        NNODES=4,
        MASTER_ADDR="10.0.0.1",
        MASTER_PORT=29611,
        CORRAL_JOB_ID="j-42",
        CORRAL_ATTEMPT=2,
        GROUP_RANK=9,  # NODE_RANK wins over torchrun's name
        GROUP_WORLD_SIZE=9,
        TORCHELASTIC_RESTART_COUNT=7,
    )
    me = sdk.info()
    assert (me.rank, me.local_rank, me.world_size, me.local_world_size) == (5, 1, 8, 2)
    assert (me.node_rank, me.num_nodes) == (2, 4)
    assert (me.master_addr, me.master_port) == ("10.0.0.1", 29611)
    assert (me.job_id, me.attempt) == ("j-42", 2)
    assert sdk.is_distributed()
    assert not sdk.is_main_process()
    assert not sdk.should_save_outputs()


def test_torchrun_environment_uses_group_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(
        monkeypatch,
        RANK=3,
        LOCAL_RANK=1,
        WORLD_SIZE=4,
        LOCAL_WORLD_SIZE=2,
        GROUP_RANK=1,
        GROUP_WORLD_SIZE=2,
        TORCHELASTIC_RESTART_COUNT=1,
        MASTER_ADDR="h0",
        MASTER_PORT=1234,
    )
    me = sdk.info()
    assert (me.node_rank, me.num_nodes, me.attempt) == (1, 2, 1)


def test_missing_local_values_are_derived(monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, RANK=5, WORLD_SIZE=8, NNODES=2)
    me = sdk.info()
    assert (me.local_world_size, me.local_rank, me.node_rank, me.num_nodes) == (4, 1, 1, 2)


def test_info_from_explicit_mapping_ignores_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, RANK=1, WORLD_SIZE=2)
    assert sdk.info({"RANK": "2", "WORLD_SIZE": "3"}).rank == 2


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"RANK": "x"}, "RANK"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4"),
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0"),
        ({"WORLD_SIZE": "4", "NNODES": "0"}, "nodes"),
    ],
)
def test_bad_environment_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, values: dict[str, str], needle: str
) -> None:
    set_env(monkeypatch, **values)
    with pytest.raises(ValueError, match=needle):
        sdk.info()


def test_distinfo_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        sdk.info().rank = 3  # type: ignore[misc]


def test_print_distributed_info_prints_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    set_env(monkeypatch, RANK=1, WORLD_SIZE=2, MASTER_ADDR="m", MASTER_PORT=7)
    sdk.print_distributed_info()
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "rank 1/2" in out
    assert "m:7" in out


def test_output_dir_only_on_rank_zero(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "out" / "run1"
    set_env(monkeypatch, RANK=1, WORLD_SIZE=2)
    assert sdk.output_dir(target) is None
    assert not target.exists()
    set_env(monkeypatch, RANK=0)
    assert sdk.output_dir(target) == target
    assert target.is_dir()
