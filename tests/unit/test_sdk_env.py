"""corral.sdk rank info, scale_config and output_dir."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from corral import sdk

ENV_VARS = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "NNODES",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CORRAL_JOB_ID",
    "CORRAL_ATTEMPT",
    "TORCHELASTIC_RESTART_COUNT",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


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


@pytest.mark.parametrize(("rule", "factor"), [("linear", 4.0), ("sqrt", 2.0), ("none", 1.0)])
def test_scale_config_rules(rule: str, factor: float) -> None:
    base = {"epochs": 3, "batch_size": 999}
    out = sdk.scale_config(base, batch_size=64, lr=0.01, rule=rule, world_size=4)  # type: ignore[arg-type]
    assert base == {"epochs": 3, "batch_size": 999}  # not mutated
    assert out["epochs"] == 3
    assert out["batch_size"] == 16
    assert out["global_batch_size"] == 64
    assert math.isclose(out["lr"], 0.01 * factor)
    assert out["base_lr"] == 0.01
    assert out["lr_scale_rule"] == rule
    assert out["world_size"] == 4
    assert out["rank"] == 0


def test_scale_config_uses_the_job_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, RANK=2, WORLD_SIZE=8)
    out = sdk.scale_config(batch_size=256, lr=0.1)
    assert (out["batch_size"], out["world_size"], out["rank"]) == (32, 8, 2)
    assert math.isclose(out["lr"], 0.8)
    assert out["is_main_process"] is False


def test_scale_config_single_process_is_identity() -> None:
    out = sdk.scale_config(None, batch_size=32, lr=0.5)
    assert (out["batch_size"], out["lr"], out["world_size"]) == (32, 0.5, 1)


def test_scale_config_warns_when_not_divisible() -> None:
    with pytest.warns(RuntimeWarning, match="not divisible"):
        out = sdk.scale_config(batch_size=10, lr=1.0, world_size=4)
    assert (out["batch_size"], out["global_batch_size"]) == (2, 8)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"batch_size": 3, "lr": 0.1, "world_size": 4}, "smaller than world_size"),
        ({"batch_size": 0, "lr": 0.1}, "batch_size"),
        ({"batch_size": 8.0, "lr": 0.1}, "batch_size"),
        ({"batch_size": 8, "lr": 0.0}, "lr"),
        ({"batch_size": 8, "lr": float("nan")}, "lr"),
        ({"batch_size": 8, "lr": 0.1, "world_size": 0}, "world_size"),
        ({"batch_size": 8, "lr": 0.1, "rule": "cubic"}, "rule"),
    ],
)
def test_scale_config_errors(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        sdk.scale_config(**kwargs)  # type: ignore[arg-type]


def test_output_dir_only_on_rank_zero(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = tmp_path / "out" / "run1"
    set_env(monkeypatch, RANK=1, WORLD_SIZE=2)
    assert sdk.output_dir(target) is None
    assert not target.exists()
    set_env(monkeypatch, RANK=0)
    assert sdk.output_dir(target) == target
    assert target.is_dir()
