"""The pre-flight's software and collective checks for the launchers beyond torchrun:
what accelerate, --harness, mlx, madengine and command templates need on a host."""

from __future__ import annotations

import pytest

from corral.checks import smoke, software
from corral.checks.context import ChecklistOptions
from corral.checks.result import Status
from corral.job.options import CheckPolicy
from corral.job.preflight import checklist_options
from corral.plan.launchers import CommandOptions
from corral.plan.spec import JobSpec
from corral.transport.options import SshOptions

from .test_checks import _cluster, _ctx

Facts = dict[str, dict[str, object]]
NO_ACCELERATE: dict[str, object] = {"modules": {"accelerate": False, "mlx.core": False}}
WITH_MLX: dict[str, object] = {"modules": {"accelerate": False, "mlx.core": True}, "mlx": "0.32.4"}


def _with_mlx() -> Facts:
    return {"software": dict(WITH_MLX), "packages": {"mlx": "0.32.4"}}


def _everywhere(software_facts: dict[str, object]) -> dict[str, Facts]:
    """The same software facts on every host."""
    return {name: {"software": dict(software_facts)} for name in ("n1", "n2", "n3")}


def test_accelerate_fails_where_it_cannot_be_imported_with_the_pip_fix() -> None:
    per_host = {
        "n1": {"software": {"modules": {"accelerate": True}}, "packages": {"accelerate": "1.15.0"}},
        "n2": {"software": {"modules": {"accelerate": False}}},
        "n3": {"software": {"modules": {"accelerate": True}}, "packages": {"accelerate": "1.15.0"}},
    }
    result = software.check(_ctx(per_host, launcher="accelerate"))
    assert result.status is Status.FAIL
    assert result.hosts["n1"].status is Status.PASS
    detail = result.hosts["n2"].detail
    assert "accelerate cannot be imported by /usr/bin/python3 (--launcher accelerate)" in detail
    # the version the others have, once (not again as a version pin)
    assert result.fix_command is not None
    assert result.fix_command.count("accelerate==1.15.0") == 1
    assert "/usr/bin/python3 -m pip install accelerate==1.15.0  (on n2)" in result.fix_command


def test_accelerate_needs_torch_too() -> None:
    per_host = {
        "n3": {"software": {"torch": None, "modules": {"accelerate": False}}, "packages": {}},
    }
    result = software.check(_ctx(per_host, launcher="accelerate"))
    detail = result.hosts["n3"].detail
    assert "torch is not installed for /usr/bin/python3 (Accelerate needs it)" in detail
    assert "accelerate cannot be imported" in detail
    assert result.fix_command is not None
    assert "/usr/bin/python3 -m pip install torch==2.13.0+cpu  (on n3)" in result.fix_command


@pytest.mark.parametrize("launcher", ["python", "torchrun", "accelerate"])
def test_the_harness_needs_accelerate_under_any_launcher(launcher: str) -> None:
    with_harness = software.check(_ctx(_everywhere(NO_ACCELERATE), launcher=launcher, harness=True))
    assert with_harness.status is Status.FAIL
    assert all(
        "accelerate cannot be imported by /usr/bin/python3 (--harness sets up Accelerate)"
        in h.detail
        for h in with_harness.hosts.values()
    )
    without = software.check(_ctx(_everywhere(NO_ACCELERATE), launcher=launcher))
    assert without.hosts["n1"].status is (Status.FAIL if launcher == "accelerate" else Status.PASS)


def test_mlx_missing_everywhere_fails_each_host_and_torch_is_not_required() -> None:
    no_mlx: dict[str, object] = {"torch": None, "modules": {"mlx.core": False}}
    result = software.check(_ctx(_everywhere(no_mlx), launcher="mlx"))
    assert result.status is Status.FAIL
    for host in ("n1", "n2", "n3"):
        detail = result.hosts[host].detail
        assert "MLX is not installed for /usr/bin/python3 (--launcher mlx needs it" in detail
        assert "torch is not installed" not in detail
    assert result.fix_command is not None
    assert "/usr/bin/python3 -m pip install 'mlx[cpu]'  (on n1)" in result.fix_command

    ok = software.check(_ctx(_everywhere({**WITH_MLX, "torch": None}), launcher="mlx"))
    assert ok.status is Status.PASS, ok.error
    assert ok.hosts["n2"].detail == "python 3.11.7, mlx 0.32.4"


def test_mlx_fix_pins_the_others_version_and_uses_plain_mlx_on_macos() -> None:
    per_host = {
        "n1": _with_mlx(),
        "n2": _with_mlx(),
        "n3": {"software": {"modules": {"mlx.core": False}, "platform": "darwin"}},
    }
    result = software.check(_ctx(per_host, launcher="mlx"))
    assert [h for h, c in result.hosts.items() if c.status is Status.FAIL] == ["n3"]
    assert result.fix_command == "/usr/bin/python3 -m pip install mlx==0.32.4  (on n3)"


