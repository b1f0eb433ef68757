"""Semi-synchronous training's settings and how corral chooses H (issue 33 item 4)."""

from __future__ import annotations

import pytest

from corral.contract import FT_SYNC_ENV, FT_SYNC_EVERY_ENV
from corral.sdk._ftsync import MAX_EVERY, choose_every, parse_sync


@pytest.mark.parametrize(
    ("sync_s", "step_s", "expected"),
    [
        (1.0, 0.02, MAX_EVERY),  # 2.5 MB over 20 Mbit/s (1 s) at 20 ms a step: the cap
        (0.5, 0.1, 50),  # a sync may cost 10 % of the 50 steps between syncs
        (0.0101, 0.1, 2),  # just over one step's 10 %: two steps
        (0.01, 0.1, 1),  # exactly one step's 10 %
        (0.002, 0.1, 1),  # a fast link: every step, as DDP
        (0.0, 0.0, 1),
        (0.1, 0.0, MAX_EVERY),  # steps that cost nothing: as rarely as allowed
    ],
)
def test_h_makes_a_sync_cost_at_most_a_tenth_of_the_steps_between(
    sync_s: float, step_s: float, expected: int
) -> None:
    every = choose_every(sync_s, step_s)
    assert every == expected
    if 1 < every < MAX_EVERY:  # the smallest H that keeps the overhead at 10 %
        assert sync_s <= 0.1 * every * step_s + 1e-12
        assert sync_s > 0.1 * (every - 1) * step_s


def test_h_rule_options_and_bad_times() -> None:
    assert choose_every(1.0, 0.1, overhead=0.5) == 20
    assert choose_every(1.0, 0.001, most=64) == 64
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite and non-negative"):
            choose_every(bad, 0.1)
    with pytest.raises(ValueError, match="overhead must be positive"):
        choose_every(1.0, 0.1, overhead=0)


def test_the_mode_and_h_come_from_the_arguments_else_the_environment() -> None:
    env = {FT_SYNC_ENV: "DiLoCo", FT_SYNC_EVERY_ENV: "50"}
    assert parse_sync(None, None, {}) == ("ddp", None)
    assert parse_sync(None, None, env) == ("diloco", 50)
    assert parse_sync("localsgd", None, {FT_SYNC_EVERY_ENV: "auto"}) == ("localsgd", None)
    assert parse_sync("localsgd", 8, env) == ("localsgd", 8)
    # the script's sync="ddp" wins over the environment, whose H is then not used
    assert parse_sync("ddp", None, env) == ("ddp", None)


def test_bad_sync_settings_are_named() -> None:
    with pytest.raises(ValueError, match=r"CORRAL_FT_SYNC: 'sgd' is not one of ddp, diloco"):
        parse_sync(None, None, {FT_SYNC_ENV: "sgd"})
    with pytest.raises(ValueError, match=r"CORRAL_FT_SYNC_EVERY: 'ten' is not a whole number"):
        parse_sync("diloco", None, {FT_SYNC_EVERY_ENV: "ten"})
    with pytest.raises(ValueError, match=r"every=: 0 must be at least 1 step"):
        parse_sync("diloco", 0, {})
    with pytest.raises(ValueError, match=r"every=: 4 needs sync='diloco' or 'localsgd'"):
        parse_sync("ddp", 4, {})
    with pytest.raises(ValueError, match=r"CORRAL_FT_SYNC_EVERY: 50 needs sync='diloco'"):
        parse_sync(None, None, {FT_SYNC_EVERY_ENV: "50"})
