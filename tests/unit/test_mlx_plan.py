"""The ``mlx`` launcher: golden plans, MLX's ring hostfile, bad input, and the rank
side (hostfile writing, backend refusal, the lost-peer grace)."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from corral.agent import mlx_env
from corral.cluster import Cluster, Host, load_cluster
from corral.errors import ConfigError
from corral.plan.launchers.mlx import MlxOptions, ring_hostfile
from corral.plan.render import plan_job
from corral.plan.spec import JobSpec
from tests.conftest import require
from tests.unit.test_plan import GOLDEN, _plan_json, _remote
from tests.unit.test_plan import _spec as _plan_spec

RING = [["node1:29501"], ["node1:29502"], ["node2:29503"], ["node2:29504"]]


def _spec(**kw: object) -> JobSpec:
    return _plan_spec(**{"launcher": "mlx", **kw})


CASES = {
    "mlx_remote": lambda: (_spec(master_addr="node1"), _remote()),
    "mlx_local": lambda: (
        _spec(workdir=None, nproc_per_node=2, master_port=41000),
        load_cluster("local:2"),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_matches_golden(case: str) -> None:
    spec, cluster = CASES[case]()
    spec = dataclasses.replace(spec, launch_dir="/")  # local nodes' CORRAL_LAUNCH_DIR
    got = _plan_json(spec, cluster)
    path = GOLDEN / f"plan_{case}.json"
    if os.environ.get("CORRAL_UPDATE_GOLDEN") == "1":
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())


def test_every_rank_is_started_by_corral_with_mlx_env_and_the_ring_hostfile() -> None:
    commands = plan_job(_spec(master_addr="node1"), _remote())
    for cmd in commands:
        assert list(cmd.argv) == [
            "/opt/py/bin/python", "-u", "-m", "corral.agent.worker", "train.py",
            "--lr", "0.1", "a b",
        ]  # fmt: skip
        assert json.loads(cmd.env["CORRAL_MLX_HOSTS"]) == RING
        assert cmd.env["CORRAL_MLX_BACKEND"] == "ring"
        assert cmd.env["CORRAL_MLX_INIT_TIMEOUT"] == "120"
        assert cmd.env["WORLD_SIZE"] == "4" and cmd.env["LOCAL_WORLD_SIZE"] == "2"
        assert cmd.env["NODE_RANK"] == str(cmd.node_rank)
        assert "MLX_HOSTFILE" not in cmd.env  # the rank writes it (planning is pure)
        assert not cmd.hosts_master  # nothing listens at the master port: no probe
    ranks = [(r.rank, r.local_rank, dict(r.env)) for c in commands for r in c.ranks]
    assert ranks == [
        (g, g % 2, {"RANK": str(g), "LOCAL_RANK": str(g % 2), "MLX_RANK": str(g)}) for g in range(4)
    ]


def test_ring_ports_are_per_global_rank_so_local_nodes_never_collide() -> None:
    assert ring_hostfile([("127.0.0.1", 2), ("127.0.0.1", 3)], 40000) == [
        [f"127.0.0.1:{40001 + r}"] for r in range(5)
    ]
    commands = plan_job(_spec(workdir=None, master_port=41000), load_cluster("local:3"))
    entries = [e for e in json.loads(commands[0].env["CORRAL_MLX_HOSTS"]) for e in e]
    assert len(set(entries)) == len(entries) == 3


def test_a_single_rank_needs_no_hostfile() -> None:
    (cmd,) = plan_job(_spec(nproc_per_node=1), Cluster((Host("solo"),)))
    assert "CORRAL_MLX_HOSTS" not in cmd.env and cmd.env["WORLD_SIZE"] == "1"


def test_jaccl_gets_the_coordinator_on_node_zero() -> None:
    spec = _spec(
        launcher_options=MlxOptions("jaccl"),
        nproc_per_node=1,
        env={"MLX_IBV_DEVICES": "/etc/mlx/ibv.json"},
    )
    commands = plan_job(spec, _remote())
    assert [c.env["MLX_JACCL_COORDINATOR"] for c in commands] == ["node1:29500"] * 2
    assert all("CORRAL_MLX_HOSTS" not in c.env for c in commands)
    assert [c.env["CORRAL_MLX_BACKEND"] for c in commands] == ["jaccl"] * 2


@pytest.mark.parametrize(
    ("kwargs", "match", "option"),
    [
        ({"launcher_options": MlxOptions("nccl")}, "unknown MLX backend 'nccl'", "--mlx-backend"),
        ({"launcher_options": MlxOptions("mpi")}, "started by mpirun", "--mlx-backend"),
        (
            {"launcher_options": MlxOptions("jaccl"), "nproc_per_node": 1},
            "MLX_IBV_DEVICES=FILE",
            "--env",
        ),
        (
            {"launcher_options": MlxOptions("jaccl"), "env": {"MLX_IBV_DEVICES": "/x"}},
            "one rank per host",
            "--nproc-per-node",
        ),
        ({"env": {"MLX_RANK": "3"}}, "MLX_RANK is set by corral", "--env"),
        ({"env": {"MLX_HOSTFILE": "/h.json"}}, "MLX_HOSTFILE is set by corral", "--env"),
        ({"master_port": 65533}, "ports 65534-65537", "--master-port"),
    ],
)
def test_bad_mlx_specs_are_config_errors(
    kwargs: dict[str, object], match: str, option: str
) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        plan_job(_spec(**kwargs), _remote())
    assert err.value.option == option


def test_ipv6_hosts_are_refused_for_the_ring() -> None:
    cluster = Cluster((Host("a", address="fd00::1"), Host("b", address="fd00::2")))
    with pytest.raises(ConfigError, match="IPv4 addresses or host names, not fd00::1") as err:
        plan_job(_spec(master_addr="fd00::1"), cluster)
    assert err.value.option == "--hosts"


# -- rank side -------------------------------------------------------------------------


def test_the_hostfile_is_written_private_and_per_rank_and_attempt(tmp_path: Path) -> None:
    path = mlx_env.hostfile_path(str(tmp_path), "2", 3)
    assert path == str(tmp_path / "mlx" / "hostfile-attempt-2-rank-3.json")
    assert mlx_env.write_hostfile(json.dumps(RING), path) == path
    assert json.loads(Path(path).read_text()) == RING
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "mlx").st_mode) == 0o700
    assert os.listdir(tmp_path / "mlx") == ["hostfile-attempt-2-rank-3.json"]


def _rank_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "CORRAL_HOST": "hostA",
        "CORRAL_NODE_DIR": str(tmp_path),
        "CORRAL_ATTEMPT": "0",
        **extra,
    }


def test_an_unavailable_backend_is_refused_naming_the_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mx = require("mlx.core", "the mlx extra")
    if mx.distributed.is_available("jaccl"):
        pytest.skip("jaccl is available here (macOS with RDMA): nothing to refuse")
    env = _rank_env(tmp_path, CORRAL_MLX_BACKEND="jaccl")
    assert mlx_env.prepare(env) == mlx_env.REFUSED
    err = capsys.readouterr().err
    assert "corral: MLX's jaccl backend is not available on hostA" in err
    assert "--mlx-backend ring" in err


def test_a_corrupt_hostfile_is_refused_before_mlx_sees_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require("mlx.core", "the mlx extra")
    env = _rank_env(tmp_path, CORRAL_MLX_BACKEND="ring", CORRAL_MLX_HOSTS="[[not json")
    assert mlx_env.prepare(env) == mlx_env.REFUSED
    assert "cannot write MLX's hostfile" in capsys.readouterr().err
    assert "MLX_HOSTFILE" not in env


def test_a_single_rank_runs_without_connecting(tmp_path: Path) -> None:
    require("mlx.core", "the mlx extra")
    env = _rank_env(tmp_path, CORRAL_MLX_BACKEND="ring", WORLD_SIZE="1", RANK="0")
    assert mlx_env.prepare(env) is None
    assert "MLX_HOSTFILE" not in env


@pytest.mark.parametrize(
    ("message", "waits"),
    [("[ring] connection to a peer was lost", True), ("bad batch on rank 1", False)],
)
def test_a_rank_that_lost_a_peer_waits_before_it_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, message: str, waits: bool
) -> None:
    error_file = tmp_path / "err.json"
    error_file.write_text(json.dumps({"message": message}))
    monkeypatch.setenv("CORRAL_ERROR_FILE", str(error_file))
    slept: list[float] = []
    monkeypatch.setattr(mlx_env.time, "sleep", slept.append)
    mlx_env.linger_after_lost_peer(1.5)
    assert slept == ([1.5] if waits else [])
