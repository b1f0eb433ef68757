"""corral.sdk.scale_config: the linear scaling rule on the global batch, and the seed's mode."""

from __future__ import annotations

import json
import math

import pytest

from corral import sdk

pytestmark = pytest.mark.usefixtures("clean_dist_env")


@pytest.mark.parametrize("rule", ["linear", "sqrt", "none"])
@pytest.mark.parametrize("world", [1, 2, 4, 8, 16])
def test_default_lr_does_not_depend_on_the_world_size(rule: str, world: int) -> None:
    out = sdk.scale_config(batch_size=256, lr=0.1, rule=rule, world_size=world)  # type: ignore[arg-type]
    assert out["lr"] == 0.1
    assert out["lr_scale"] == 1.0
    assert (out["batch_size"], out["global_batch_size"]) == (256 // world, 256)
    assert (out["base_batch_size"], out["lr_scale_by"]) == (256, "global_batch")


@pytest.mark.parametrize(("rule", "lr"), [("linear", 0.4), ("sqrt", 0.2), ("none", 0.1)])
def test_lr_follows_the_global_batch_relative_to_the_tuned_batch(rule: str, lr: float) -> None:
    # lr 0.1 was tuned at a global batch of 256; the job runs a global batch of 1024
    out = sdk.scale_config(batch_size=1024, lr=0.1, rule=rule, base_batch_size=256, world_size=8)  # type: ignore[arg-type]
    assert math.isclose(out["lr"], lr)
    assert out["batch_size"] == 128
    assert out["base_lr"] == 0.1
    assert out["base_batch_size"] == 256
    assert out["lr_scale_rule"] == rule


def test_elastic_restart_on_fewer_nodes_keeps_the_lr() -> None:
    before = sdk.scale_config(batch_size=240, lr=0.3, base_batch_size=60, world_size=8)
    after = sdk.scale_config(batch_size=240, lr=0.3, base_batch_size=60, world_size=6)
    assert math.isclose(before["lr"], 1.2)
    assert before["lr"] == after["lr"]
    assert (before["batch_size"], after["batch_size"]) == (30, 40)
    assert before["global_batch_size"] == after["global_batch_size"] == 240


def test_a_smaller_global_batch_than_tuned_lowers_the_lr() -> None:
    out = sdk.scale_config(batch_size=64, lr=0.1, base_batch_size=256, world_size=2)
    assert math.isclose(out["lr"], 0.025)


def test_lr_follows_the_global_batch_actually_used_when_it_does_not_divide() -> None:
    with pytest.warns(RuntimeWarning, match="not divisible"):
        out = sdk.scale_config(batch_size=10, lr=1.0, world_size=4)
    assert (out["batch_size"], out["global_batch_size"]) == (2, 8)
    assert math.isclose(out["lr"], 0.8)


@pytest.mark.parametrize(("rule", "factor"), [("linear", 4.0), ("sqrt", 2.0), ("none", 1.0)])
def test_world_size_mode_is_the_seed_adjustment(rule: str, factor: float) -> None:
    base = {"epochs": 3, "batch_size": 999}
    out = sdk.scale_config(
        base,
        batch_size=64,
        lr=0.01,
        rule=rule,  # type: ignore[arg-type]
        scale_by="world_size",
        world_size=4,
    )
    assert base == {"epochs": 3, "batch_size": 999}  # not mutated
    assert out["epochs"] == 3
    assert (out["batch_size"], out["global_batch_size"]) == (16, 64)
    assert math.isclose(out["lr"], 0.01 * factor)
    assert out["lr_scale"] == factor
    assert out["base_batch_size"] == 16  # the lr is taken as tuned at the per-device batch
    assert out["base_lr"] == 0.01
    assert (out["lr_scale_rule"], out["lr_scale_by"]) == (rule, "world_size")
    assert (out["world_size"], out["rank"]) == (4, 0)


def test_world_size_mode_changes_the_lr_with_the_world_size() -> None:
    eight = sdk.scale_config(batch_size=240, lr=0.1, scale_by="world_size", world_size=8)
    six = sdk.scale_config(batch_size=240, lr=0.1, scale_by="world_size", world_size=6)
    assert math.isclose(eight["lr"], 0.8)
    assert math.isclose(six["lr"], 0.6)


def test_world_size_mode_equals_the_rule_with_the_per_device_batch_as_base() -> None:
    seed = sdk.scale_config(batch_size=512, lr=0.05, scale_by="world_size", world_size=8)
    rule = sdk.scale_config(batch_size=512, lr=0.05, base_batch_size=64, world_size=8)
    assert seed["lr"] == rule["lr"]


def test_uses_the_job_world_size_and_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "8")
    out = sdk.scale_config({"seed": 1}, batch_size=256, lr=0.1)
    assert (out["batch_size"], out["world_size"], out["rank"], out["local_rank"]) == (32, 8, 2, 0)
    assert out["lr"] == 0.1
    assert out["is_main_process"] is False
    assert out["seed"] == 1


def test_single_process_is_identity() -> None:
    out = sdk.scale_config(None, batch_size=32, lr=0.5)
    assert (out["batch_size"], out["lr"], out["world_size"], out["is_main_process"]) == (
        32,
        0.5,
        1,
        True,
    )


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"batch_size": 3, "lr": 0.1, "world_size": 4}, "smaller than world_size"),
        ({"batch_size": 0, "lr": 0.1}, "batch_size"),
        ({"batch_size": 8.0, "lr": 0.1}, "batch_size"),
        ({"batch_size": True, "lr": 0.1}, "batch_size"),
        ({"batch_size": 8, "lr": 0.0}, "lr"),
        ({"batch_size": 8, "lr": float("nan")}, "lr"),
        ({"batch_size": 8, "lr": "0.1"}, "lr"),
        ({"batch_size": 8, "lr": 0.1, "world_size": 0}, "world_size"),
        ({"batch_size": 8, "lr": 0.1, "rule": "cubic"}, "rule"),
        ({"batch_size": 8, "lr": 0.1, "base_batch_size": 0}, "base_batch_size"),
        ({"batch_size": 8, "lr": 0.1, "scale_by": "nodes"}, "scale_by"),
        (
            {"batch_size": 8, "lr": 0.1, "scale_by": "world_size", "base_batch_size": 4},
            "base_batch_size applies",
        ),
    ],
)
def test_errors(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        sdk.scale_config(**kwargs)  # type: ignore[arg-type]


def test_job_config_is_none_without_a_server_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_JOB_CONFIG", raising=False)
    assert sdk.job_config() is None


def test_job_config_adds_the_rank_and_keeps_outputs_on_rank_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = {
        "batch_size": 16,
        "output_dir": "/out",
        "distributed": {"output_dir_key": "output_dir"},
    }
    monkeypatch.setenv("CORRAL_JOB_CONFIG", json.dumps(config))
    for key, value in {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(key, value)
    got = sdk.job_config()
    assert got is not None
    assert (got["rank"], got["world_size"], got["is_main_process"]) == (2, 4, False)
    assert got["output_dir"] == "/out/rank-2"
    assert got["batch_size"] == 16
    monkeypatch.setenv("RANK", "0")
    main = sdk.job_config()
    assert main is not None and main["output_dir"] == "/out" and main["is_main_process"]
