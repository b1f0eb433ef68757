"""One rule for an environment variable's name wherever corral sets one."""

from __future__ import annotations

import pytest

from corral.contract import is_env_name
from corral.errors import ConfigError
from corral.job.resolve import parse_env
from corral.k8s.render import K8sTarget, render_spec
from corral.plan.spec import JobSpec
from corral.slurm.render import SlurmJob, render_slurm
from corral.transport.ssh.command import build_command

BAD = ["", "1X", "A-B", "A.B", "A B", "Ä", "A\n", "A=B"]


@pytest.mark.parametrize("name", ["A", "_", "HF_TOKEN", "a1_b2"])
def test_a_posix_name_is_one(name: str) -> None:
    assert is_env_name(name)


@pytest.mark.parametrize("name", BAD)
def test_anything_else_is_not(name: str) -> None:
    assert not is_env_name(name)


@pytest.mark.parametrize("name", ["Ä", "A\n"])
def test_every_entry_point_refuses_what_a_shell_cannot_export(name: str) -> None:
    with pytest.raises(ConfigError, match="not a valid environment variable name"):
        parse_env([f"{name}=1"], environ={})
    with pytest.raises(ConfigError, match="not a valid environment variable name"):
        render_slurm(SlurmJob(script="t.py", forward_env=(name,)))
    with pytest.raises(ConfigError, match="not a valid environment variable name"):
        render_spec(JobSpec(script="t.py", env={name: "1"}), K8sTarget(image="i:1", nodes=1))
    with pytest.raises(ConfigError, match="invalid environment variable name"):
        build_command(["true"], env={name: "1"})
