"""The accelerate, command and madengine launchers and the plugin harness: golden
plans, template rendering and quoting, the harness's config, bad input."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import _register, app
from corral.cluster import Cluster, load_cluster, parse_hostfile_text
from corral.errors import ConfigError
from corral.harness.config import config_value, harness_target, read_config, replace_config
from corral.plan.display import command_lines, join, reference_line
from corral.plan.launchers import (
    PLACEHOLDERS,
    CommandOptions,
    MadengineOptions,
    NodeFacts,
    command_argv,
    madengine_context,
    render_template,
    template_fields,
)
from corral.plan.render import plan_job
from corral.plan.spec import JobSpec
from corral.sdk._config import adjust_config
from tests.conftest import require

_register()
GOLDEN = Path(__file__).parent / "golden" / "launchers"
HOSTFILE = """\
node1:2 interface=eth1
node2 slots=2 env.DATA=/data/shared
"""
SEED_TAGS = "pyt_megatron_lm_train_llama2_7b"
CONFIG = {"batch_size": 64, "learning_rate": 0.001, "epochs": 2, "output_dir": "out"}


def _remote(text: str = HOSTFILE) -> Cluster:
    return parse_hostfile_text(text, "hosts.txt")


def _spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        script="train.py",
        args=("--lr", "0.1"),
        job_id="job-1",
        python="/opt/py/bin/python",
        workdir="/srv/code",
        run_dir="/var/runs",
        master_addr="10.0.0.1",
    )
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def _madengine(**kw: object) -> JobSpec:
    return _spec(
        launcher="madengine",
        script="",
        args=(),
        shared_data_path="/nfs/data",
        **{"launcher_options": MadengineOptions(tags=SEED_TAGS), **kw},
    )


CASES = {
    "accelerate_remote": lambda: (_spec(launcher="accelerate"), _remote()),
    "accelerate_local": lambda: (
        _spec(launcher="accelerate", workdir=None, master_addr=None, nproc_per_node=2),
        load_cluster("local:2"),
    ),
    "command_remote": lambda: (
        _spec(
            launcher="command",
            script="",
            args=(),
            launcher_options=CommandOptions(
                "deepspeed --num_nodes {nnodes} --num_gpus {nproc_per_node} "
                "--master_addr {master_addr} --master_port {master_port} --node_rank {node_rank} "
                "train.py --tag {job_id}"
            ),
        ),
        _remote(),
    ),
    "madengine_remote": lambda: (
        _madengine(launcher_options=MadengineOptions(SEED_TAGS, "--live-output")),
        _remote(),
    ),
    "harness_plugin_remote": lambda: (
        _spec(
            launcher="accelerate",
            script="plugins/llama/main.py",
            args=("--config_file", "config.json"),
            harness="plugin",
            harness_config=json.dumps(CONFIG),
        ),
        _remote(),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_matches_golden(case: str) -> None:
    spec, cluster = CASES[case]()
    spec = dataclasses.replace(spec, launch_dir="/")  # local nodes' CORRAL_LAUNCH_DIR
    got = [c.to_json() for c in plan_job(spec, cluster)]
    path = GOLDEN / f"plan_{case}.json"
    if os.environ.get("CORRAL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())


def test_madengine_lines_are_the_seeds_command() -> None:
    """Seed 003's command per node, exactly, as `corral plan` prints it."""
    cluster = _remote("192.168.1.1\n192.168.1.2\n")
    spec = _madengine(
        master_addr="192.168.0.1",
        master_port=4000,
        nccl_interface="ens14np0",
        gloo_interface="ens14np0",
    )
    commands = plan_job(spec, cluster)
    lines = [join(cmd.argv) for cmd in commands]
    path = GOLDEN / "madengine_lines.txt"
    if os.environ.get("CORRAL_UPDATE_GOLDEN") == "1":
        path.write_text("\n".join(lines) + "\n")
    assert lines == path.read_text().splitlines()
    assert lines[1] == (
        f"madengine run --tags {SEED_TAGS} --additional-context \"{{'multi_node_args': "
        "{'RUNNER': 'torchrun', 'MASTER_ADDR': '192.168.0.1', 'MASTER_PORT': '4000', "
        "'NNODES': '2', 'NODE_RANK': '1', 'NCCL_SOCKET_IFNAME': 'ens14np0', "
        "'GLOO_SOCKET_IFNAME': 'ens14np0'}}\" --force-mirror-local /nfs/data"
    )
    # what corral runs is that argv, without a shell: the context is one word
    context = commands[1].argv[commands[1].argv.index("--additional-context") + 1]
    assert ast.literal_eval(context)["multi_node_args"]["NODE_RANK"] == "1"


