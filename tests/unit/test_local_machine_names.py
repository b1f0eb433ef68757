"""A local machine registered without a name is named as ``--hosts local:N`` names
its nodes (``local-0``, ``local-1``, ...); machines named before keep their names."""

from __future__ import annotations

from corral.client.machines import free_local_name
from corral.cluster import load_cluster


def test_an_unnamed_local_machine_is_named_like_a_local_n_node() -> None:
    nodes = [h.name for h in load_cluster("local:3").hosts]
    taken: list[dict[str, str]] = []
    for _ in nodes:
        taken.append({"name": free_local_name(taken)})
    assert [m["name"] for m in taken] == nodes == ["local-0", "local-1", "local-2"]


def test_names_given_before_are_left_as_they_are() -> None:
    older = [{"name": "local1"}, {"name": "local2"}, {"name": "local-0"}]
    assert free_local_name(older) == "local-1"
