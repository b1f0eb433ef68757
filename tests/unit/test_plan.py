"""Launch plans: golden outputs per renderer, the env contract, and bad input."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from corral.cluster import Cluster, Host, load_cluster, parse_hostfile_text
from corral.contract import AGENT_VARS, CONTRACT_VARS
from corral.errors import ConfigError
from corral.plan.render import plan_job
from corral.plan.spec import JobSpec

GOLDEN = Path(__file__).parent / "golden"

HOSTFILE = """\
node1:2 interface=eth1
node2 slots=2 env.DATA=/data/shared
"""


def _remote() -> Cluster:
    return parse_hostfile_text(HOSTFILE, "hosts.txt")


def _spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        script="train.py",
        args=("--lr", "0.1", "a b"),
        job_id="job-1",
        python="/opt/py/bin/python",
        workdir="/srv/code",
        env={"WANDB_MODE": "offline"},
        run_dir="/var/runs",
        rdzv_timeout=120.0,
    )
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def _plan_json(spec: JobSpec, cluster: Cluster) -> list[dict[str, object]]:
    return [c.to_json() for c in plan_job(spec, cluster)]


CASES = {
    "torchrun_remote": lambda: (_spec(launcher="torchrun", master_addr="10.0.0.1"), _remote()),
    "python_remote": lambda: (_spec(launcher="python", master_addr="10.0.0.1"), _remote()),
    "torchrun_local": lambda: (
        _spec(launcher="torchrun", workdir=None, nproc_per_node=2, master_port=41000),
        load_cluster("local:2"),
    ),
    "python_local": lambda: (
        _spec(launcher="python", workdir=None, nproc_per_node=2, master_port=41000),
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


def test_torchrun_uses_c10d_with_explicit_timeouts_and_no_node_rank() -> None:
    commands = plan_job(_spec(launcher="torchrun", master_addr="10.0.0.1"), _remote())
    for cmd in commands:
        argv = list(cmd.argv)
        assert "--rdzv-backend=c10d" in argv
        assert "--rdzv-endpoint=10.0.0.1:29500" in argv
        assert "--rdzv-id=job-1" in argv
        assert "--nnodes=2" in argv and "--nproc-per-node=2" in argv
        assert not any(a.startswith("--node-rank") or a.startswith("--node_rank") for a in argv)
        conf = next(a for a in argv if a.startswith("--rdzv-conf="))
        assert "join_timeout=120" in conf and "read_timeout=60" in conf
        assert argv[-3:] == ["--lr", "0.1", "a b"]  # arguments verbatim, never a shell string
    # exactly one node hosts the rendezvous store
    hosts = [a for c in commands for a in c.argv if a.startswith("--rdzv-conf=")]
    assert sum("is_host=1" in a for a in hosts) == 1


def test_python_launcher_assigns_contiguous_ranks_with_full_contract() -> None:
    commands = plan_job(_spec(launcher="python", master_addr="10.0.0.1"), _remote())
    ranks = [(c.node_rank, r.rank, r.local_rank) for c in commands for r in c.ranks]
    assert ranks == [(0, 0, 0), (0, 1, 1), (1, 2, 0), (1, 3, 1)]
    for cmd in commands:
        for proc in cmd.ranks:
            env = {**cmd.env, **proc.env}
            for key in CONTRACT_VARS:
                if key in AGENT_VARS:  # the node agent's, made when it starts
                    assert key not in env, key
                else:
                    assert key in env, key
            assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2"
            assert env["NODE_RANK"] == str(cmd.node_rank) and env["NNODES"] == "2"
            assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29500"
            assert env["CORRAL_JOB_ID"] == "job-1" and env["CORRAL_ATTEMPT"] == "0"


def test_only_requested_env_is_forwarded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_TOKEN", "do-not-leak")
    commands = plan_job(_spec(launcher="python", master_addr="10.0.0.1"), _remote())
    allowed = set(CONTRACT_VARS) | {
        "WANDB_MODE",
        "DATA",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "CORRAL_NODE_DIR",
        "CORRAL_HOST",
    }
    for cmd in commands:
        env = {**cmd.env, **{k: v for r in cmd.ranks for k, v in r.env.items()}}
        assert "SECRET_TOKEN" not in env
        assert set(env) <= allowed, set(env) - allowed
    node1, node2 = commands
    assert node1.env["NCCL_SOCKET_IFNAME"] == "eth1" == node1.env["GLOO_SOCKET_IFNAME"]
    assert "NCCL_SOCKET_IFNAME" not in node2.env
    assert node2.env["DATA"] == "/data/shared" and "DATA" not in node1.env
    assert node1.env["WANDB_MODE"] == "offline" == node2.env["WANDB_MODE"]


def test_interface_options_override_hostfile() -> None:
    commands = plan_job(
        _spec(
            launcher="python", master_addr="10.0.0.1", nccl_interface="ib0", gloo_interface="eth9"
        ),
        _remote(),
    )
    assert all(c.env["NCCL_SOCKET_IFNAME"] == "ib0" for c in commands)
    assert all(c.env["GLOO_SOCKET_IFNAME"] == "eth9" for c in commands)


def test_attempt_is_part_of_the_env_and_the_control_socket_is_not_planned() -> None:
    cmd = plan_job(_spec(launcher="python", master_addr="10.0.0.1"), _remote(), attempt=3)[1]
    assert cmd.env["CORRAL_ATTEMPT"] == "3"
    # the agent makes a private socket and token per attempt: nothing guessable is planned
    planned = {**cmd.env, **{k: v for r in cmd.ranks for k, v in r.env.items()}}
    assert not set(AGENT_VARS) & set(planned)
    assert not any("unix:" in value for value in planned.values())


@pytest.mark.parametrize("key", ["CORRAL_CONTROL", "CORRAL_CONTROL_TOKEN"])
def test_the_agent_vars_cannot_be_overridden(key: str) -> None:
    with pytest.raises(ConfigError, match=key) as err:
        plan_job(_spec(env={key: "unix:/tmp/mine"}), _remote())
    assert err.value.option == "--env"


def test_loopback_master_refused_for_real_hosts() -> None:
    with pytest.raises(ConfigError, match="loopback") as err:
        plan_job(_spec(master_addr="127.0.0.1"), _remote())
    assert err.value.option == "--master-addr"
    with pytest.raises(ConfigError, match="loopback"):
        plan_job(_spec(master_addr="localhost"), _remote())


def test_loopback_master_fine_for_local_cluster_and_single_host() -> None:
    plan_job(_spec(workdir=None), load_cluster("local:3"))
    single = Cluster((Host("solo", slots=2),))
    plan_job(_spec(master_addr="127.0.0.1"), single)


def test_master_defaults_to_first_host_and_names_the_rendezvous_host() -> None:
    commands = plan_job(_spec(launcher="torchrun"), _remote())
    assert all(c.master_addr == "node1" for c in commands)
    commands = plan_job(_spec(launcher="torchrun", master_addr="node2"), _remote())
    assert [c.hosts_master for c in commands] == [False, True]


@pytest.mark.parametrize(
    ("kwargs", "match", "option"),
    [
        ({"nproc_per_node": 0}, "at least 1", "--nproc-per-node"),
        ({"launcher": "mpirun"}, "unknown launcher", "--launcher"),
        ({"env": {"RANK": "3"}}, "set by corral", "--env"),
        ({"master_port": 70000}, "not a TCP port", "--master-port"),
    ],
)
def test_bad_specs_are_config_errors(kwargs: dict[str, object], match: str, option: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        plan_job(_spec(master_addr="10.0.0.1", **kwargs), _remote())
    assert err.value.option == option


def test_nproc_per_node_overrides_slots() -> None:
    commands = plan_job(
        _spec(launcher="python", master_addr="10.0.0.1", nproc_per_node=3), _remote()
    )
    assert [c.nproc for c in commands] == [3, 3]
    assert commands[1].ranks[0].rank == 3


def test_local_nodes_get_their_own_working_directory() -> None:
    commands = plan_job(_spec(workdir=None), load_cluster("local:2"))
    assert commands[0].cwd == "/var/runs/job-1/nodes/local-0/work"
    assert commands[1].cwd == "/var/runs/job-1/nodes/local-1/work"
