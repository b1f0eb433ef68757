"""The pure side of carrying state through a heal (``corral.sdk._ftstate``): digests,
the comparison that names what differs, what may be carried."""

from __future__ import annotations

from typing import Any

import pytest

from corral.sdk._ftstate import Carried, RNGState, digest, mismatches


class Position:
    def __init__(self, at: int = 0) -> None:
        self.at = at

    def state_dict(self) -> dict[str, Any]:
        return {"at": self.at, "seen": [self.at, (1, 2.5)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.at = state["at"]


def test_equal_states_have_equal_digests_and_any_change_shows() -> None:
    assert digest({"a": 1, "b": [1.0, "x"]}) == digest({"b": [1.0, "x"], "a": 1})
    assert digest({"a": 1}) != digest({"a": 2})
    assert digest({"lr": 0.1}) != digest({"lr": 0.1 + 1e-12})
    assert 0 <= digest({"a": 1}) < 2**48  # sums exactly in an int64 all-reduce


def test_mismatches_name_the_objects_and_the_groups() -> None:
    names = ["model", "optimizer", "scheduler", "sampler"]
    rows = [[1, 7, 8, 9, 5], [0, 7, 8, 3, 5], [2, 7, 8, 9, 5]]
    assert mismatches(names, rows) == [
        "'scheduler' (group 0: 000000000003, group 1: 000000000009, group 2: 000000000009)"
    ]
    assert mismatches(names, [[0, 1, 2, 3, 4], [1, 1, 2, 3, 4]]) == []


def test_carried_objects_snapshot_and_load_copies() -> None:
    sampler = Position(4)
    carried = Carried({"sampler": sampler})
    snap = carried.snapshot()
    sampler.at = 9  # the snapshot is a copy: training on does not change it
    assert snap == {"sampler": {"at": 4, "seen": [4, (1, 2.5)]}}
    carried.load(snap)
    assert sampler.at == 4
    assert carried.names() == ["model", "optimizer", "sampler"]
    with pytest.raises(KeyError, match="every group must pass the same state= names"):
        carried.load({})


def test_what_cannot_be_carried_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"state\['rng'\]: a int has no state_dict"):
        Carried({"rng": 3})
    with pytest.raises(ValueError, match="'model' cannot name a state object"):
        Carried({"model": Position()})
    assert not Carried(None)


def test_python_rng_stream_round_trips() -> None:
    import random

    class NoTorch(RNGState):
        def _gen(self) -> Any:  # torch's generator stands in for itself here
            class Gen:
                state = b"s"

                def get_state(self) -> bytes:
                    return self.state

                def set_state(self, state: bytes) -> None:
                    self.state = state

            return Gen()

    rng = NoTorch(python=True)
    saved = rng.state_dict()
    first = random.random()
    rng.load_state_dict(saved)
    assert random.random() == first
