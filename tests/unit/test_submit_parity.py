"""One job model: every field of the API's JobRequest has a ``corral job submit`` flag
(or is on an explicit list, with the reason), the fields the planner passes to
JobOptions as they are have the same name, default and flag as ``corral run``'s, and
the flags reach the request body (httpx's mock transport at the seam)."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from pydantic import ValidationError
from typer.testing import CliRunner

from corral.cli import job as cli_job
from corral.cli.main import _register, app
from corral.client import Client
from corral.errors import CorralError
from corral.job.describe import JobOptions
from corral.job.schema import options_of
from corral.service.models import (
    PASS_THROUGH,
    JobRequest,
)
from corral.service.planner import job_description
from corral.service.settings import ServerSettings
from tests.unit.test_service_planner import machine

from .request_fields import NESTED, field_paths

_register()

FLAG_OF: dict[str, str] = {
    "plugin_name": "--plugin",
    "preflight": "--no-preflight",
    "machine_selection": "--machine",  # manual when --machine is given
    "selected_machines": "--machine",
    "resource_requirements.num_machines": "--machines",
    "config_scaling.rule": "--lr-scaling",
}
"""The fields whose flag is not ``--`` + the field's name with dashes."""
NO_FLAG: dict[str, str] = {
    "script": "the SCRIPT argument after `--`",
    "args": "the ARGS after `-- SCRIPT`",
    "config_scaling.batch_size_key": "the config's key names: a JSON body sets them "
    "(the defaults are what corral.sdk.scale_config and the web form use)",
    "config_scaling.lr_key": "as config_scaling.batch_size_key",
    "config_scaling.output_dir_key": "as config_scaling.batch_size_key",
}
"""The fields without a flag of their own, and why."""


@functools.cache
def _root() -> Any:
    """The CLI's click command tree, built once (typer builds it anew on each call:
    ~0.04 CPU-s, for each of ~100 look-ups); the tests only read it."""
    return typer.main.get_command(app)


def _command(*path: str) -> Any:
    command: Any = _root()
    for name in path:
        command = command.commands[name]  # a group (typer's click, duck-typed)
    return command


def _flags(*path: str) -> set[str]:
    return {opt for p in _command(*path).params for opt in p.opts if opt.startswith("--")}


@pytest.mark.parametrize("field", field_paths())
def test_every_request_field_has_a_submit_flag(field: str) -> None:
    if field in NO_FLAG:
        return
    flag = FLAG_OF.get(field) or "--" + field.rsplit(".", 1)[-1].replace("_", "-")
    assert flag in _flags("job", "submit"), (
        f"JobRequest.{field} has no `corral job submit {flag}`: add the flag (cli/job.py) "
        "or list the field in NO_FLAG with the reason"
    )


def test_the_lists_name_only_real_fields() -> None:
    assert set(FLAG_OF) | set(NO_FLAG) <= set(field_paths()) | set(NESTED)


@pytest.mark.parametrize("name", PASS_THROUGH)
def test_a_pass_through_field_is_corral_runs_option(name: str) -> None:
    """Same name and default as JobOptions' field, same flag as ``corral run``'s."""
    defaults = {f.name: f.default for f in dataclasses.fields(JobOptions)}
    assert name in defaults
    assert JobRequest.model_fields[name].default == defaults[name]
    flag = {f.name: o.flag for f, o in options_of()}[name]
    assert flag in _flags("run") and flag in _flags("job", "submit")


def test_the_mlx_backends_are_the_engines() -> None:
    from typing import get_args

    from corral.plan.spec import MLX_BACKENDS

    assert get_args(JobRequest.model_fields["mlx_backend"].annotation) == MLX_BACKENDS
    with pytest.raises(ValidationError, match="unknown MLX backend 'tcp'; choose one of ring"):
        JobRequest(script="t.py", mlx_backend="tcp")


# -- the flags reach the body --------------------------------------------------------