def test_madengine_context_leaves_out_unknown_interfaces() -> None:
    facts = NodeFacts(0, 2, 1, 2, "m", 29500, "h", "j")
    assert ast.literal_eval(madengine_context(facts)) == {
        "multi_node_args": {
            "RUNNER": "torchrun",
            "MASTER_ADDR": "m",
            "MASTER_PORT": "29500",
            "NNODES": "2",
            "NODE_RANK": "0",
        }
    }


def test_accelerate_ranks_are_corrals_with_the_reference_line() -> None:
    commands = plan_job(_spec(launcher="accelerate"), _remote())
    assert [r.rank for c in commands for r in c.ranks] == [0, 1, 2, 3]
    for cmd in commands:
        assert cmd.env["CORRAL_ACCELERATE"] == "1"
        assert cmd.env["WORLD_SIZE"] == "4"
        assert "ACCELERATE_USE_CPU" not in cmd.env  # decided on the host, at rank start
        assert len(command_lines(cmd)) == 2
    assert reference_line(commands[1]) == (
        "accelerate launch --multi_gpu --num_machines 2 --machine_rank 1 --main_process_ip "
        "10.0.0.1 --main_process_port 29500 --num_processes 4 --max_restarts 0 train.py --lr 0.1"
    )


def test_accelerate_reference_line_is_valid_for_accelerate() -> None:
    require("accelerate")
    from accelerate.commands.launch import launch_command_parser

    cmd = plan_job(_spec(launcher="accelerate"), _remote())[1]
    args = launch_command_parser().parse_args(list(cmd.reference_argv[2:]))
    assert (args.num_machines, args.machine_rank, args.num_processes) == (2, 1, 4)
    assert (args.main_process_ip, args.main_process_port) == ("10.0.0.1", 29500)
    assert args.multi_gpu and args.training_script == "train.py"
    assert args.training_script_args == ["--lr", "0.1"]


def test_every_placeholder_is_filled_and_quoted() -> None:
    template = " ".join(f"{{{p}}}" for p in PLACEHOLDERS)
    facts = NodeFacts(
        node_rank=1,
        nnodes=2,
        nproc_per_node=4,
        world_size=8,
        master_addr="10.0.0.1",
        master_port=29500,
        host="gpu node; touch /tmp/pwned",
        job_id="job $(id)",
        nccl_interface="",
        gloo_interface="eth'0",
    )
    assert template_fields(template) == list(PLACEHOLDERS)
    argv = command_argv('printf "%s\\n" ' + template, facts)
    assert argv[:2] == ("bash", "-c")
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "1", "2", "4", "8", "10.0.0.1", "29500", "gpu node; touch /tmp/pwned", "job $(id)",
        "", "eth'0",
    ]  # fmt: skip


