"""create_nccl_configs and setup_nccl_env: ranks for even and uneven nodes."""

from __future__ import annotations

import pytest

from corral.actors import NCCLConfig, create_nccl_configs, setup_nccl_env
from corral.errors import ConfigError


def test_even_nodes() -> None:
    configs = create_nccl_configs("10.0.0.1", [("a", 4), ("b", 4)], 29500)
    assert [c.rank for c in configs] == list(range(8))
    assert [c.local_rank for c in configs] == [0, 1, 2, 3] * 2
    assert [c.node_rank for c in configs] == [0] * 4 + [1] * 4
    assert {(c.world_size, c.local_world_size) for c in configs} == {(8, 4)}
    assert {(c.master_addr, c.master_port, c.interface) for c in configs} == {
        ("10.0.0.1", 29500, None)
    }


def test_uneven_nodes_and_interfaces() -> None:
    configs = create_nccl_configs(
        "m", [("a", 3), ("b", 1), ("c", 2)], 1234, interfaces=["eth0", None, "ib0"]
    )
    got = [(c.rank, c.local_rank, c.local_world_size, c.node_rank, c.interface) for c in configs]
    assert got == [
        (0, 0, 3, 0, "eth0"),
        (1, 1, 3, 0, "eth0"),
        (2, 2, 3, 0, "eth0"),
        (3, 0, 1, 1, None),
        (4, 0, 2, 2, "ib0"),
        (5, 1, 2, 2, "ib0"),
    ]
    assert {c.world_size for c in configs} == {6}


@pytest.mark.parametrize(
    ("nodes", "port", "interfaces"),
    [([], 29500, None), ([("a", 0)], 29500, None), ([("a", 1)], 0, None), ([("a", 1)], 1, [])],
)
def test_bad_input_is_a_config_error(
    nodes: list[tuple[str, int]], port: int, interfaces: list[str | None] | None
) -> None:
    with pytest.raises(ConfigError):
        create_nccl_configs("m", nodes, port, interfaces=interfaces)


def test_setup_nccl_env_sets_what_env_init_reads() -> None:
    config = create_nccl_configs("m", [("a", 1), ("b", 2)], 2222, interfaces=[None, "eth1"])[2]
    env: dict[str, str] = {"NCCL_SOCKET_IFNAME": "keep"}
    setup_nccl_env(config.to_dict(), env)  # the seed sends config.__dict__ over the wire
    assert env == {
        "MASTER_ADDR": "m",
        "MASTER_PORT": "2222",
        "RANK": "2",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1",
        "NCCL_SOCKET_IFNAME": "eth1",
        "GLOO_SOCKET_IFNAME": "eth1",
    }
    unknown: dict[str, str] = {"NCCL_SOCKET_IFNAME": "keep"}
    setup_nccl_env(NCCLConfig(0, 0, 1, 1, 0, "m", 1), unknown)
    assert unknown["NCCL_SOCKET_IFNAME"] == "keep"  # no interface known: left alone
    assert NCCLConfig(**config.to_dict()) == config