def _submit(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[str, dict[str, Any]]:
    """Run ``corral job submit --plan-only ARGS`` against a mock server (it refuses
    every plan with "stop here"): the error it ended with and the body it posted."""
    posted: dict[str, Any] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        posted.update(json.loads(request.content))
        body = {"error": {"type": "invalid", "message": "stop here", "details": {}}}
        return httpx.Response(422, json=body)

    def connect(server: str, token_file: str | None) -> Client:
        return Client(server, "t0ken", transport=httpx.MockTransport(answer))

    monkeypatch.setattr(cli_job, "connect", connect)
    for name in [n for n in os.environ if n.startswith("CORRAL_")]:
        monkeypatch.delenv(name)
    result = CliRunner().invoke(app, ["job", "submit", "--plan-only", *args])
    assert isinstance(result.exception, CorralError), result.output
    return str(result.exception), posted


def test_every_new_flag_reaches_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    error, body = _submit(
        monkeypatch,
        *("--machines", "2", "--min-gpu-memory", "40", "--track", "tensorboard:tb"),
        *("--recovery", "in-place", "--spares", "1", "--master-port", "29600"),
        *("--sync", "--code-dir", "/srv/code"),
        *("--nccl-interface", "eth1", "--gloo-interface", "eth2", "--qos", "utility"),
        *("--shared-data-path", "/data", "--mlx-backend", "mpi", "--rdzv-timeout", "60"),
        *("--grace", "3", "--smoke-test", "--check-links", "--links-min-ratio", "0.5"),
        *("--links-min-gbs", "2", "--links-warn-only", "--min-free-gb", "5"),
        *("--consistency-threshold", "0.9", "--restart-backoff", "2", "--host-timeout", "9"),
        *("--replicate-checkpoints", "--workload-weights", "1,3", "--", "train.py", "-x"),
    )
    assert error == "stop here"  # the body was posted
    assert body["resource_requirements"] == {"num_machines": 2, "min_gpu_memory": 40.0}
    expected = {
        "track": ["tensorboard:tb"],
        "recovery": "in-place",
        "spares": 1,
        "master_port": 29600,
        "sync": True,
        "code_dir": "/srv/code",
        "nccl_interface": "eth1",
        "gloo_interface": "eth2",
        "qos": "utility",
        "shared_data_path": "/data",
        "mlx_backend": "mpi",
        "rdzv_timeout": 60.0,
        "grace": 3.0,
        "smoke_test": True,
        "check_links": True,
        "links_min_ratio": 0.5,
        "links_min_gbs": 2.0,
        "links_warn_only": True,
        "min_free_gb": 5.0,
        "consistency_threshold": 0.9,
        "restart_backoff": 2.0,
        "host_timeout": 9.0,
        "replicate_checkpoints": True,
        "workload_weights": [1.0, 3.0],
        "script": "train.py",
        "args": ["-x"],
    }
    assert {k: body.get(k) for k in expected} == expected


def test_the_defaults_are_left_out_of_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain submit sends only what it always sent (a server without the new fields
    still takes it)."""
    _, body = _submit(monkeypatch, "--", "train.py")
    assert set(body) == {
        "args",
        "launcher",
        "resource_requirements",
        "machine_selection",
        "selected_machines",
        "env",
        "secret_env",
        "preflight",
        "adjust_config",
        "script",
    }
    JobRequest.model_validate(body)


def test_a_plugin_takes_the_place_of_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    _, body = _submit(monkeypatch, "--plugin", "resnet", "--", "--epochs", "2")
    assert body["plugin_name"] == "resnet" and body["args"] == ["--epochs", "2"]
    assert "script" not in body


def test_lr_scaling_is_the_config_scaling_rule(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "c.json"
    config.write_text('{"batch_size": 8}')
    _, body = _submit(
        monkeypatch, "--config", str(config), "--adjust-config", "--lr-scaling", "sqrt", "--", "t"
    )
    assert body["config_scaling"] == {"rule": "sqrt"}
    error, body = _submit(monkeypatch, "--lr-scaling", "sqrt", "--", "t")
    assert body == {}
    assert error == "--lr-scaling: scales the --config: give --adjust-config too"


@pytest.mark.parametrize("weights", ["1,x", "1,0", "2,-1", "1,inf"])
def test_bad_weights_name_the_flag(monkeypatch: pytest.MonkeyPatch, weights: str) -> None:
    error, body = _submit(monkeypatch, "--workload-weights", weights, "--", "t")
    assert body == {}
    assert error.startswith("--workload-weights: ")


# -- the server: validated, then passed to JobOptions as they are -------------------


def test_the_planner_passes_the_fields_to_the_job_options(tmp_path: Path) -> None:
    given: dict[str, Any] = {
        "nccl_interface": "^docker,lo",
        "gloo_interface": "eth0",
        "shared_data_path": "/data",
        "mlx_backend": "jaccl",
        "qos": "background",
        "rdzv_timeout": 42.0,
        "grace": 0.0,
        "smoke_test": True,
        "check_links": True,
        "links_min_ratio": 0.1,
        "links_min_gbs": 3.5,
        "links_warn_only": True,
        "min_free_gb": 0.0,
        "consistency_threshold": 0.5,
        "restart_backoff": 0.0,
        "host_timeout": 5.0,
        "replicate_checkpoints": True,
        "collective_timeout": 60.0,
        "python": "/opt/py/bin/python",
        "master_port": 29600,
        "timeout": 30.0,
        "name": "nightly",
        "max_restarts": 2,
        "hang_timeout": 9.0,
        "preflight": False,
    }
    assert set(given) <= set(PASS_THROUGH)
    request = JobRequest(script="/srv/train.py", **given)
    machines = [machine("sim1", local=True)]
    options = job_description("j-p", request, machines, ServerSettings(run_dir=tmp_path)).options
    assert {name: getattr(options, name) for name in given} == given
    default = job_description("j-d", JobRequest(script="/srv/t.py"), machines, ServerSettings())
    assert all(getattr(default.options, n) == getattr(JobOptions(), n) for n in PASS_THROUGH)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("links_min_ratio", 1.0, "less than 1"),
        ("consistency_threshold", 0, "greater than 0"),
        ("host_timeout", 0, "greater than 0"),
        ("grace", -1, "greater than or equal to 0"),
        ("min_free_gb", -1, "greater than or equal to 0"),
        ("mlx_backend", "nccl", "unknown MLX backend 'nccl'; choose one of ring, mpi, jaccl"),
        ("qos", "fast", "unknown QoS class 'fast'; choose one of user_interactive"),
        ("nccl_interface", "eth0 eth1", "should match pattern"),
        ("gloo_interface", "", "at least 1 character"),
    ],
)
def test_a_bad_value_names_the_field(field: str, value: Any, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        JobRequest(script="t.py", **{field: value})
    (error,) = info.value.errors()
    assert error["loc"] == (field,) and message in error["msg"]