def test_literal_braces_pass_through() -> None:
    facts = NodeFacts(0, 1, 1, 1, "m", 1, "h", "j")
    assert render_template("echo ${{HOME}} {host}", facts) == "echo ${HOME} h"


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        ("echo {rank}", "unknown placeholder {rank}"),
        ("echo {}", "unknown placeholder {}"),
        ("echo {0}", "unknown placeholder {0}"),
        ("echo {host.name}", "unknown placeholder {host.name}"),
        ("echo {node_rank:>3}", "takes no format spec"),
        ("echo {node_rank!r}", "takes no format spec"),
        ("echo {node_rank", "cannot parse the template"),
        ("echo ${HOME}", "unknown placeholder {HOME}"),
        ("  ", "empty"),
    ],
)
def test_bad_templates_name_the_problem(template: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan_job(
            _spec(
                launcher="command", script="", args=(), launcher_options=CommandOptions(template)
            ),
            _remote(),
        )
    assert err.value.option == "--command-template"
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("kw", "option", "needle"),
    [
        (dict(launcher="command", script="", args=()), "--command-template", "needs"),
        (
            dict(launcher="command", launcher_options=CommandOptions("x")),
            "--launcher",
            "takes no SCRIPT",
        ),
        (
            dict(launcher_options=CommandOptions("echo")),
            "--command-template",
            "--launcher command only",
        ),
        (dict(launcher="madengine", script="", args=()), "--tags", "needs --tags"),
        (dict(launcher_options=MadengineOptions("t")), "--tags", "--launcher madengine only"),
        (
            dict(launcher="madengine", script="", args=(), launcher_options=MadengineOptions("t")),
            "--shared-data-path",
            "needs --shared-data-path",
        ),
        (
            dict(
                launcher="madengine",
                script="",
                args=(),
                launcher_options=MadengineOptions("t", "--x 'unclosed"),
                shared_data_path="/d",
            ),
            "--additional-args",
            "cannot split",
        ),
        (
            dict(
                launcher="madengine", launcher_options=MadengineOptions("t"), shared_data_path="/d"
            ),
            "--launcher",
            "",
        ),
        (dict(launcher="mlx", harness="script"), "--harness", "not mlx"),
        (dict(harness="script", lr_scaling="cubic"), "--lr-scaling", "unknown rule"),
        (
            dict(harness="script", harness_config='{"batch_size": 2}'),
            "--config_file",
            "smaller than world_size",
        ),
    ],
)
def test_bad_launcher_options(kw: dict[str, object], option: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan_job(_spec(**kw), _remote())
    assert err.value.option == option
    assert needle in str(err.value)


def test_command_node_env_keeps_corrals_variables() -> None:
    spec = _spec(
        launcher="command", script="", args=(), launcher_options=CommandOptions("run {node_rank}")
    )
    for rank, cmd in enumerate(plan_job(spec, _remote())):
        assert cmd.argv == ("bash", "-c", f"run {rank}")
        assert cmd.ranks == () and cmd.nproc == 2
        assert cmd.env["NODE_RANK"] == str(rank) and cmd.env["NNODES"] == "2"
        assert cmd.env["MASTER_ADDR"] == "10.0.0.1" and cmd.env["MASTER_PORT"] == "29500"
        assert "RANK" not in cmd.env and "WORLD_SIZE" not in cmd.env  # not a rank


# -- the harness -----------------------------------------------------------------------


def test_harness_target_and_config_argument() -> None:
    assert harness_target("plugins/llama") == ("plugin", "plugins/llama/main.py")
    assert harness_target("plugins/llama/") == ("plugin", "plugins/llama/main.py")
    assert harness_target("train.py") == ("script", "train.py")
    assert config_value(["--x", "--config_file", "c.json"]) == (2, "c.json")
    assert config_value(["--config-file=c.json"]) == (0, "c.json")
    assert config_value(["--other"]) is None
    assert replace_config(["--config_file", "c.json", "-v"], "/n/r.json") == [
        "--config_file",
        "/n/r.json",
        "-v",
    ]
    assert replace_config(["--config_file=c.json"], "/n/r.json") == ["--config_file=/n/r.json"]
    with pytest.raises(ConfigError, match="needs a path"):
        config_value(["--config_file"])


def test_read_config_errors_name_the_file(tmp_path: Path) -> None:
    assert read_config(["--x"]) is None
    with pytest.raises(ConfigError, match="cannot read") as err:
        read_config(["--config_file", str(tmp_path / "missing.json")])
    assert err.value.option == "--config_file"
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_config(["--config_file", str(tmp_path / "bad.json")])
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        read_config(["--config_file", str(tmp_path / "list.json")])


@pytest.mark.parametrize(("rule", "lr"), [("linear", 0.004), ("sqrt", 0.002), ("none", 0.001)])
def test_harness_config_is_adjusted_per_attempt_world(rule: str, lr: float) -> None:
    spec = _spec(
        launcher="accelerate",
        harness="script",
        harness_config=json.dumps(CONFIG),
        lr_scaling=rule,
    )
    config = json.loads(plan_job(spec, _remote())[0].env["CORRAL_JOB_CONFIG"])
    assert config["batch_size"] == 16 and config["learning_rate"] == pytest.approx(lr)
    assert config["distributed"]["world_size"] == 4
    assert config["distributed"]["rank0_only_output"] is True
    # a restart on one host (fewer ranks) re-plans with that world size
    smaller = json.loads(plan_job(spec, _remote("node1:2\n"))[0].env["CORRAL_JOB_CONFIG"])
    assert smaller["batch_size"] == 32 and smaller["distributed"]["world_size"] == 2


def test_adjust_config_without_require_leaves_missing_keys() -> None:
    only_lr = adjust_config({"learning_rate": 0.1}, 4, require=False)
    assert only_lr["learning_rate"] == pytest.approx(0.4) and "batch_size" not in only_lr
    only_batch = adjust_config({"batch_size": 8}, 4, require=False)
    assert only_batch["batch_size"] == 2 and "learning_rate" not in only_batch
    assert adjust_config({}, 4, require=False)["distributed"]["world_size"] == 4
    with pytest.raises(ValueError, match="needs config"):
        adjust_config({"batch_size": 8}, 4)


# -- the CLI ----------------------------------------------------------------------------


@pytest.fixture
def in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in list(os.environ):
        if name.startswith("CORRAL_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "300"})
    return result.exit_code, result.stdout, result.stderr


def test_plan_harness_shows_the_adjusted_config(in_tmp: Path) -> None:
    plugin = in_tmp / "plugin"
    plugin.mkdir()
    (plugin / "main.py").write_text("def main():\n    pass\n")
    (in_tmp / "config.json").write_text(json.dumps(CONFIG))
    args = ["plan", "--hosts", "local:2", "--nproc-per-node", "2", "--harness", "--job-id", "h"]
    code, out, err = _invoke(*args, "--json", "--", "plugin", "--config_file", "config.json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["launcher"] == "accelerate"  # --harness's default launcher
    assert doc["harness"]["mode"] == "plugin"
    assert doc["harness"]["config"]["batch_size"] == 16
    assert doc["harness"]["config"]["learning_rate"] == pytest.approx(0.004)
    assert doc["nodes"][0]["argv"][-3:] == [str(plugin / "main.py"), "--config_file", "config.json"]
    code, out, err = _invoke(*args, "--", "plugin", "--config_file", "config.json")
    assert code == 0, err
    assert "harness config (--config_file adjusted for 4 ranks" in out
    assert '"learning_rate": 0.004' in out
    assert "accelerate launch --multi_gpu --num_machines 2 --machine_rank 1" in out


def _corral(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return subprocess.run(
        [sys.executable, "-m", "corral", *args], cwd=cwd, capture_output=True, text=True, env=env
    )


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--launcher", "command"],
            "error: --command-template: --launcher command needs --command-template 'TEMPLATE'",
        ),
        (
            ["--launcher", "command", "--command-template", "x", "--", "t.py"],
            "error: --launcher: --launcher command runs its own command on every node and takes "
            "no SCRIPT (got 't.py' after --); put the script in --command-template",
        ),
        (
            ["--harness", "--", "p", "--config_file"],
            "error: --config_file: --config_file needs a path",
        ),
        (
            ["--launcher", "madengine", "--tags", "m"],
            "error: --shared-data-path: --launcher madengine needs --shared-data-path PATH "
            "(madengine's --force-mirror-local)",
        ),
    ],
)
def test_cli_errors_are_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    result = _corral(tmp_path, "plan", "--hosts", "local:2", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[0] == line
    assert "Traceback" not in result.stderr
