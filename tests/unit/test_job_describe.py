"""The one job description (:mod:`corral.job.describe`): serialised and read back
exactly, versioned, secret env values never in its JSON; the supervisor's stdin
handover; the launch requests older servers stored, read back."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from corral.cluster.model import Cluster, Host
from corral.errors import ConfigError
from corral.job.describe import VERSION, JobDescription, JobOptions
from corral.redact import REDACTED
from corral.service.launch import handover, received, stored_description
from corral.transport.options import SshOptions

EVERY_OPTION: dict[str, Any] = {
    "command": ("train.py", "--lr", "0.1"),
    "launcher": "accelerate",
    "python": "/venv/bin/python",
    "nproc_per_node": 4,
    "master_addr": "10.0.0.1",
    "master_port": 29611,
    "workdir": "/srv/proj",
    "env": {"PLAIN": "1", "HF_TOKEN": "hf_secret", "MY_PHRASE": "swordfish"},
    "secret_env": ("MY_PHRASE",),
    "nccl_interface": "eth1",
    "gloo_interface": "eth2",
    "timeout": 600.0,
    "collective_timeout": 90.0,
    "checkpoint_dir": "/ckpt",
    "run_dir": "/runs",
    "rdzv_timeout": 120.0,
    "job_id": "j-every",
    "name": "every-option",
    "owner": "alice",
    "mlx_backend": "jaccl",
    "shared_data_path": "/data",
    "command_template": "echo {host}",
    "tags": "pyt_bert",
    "additional_args": "--live-output",
    "harness": True,
    "lr_scaling": "sqrt",
    "qos": "bulk",
    "workload_weights": (0.75, 0.25),
    "preflight": False,
    "smoke_test": True,
    "check_links": True,
    "links_min_ratio": 0.5,
    "links_min_gbs": 2.5,
    "links_warn_only": True,
    "min_free_gb": 7.0,
    "consistency_threshold": 0.5,
    "exclude_divergent": True,
    "code_dir": "src",
    "sync": True,
    "sync_script": "sync.sh",
    "max_restarts": 3,
    "restart_backoff": 2.0,
    "min_nodes": 1,
    "host_timeout": 9.0,
    "hang_timeout": 30.0,
    "replicate_checkpoints": True,
    "grace": 4.0,
    "recovery": "in-place",
    "spares": 1,
    "ft_sync": "diloco",
    "ft_sync_every": 25,
    "ft_join_timeout": 30.0,
    "track": ("mlflow", "tensorboard"),
    "rebalance": True,
}


def full_description() -> JobDescription:
    """A description with every field of every part set to something not its default."""
    defaults = JobOptions()
    missing = [f.name for f in dataclasses.fields(JobOptions) if f.name not in EVERY_OPTION]
    assert not missing, f"give the new JobOptions fields a value here: {missing}"
    options = JobOptions(**EVERY_OPTION)
    assert all(getattr(options, k) != getattr(defaults, k) for k in EVERY_OPTION)
    hosts = (
        Host(
            name="gpu1",
            address="10.0.0.1",
            slots=8,
            port=2222,
            user="ml",
            env={"NCCL_DEBUG": "INFO"},
            interface="eth1",
            labels={"gpu": "a100", "rack": "r1"},
            local=False,
            python="/opt/py/bin/python",
        ),
        Host(name="sim", local=True, labels={"kind": "sim"}),
    )
    ssh = SshOptions(
        user="ml",
        key="~/.ssh/id_ed25519",
        port=2200,
        password_env="SSH_PW",
        config="~/.ssh/config",
        accept_new_host_keys=True,
        insecure_no_host_key_check=True,
    )
    assert all(getattr(ssh, f.name) != f.default for f in dataclasses.fields(SshOptions)), (
        "every SshOptions field set"
    )
    return JobDescription(options, Cluster(hosts, source="gpu1,sim"), ssh)


def test_a_full_description_round_trips_through_json_exactly() -> None:
    described = full_description()
    text = described.to_json()
    back = JobDescription.from_json(text, described.secrets())
    assert back == described
    assert back.withheld == ()
    # the types as written in code: tuples, frozen mappings, labels
    assert isinstance(back.options.command, tuple)
    assert isinstance(back.options.workload_weights, tuple)
    assert isinstance(back.options.track, tuple)
    assert isinstance(back.cluster.hosts, tuple)
    assert dict(back.cluster.hosts[0].labels) == {"gpu": "a100", "rack": "r1"}
    assert back.cluster.hosts[1].address == "127.0.0.1"
    # and once more: the JSON of what was read is the JSON that was written
    assert back.to_json() == text
    assert json.loads(text)["version"] == VERSION


def test_secret_env_values_are_never_serialised_only_their_names() -> None:
    described = full_description()
    text = described.to_json()
    assert "hf_secret" not in text and "swordfish" not in text
    data = json.loads(text)
    assert data["withheld"] == ["HF_TOKEN", "MY_PHRASE"]
    assert data["options"]["env"] == {"PLAIN": "1"}
    assert described.secrets() == {"HF_TOKEN": "hf_secret", "MY_PHRASE": "swordfish"}
    # read without them: the description says what it lacks and will not run
    lacking = JobDescription.from_json(text)
    assert lacking.withheld == ("HF_TOKEN", "MY_PHRASE")
    assert "HF_TOKEN" not in lacking.options.env
    with pytest.raises(ConfigError, match="secret env HF_TOKEN, MY_PHRASE were not given"):
        lacking.complete()


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_another_version_is_refused_with_the_reason(version: object) -> None:
    data = full_description().to_dict()
    data["version"] = version
    if version is None:
        del data["version"]
    with pytest.raises(ConfigError, match=r"is not one this corral reads \(it reads version 1\)"):
        JobDescription.from_dict(data)


@pytest.mark.parametrize(
    ("where", "field"),
    [(("options",), "max_restart"), (("cluster", "hosts", 0), "slot"), (("ssh",), "pasword")],
)
def test_an_unknown_field_is_refused_by_name(where: tuple[str | int, ...], field: str) -> None:
    data = full_description().to_dict()
    part: Any = data
    for key in where:
        part = part[key]
    part[field] = 1
    dotted = ".".join(str(k) for k in (*where, field))
    with pytest.raises(ConfigError, match=f"job description: {dotted}: Unexpected"):
        JobDescription.from_dict(data)


def test_the_supervisor_reads_the_description_and_its_secrets_from_stdin() -> None:
    described = full_description()
    sent = handover(described)
    payload = json.loads(sent)
    assert payload["description"] == described.to_dict()
    assert received(sent) == described
    with pytest.raises(ConfigError, match="HF_TOKEN"):
        received(json.dumps({"description": described.to_dict(), "secrets": {}}))
    with pytest.raises(ConfigError, match="expected"):
        received(b"{}")
    without_id = dataclasses.replace(described.options, job_id=None)
    with pytest.raises(ConfigError, match=r"options\.job_id"):
        received(handover(dataclasses.replace(described, options=without_id)))


def old_launch_request(**fields: Any) -> dict[str, Any]:
    """A ``launch`` column as corral serve stored it before the description (its
    LaunchRequest's JSON, secret values redacted)."""
    return {
        "job_id": "j-old",
        "run_dir": "/runs",
        "script": "/srv/train.py",
        "args": ["--steps", "3"],
        "launcher": "python",
        "command_template": None,
        "python": None,
        "nproc_per_node": 2,
        "master_addr": None,
        "master_port": 29517,
        "workdir": None,
        "env": {"PLAIN": "1"},
        "secret_env": [],
        "nccl_interface": None,
        "gloo_interface": None,
        "timeout": None,
        "rdzv_timeout": 300.0,
        "hosts": [
            {
                "name": "a",
                "address": "",
                "port": None,
                "user": None,
                "slots": 2,
                "local": True,
                "python": None,
                "labels": {"k": "v"},
            }
        ],
        "ssh": {
            "user": None,
            "key": None,
            "port": None,
            "password_env": None,
            "config": None,
            "accept_new_host_keys": False,
            "insecure_no_host_key_check": False,
        },
        "preflight": False,
        "smoke_test": False,
        "sync": False,
        "code_dir": "/srv",
        "max_restarts": 1,
        "restart_backoff": 1.0,
        "min_nodes": None,
        "host_timeout": 20.0,
        "hang_timeout": None,
        "checkpoint_dir": None,
        "replicate_checkpoints": False,
        "grace": 10.0,
        "workload_weights": [0.5, 0.5],
        "rebalance": True,
        **fields,
    }


def test_a_launch_request_an_older_server_stored_is_read_as_a_description() -> None:
    described = stored_description(old_launch_request())
    options = described.options
    assert options.command == ("/srv/train.py", "--steps", "3")
    assert (options.job_id, options.run_dir, options.launcher) == ("j-old", "/runs", "python")
    assert (options.max_restarts, options.code_dir, options.preflight) == (1, "/srv", False)
    assert options.workload_weights == (0.5, 0.5) and options.rebalance
    assert described.cluster.hosts == (Host("a", slots=2, local=True, labels={"k": "v"}),)
    assert described.ssh == SshOptions()
    assert described.withheld == ()
    # a new stored description reads the same way
    assert stored_description(described.to_dict()) == described


def test_an_old_launch_request_with_redacted_secrets_lacks_them() -> None:
    old = old_launch_request(env={"PLAIN": "1", "HF_TOKEN": REDACTED})
    described = stored_description(old)
    assert described.withheld == ("HF_TOKEN",)
    assert dict(described.options.env) == {"PLAIN": "1"}


def test_an_unreadable_stored_plan_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match="unknown fields bogus"):
        stored_description(old_launch_request(bogus=1))
    with pytest.raises(ConfigError, match="version None is not one this corral reads"):
        stored_description({"something": "else"})
