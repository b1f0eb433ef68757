"""The actors runtime's side of the one builder (corral.job.build.ready_ranks): the
workers of a job description, planned as corral run plans its ranks, and the table of
docs/actors.md that says which options the actors runtime takes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from corral.cluster.model import Cluster, Host
from corral.errors import ConfigError
from corral.job.build import ready_ranks
from corral.job.describe import JobDescription
from corral.job.schema import JobOptions, options_of

DOC = (Path(__file__).parents[2] / "docs" / "actors.md").read_text(encoding="utf-8")


def test_the_docs_table_lists_what_the_actors_take() -> None:
    section = DOC.split("## The job's options", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z_]+)`(?:, `([a-z_]+)`)? \|", section, re.M))
    names = {name for pair in documented for name in pair if name}
    assert names == {item.name for item, _ in options_of("actors")}


def test_ssh_workers_get_the_jobs_env_in_rank_order() -> None:
    hosts = (
        Host(name="a", slots=2, env={"NODE": "a", "FOO": "node"}, interface="eth1"),
        Host(name="b", slots=1, env={"NODE": "b"}),
    )
    options = JobOptions(env={"FOO": "job", "BAR": "1"}, collective_timeout=9, job_id="j")
    ready = ready_ranks(JobDescription(options, Cluster(hosts=hosts)), "/w.py")
    assert [(r.host.name, r.rank, r.local_rank, r.node_rank) for r in ready.ranks] == [
        ("a", 0, 0, 0),
        ("a", 1, 1, 0),
        ("b", 2, 0, 1),
    ]
    first, _, last = (r.env for r in ready.ranks)
    assert first["FOO"] == "node" and last["FOO"] == "job"  # a host's own env wins
    assert first["NCCL_SOCKET_IFNAME"] == "eth1" and "NCCL_SOCKET_IFNAME" not in last
    assert {r.env["MASTER_PORT"] for r in ready.ranks} == {"29500"}  # no agent probes
    assert {r.env["MASTER_ADDR"] for r in ready.ranks} == {"a"} == {ready.master_addr}
    assert [r.env["CORRAL_DIST_TIMEOUT"] for r in ready.ranks] == ["9", "9", "9"]
    assert [r.env["WORLD_SIZE"] for r in ready.ranks] == ["3", "3", "3"]
    assert [r.env["RANK"] for r in ready.ranks] == ["0", "1", "2"]
    assert {r.env["CORRAL_JOB_ID"] for r in ready.ranks} == {"j"}
    assert ready.spec.script == "/w.py" and ready.spec.launcher == "python"


def test_a_launcher_or_a_script_of_ones_own_is_refused() -> None:
    """The builder says what each worker runs: a description that names it is refused."""
    cluster = Cluster(hosts=(Host(name="a"),))
    for options, flag in (
        (JobOptions(launcher="torchrun"), "--launcher"),
        (JobOptions(command=("train.py",)), "command"),
    ):
        with pytest.raises(ConfigError, match="work_fn") as caught:
            ready_ranks(JobDescription(options, cluster), "/w.py")
        assert caught.value.option == flag


def test_an_empty_list_is_the_default_of_a_tuple_field() -> None:
    """``track=[]`` (a list where the schema's default is ``()``) is not an option set."""
    cluster = Cluster(hosts=(Host(name="a"),))
    options = JobOptions(command=[], track=[], job_id="j")
    assert len(ready_ranks(JobDescription(options, cluster), "/w.py").ranks) == 1
