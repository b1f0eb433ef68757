"""Each launcher is one module in one table; its options live with it; a spec is
versioned JSON that still loads with the flat launcher fields of before."""

from __future__ import annotations

import pytest

from corral.errors import ConfigError
from corral.job.build import job_spec
from corral.job.describe import JobOptions
from corral.plan.launchers import (
    LAUNCHER_TABLE,
    CommandOptions,
    MadengineOptions,
    MlxOptions,
    launcher_options,
)
from corral.plan.render import plan_job
from corral.plan.spec import LAUNCHERS, NODE_LAUNCHERS, JobSpec
from corral.plan.specjson import SPEC_VERSION, spec_from_json, spec_to_json
from tests.unit.test_plan import _remote


def test_the_table_holds_every_launcher_the_command_line_offers() -> None:
    assert tuple(LAUNCHER_TABLE) == LAUNCHERS
    assert tuple(n for n, k in LAUNCHER_TABLE.items() if k.runs_own_command) == NODE_LAUNCHERS
    for name, kind in LAUNCHER_TABLE.items():
        assert kind.name == name
        assert kind.options is None or name == kind.options.LAUNCHER


def test_flat_fields_become_the_launchers_own_options() -> None:
    flat = {"command_template": "echo {host}", "mlx_backend": "ring"}
    assert launcher_options("command", flat) == CommandOptions("echo {host}")
    assert launcher_options("mlx", {"mlx_backend": "jaccl"}) == MlxOptions("jaccl")
    assert launcher_options("torchrun", {"mlx_backend": "ring"}) is None  # a default: not given
    with pytest.raises(ConfigError) as err:
        launcher_options("torchrun", {"madengine_args": "--x"})
    assert err.value.option == "--additional-args" and "madengine only" in str(err.value)


def test_corral_run_options_build_typed_options() -> None:
    spec = job_spec(JobOptions(launcher="command", command_template="echo {node_rank}"))
    assert spec.launcher_options == CommandOptions("echo {node_rank}")
    with pytest.raises(ConfigError) as err:
        job_spec(JobOptions(command=("t.py",), launcher="python", mlx_backend="jaccl"))
    assert err.value.option == "--mlx-backend"
    with pytest.raises(ConfigError, match="CORRAL_BACKEND='mpi' is not a backend") as err:
        job_spec(JobOptions(command=("t.py",), env={"CORRAL_BACKEND": "mpi"}))
    assert err.value.option == "--env"


def test_a_spec_round_trips_through_json() -> None:
    spec = JobSpec(
        script="",
        launcher="madengine",
        launcher_options=MadengineOptions("pyt_x", "--live-output"),
        shared_data_path="/nfs",
        env={"A": "1"},
        workload_weights=(1.0, 2.0, 1.0, 2.0),
    )
    doc = spec_to_json(spec)
    assert doc["version"] == SPEC_VERSION
    assert doc["launcher_options"] == {"tags": "pyt_x", "args": "--live-output"}
    assert spec_from_json(doc) == spec
    assert plan_job(spec_from_json(doc), _remote())[1].argv == plan_job(spec, _remote())[1].argv


def test_a_spec_with_the_old_flat_fields_still_loads() -> None:
    old = {"script": "", "launcher": "command", "command_template": "run {node_rank}"}
    assert spec_from_json(old).launcher_options == CommandOptions("run {node_rank}")
    old = {"script": "t.py", "launcher": "mlx", "mlx_backend": "jaccl"}
    assert spec_from_json(old).launcher_options == MlxOptions("jaccl")


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"script": "t.py", "version": 99}, "version 99"),
        ({"script": "t.py", "colour": "red"}, "unknown field(s) colour"),
        ({"script": "t.py", "launcher_options": {"template": "x"}}, "takes no launcher_options"),
        ({"script": "", "launcher": "command", "launcher_options": {"x": 1}}, "'x'"),
    ],
)
def test_a_bad_spec_document_names_the_problem(doc: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        spec_from_json(doc, source="job.json")
    assert err.value.source == "job.json" and needle in str(err.value)