def test_madengine_missing_fails_with_its_install() -> None:
    per_host = {"n2": {"software": {"binaries": {"madengine": None}}}}
    others = {"software": {"binaries": {"madengine": "/usr/local/bin/madengine"}}}
    result = software.check(_ctx({"n1": others, "n3": others, **per_host}, launcher="madengine"))
    assert result.status is Status.FAIL
    assert result.hosts["n1"].status is Status.PASS
    assert result.hosts["n2"].detail == (
        "madengine not found next to /usr/bin/python3 or on PATH "
        "(--launcher madengine runs it on every node)"
    )
    assert result.fix_command == (
        "/usr/bin/python3 -m pip install git+https://github.com/ROCm/madengine.git  (on n2)"
    )


def test_a_missing_torchrun_or_template_command_only_warns() -> None:
    template = "deepspeed --num_nodes {nnodes} train.py"
    result = software.check(
        _ctx(
            {"n2": {"software": {"binaries": {"deepspeed": None}}}},
            launcher="command",
            command_template=template,
        )
    )
    assert result.status is Status.WARN
    assert result.hosts["n2"].detail == (
        "deepspeed not found next to /usr/bin/python3 or on PATH "
        "(the --command-template's first word)"
    )
    torchrun = software.check(_ctx({"n1": {"software": {"binaries": {"torchrun": None}}}}))
    assert torchrun.status is Status.WARN and torchrun.fix_command is None


@pytest.mark.parametrize(
    ("template", "word"),
    [
        ("deepspeed --num_nodes {nnodes} train.py", "deepspeed"),
        ("python3 -m torch.distributed.run --node_rank {node_rank} t.py", "python3"),
        ("env FOO=1 torchrun t.py", "env"),
        ("/opt/bin/launch {host}", None),  # a path: not looked up on PATH
        ("./run.sh {node_rank}", None),
        ("{master_addr} x", None),
        ("FOO=1 deepspeed t.py", None),  # an assignment first
        ("cd /srv && deepspeed t.py", None),  # a builtin
        ("if true; then deepspeed; fi", None),
        ("source env.sh; deepspeed", None),
        ("'unterminated", None),
        ("", None),
    ],
)
def test_template_command_is_a_plain_first_word(template: str, word: str | None) -> None:
    assert software.template_command(template) == word
    opts = ChecklistOptions(cluster=_cluster(), launcher="command", command_template=template)
    assert software.extra_binaries(opts) == ((word,) if word else ())


def test_extra_binaries_only_for_the_command_launcher() -> None:
    opts = ChecklistOptions(cluster=_cluster(), launcher="python", command_template="deepspeed x")
    assert software.extra_binaries(opts) == ()


def test_preflight_options_carry_the_harness_and_the_template() -> None:
    cluster = _cluster()
    harness = JobSpec(script="plugin", launcher="python", harness="plugin")
    options = checklist_options(CheckPolicy(), harness, cluster, SshOptions(), None, None)
    assert options.harness and options.launcher == "python"
    template = "deepspeed --node_rank {node_rank} t.py"
    command = JobSpec(script="", launcher="command", launcher_options=CommandOptions(template))
    options = checklist_options(CheckPolicy(), command, cluster, SshOptions(), None, None)
    assert options.command_template == template and not options.harness


def test_mlx_smoke_test_is_skipped_with_a_warning_where_torch_is_missing() -> None:
    ctx = _ctx({"n2": {"software": {"torch": None}}}, launcher="mlx")
    result = smoke.skipped_without_torch(ctx)
    assert result is not None and result.status is Status.WARN
    assert result.hosts["n2"].status is Status.WARN
    assert result.hosts["n1"].status is Status.SKIP
    assert result.warning is not None
    assert "runs torch.distributed and torch is not installed on n2" in result.warning
    assert "--launcher mlx does not need torch" in result.warning
    assert result.data["hosts_without_torch"] == ["n2"]
    # torch everywhere: the test runs; other launchers need torch, so they fail in the test
    assert smoke.skipped_without_torch(_ctx(launcher="mlx")) is None
    assert smoke.skipped_without_torch(_ctx({"n2": {"software": {"torch": None}}})) is None


@pytest.mark.parametrize(
    ("target", "script"),
    [("plugins/lora", "plugins/lora/main.py"), ("train_plugin.py", "train_plugin.py")],
)
def test_corral_check_harness_checks_accelerate_and_the_plugins_script(
    target: str, script: str
) -> None:
    from corral.cli.check import checklist_options as cli_options

    common = {
        "hosts": "local:2",
        "ssh": SshOptions(),
        "launcher": "torchrun",
        "python": None,
        "nproc_per_node": None,
        "master_addr": None,
        "master_port": 29500,
        "workdir": None,
        "nccl_interface": None,
        "gloo_interface": None,
        "checkpoint_dir": None,
        "min_free_gb": 1.0,
        "consistency_threshold": 1.0,
        "exclude_divergent": False,
        "code_dir": None,
        "smoke": False,
        "smoke_timeout": 30.0,
        "connect_timeout": 5.0,
    }
    command = [target, "--config_file", "config.json"]
    options = cli_options(command=command, harness=True, **common)  # type: ignore[arg-type]
    assert options.harness and options.script == script
    plain = cli_options(command=command, **common)  # type: ignore[arg-type]
    assert not plain.harness and plain.script == target
