"""corral.service.planner without a database: machines are store rows built in memory."""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from corral.api.errors import status_of
from corral.cluster.model import Cluster, Host
from corral.defaults import DEFAULT_COLLECTIVE_TIMEOUT
from corral.errors import Conflict, Invalid
from corral.job.build import job_spec
from corral.job.engine import dry_run
from corral.plan.display import command_lines
from corral.plan.spec import JobSpec
from corral.redact import REDACTED
from corral.service.models import ConfigScaling, JobRequest, ResourceRequirements
from corral.service.planner import (
    CONFIG_ENV,
    Selection,
    adjusted_config,
    eligibility,
    execution_plan,
    job_description,
    score,
    select_machines,
    stored_request,
    suggest,
)
from corral.service.settings import ServerSettings
from corral.store.models import Machine
from corral.throughput.model import Calibration, RankRate, save_calibration

GIB = 1024  # MiB


def machine(
    name: str,
    *,
    status: str = "online",
    gpus: int = 0,
    gpu_mib: int | None = None,
    cpu: float | None = None,
    mem: float | None = None,
    slots: int = 2,
    local: bool = False,
    last_error: str | None = None,
) -> Machine:
    """A machine row as a health check leaves it (never added to a session)."""
    caps: dict[str, Any] = {"cpus": 8, "gpu_count": gpus}
    if gpu_mib is not None:
        caps["gpu_memory_min_mib"] = gpu_mib
    load: dict[str, Any] = {}
    if cpu is not None:
        load["cpu_percent"] = cpu
    if mem is not None:
        load["memory_percent"] = mem
    return Machine(
        id=f"m-{name}",
        name=name,
        address="127.0.0.1" if local else f"{name}.lan",
        port=None,
        user=None,
        key_path=None,
        password_env=None,
        slots=slots,
        labels={},
        local=local,
        python=None,
        created=0.0,
        status=status,
        last_error=last_error,
        capabilities=caps,
        load=load,
    )


def request(
    *,
    num: int = 1,
    gpus: int = 0,
    gpu_mem: float = 0,
    nproc: int | None = None,
    **extra: Any,
) -> JobRequest:
    return JobRequest(
        script="train.py",
        nproc_per_node=nproc,
        resource_requirements=ResourceRequirements(
            num_machines=num, gpus_per_machine=gpus, min_gpu_memory=gpu_mem
        ),
        **extra,
    )


# -- score ---------------------------------------------------------------------------------


def test_score_follows_the_documented_formula() -> None:
    m = machine("a", gpus=4, gpu_mib=16 * GIB, cpu=20.0, mem=40.0)
    # 10 x 4 free GPUs + 16 GiB + (100 - 20) / 10 + (100 - 40) / 20
    assert score(m, busy=False) == 40 + 16 + 8 + 3
    # a busy machine has no free GPU
    assert score(m, busy=True) == 16 + 8 + 3
    # +5 when preferred, by name or by id
    assert score(m, busy=False, preferred=["a"]) == 67 + 5
    assert score(m, busy=False, preferred=["m-a"]) == 67 + 5
    assert score(m, busy=False, preferred=["other"]) == 67


def test_score_of_a_machine_without_load_figures_assumes_half_load() -> None:
    m = machine("cpu-only")
    assert score(m, busy=False) == (100 - 50) / 10 + (100 - 50) / 20


def test_score_is_rounded_to_hundredths() -> None:
    m = machine("a", gpus=1, gpu_mib=1000, cpu=33.3, mem=0.0)
    value = score(m, busy=False)
    assert value == round(10 + 1000 / 1024 + 66.7 / 10 + 5, 2)


# -- eligibility ---------------------------------------------------------------------------


def test_an_online_idle_machine_that_fits_is_eligible() -> None:
    m = machine("a", gpus=2, gpu_mib=24 * GIB, slots=2)
    assert eligibility(m, request(gpus=2, gpu_mem=16, nproc=2), []) == []


@pytest.mark.parametrize(
    ("m", "req", "busy", "expected"),
    [
        (
            machine("a", status="offline", last_error="connection refused"),
            request(),
            [],
            "offline: connection refused",
        ),
        (machine("a", status="offline"), request(), [], "offline"),
        (machine("a", status="unknown"), request(), [], "never health-checked"),
        (machine("a"), request(), ["j-1", "j-2"], "busy with j-1, j-2"),
        (machine("a", gpus=1), request(gpus=2), [], "1 GPUs, 2 needed"),
        (
            machine("a", gpus=2, gpu_mib=16 * GIB),
            request(gpus=2, gpu_mem=24),
            [],
            "16.0 GiB per GPU, 24 needed",
        ),
        (machine("a", slots=2), request(nproc=4), [], "2 slots, 4 ranks per node asked"),
    ],
    ids=["offline", "offline-no-error", "never-checked", "busy", "gpus", "gpu-memory", "slots"],
)
def test_eligibility_names_why_not(
    m: Machine, req: JobRequest, busy: list[str], expected: str
) -> None:
    assert eligibility(m, req, busy) == [expected]


def test_eligibility_lists_every_reason() -> None:
    m = machine("a", status="unknown", gpus=0)
    reasons = eligibility(m, request(gpus=1), ["j-9"])
    assert reasons == ["never health-checked", "busy with j-9", "0 GPUs, 1 needed"]


def test_slots_do_not_matter_for_a_gpu_job() -> None:
    m = machine("a", gpus=4, slots=1)
    assert eligibility(m, request(gpus=4, nproc=8), []) == []


# -- suggest / select ----------------------------------------------------------------------


def test_suggest_puts_eligible_machines_first_by_score() -> None:
    machines = [
        machine("idle", gpus=2, cpu=10.0, mem=10.0),
        machine("loaded", gpus=2, cpu=90.0, mem=90.0),
        machine("down", status="offline", gpus=8, cpu=0.0, mem=0.0),
        machine("busy", gpus=8, cpu=0.0, mem=0.0),
    ]
    ranked = suggest(machines, request(gpus=1), {"m-busy": ["j-1"]})
    assert [s.name for s in ranked] == ["idle", "loaded", "down", "busy"]
    assert [s.eligible for s in ranked] == [True, True, False, False]
    assert ranked[0].score > ranked[1].score
    # an ineligible machine's reasons say why not; an eligible one's why it is good
    assert ranked[2].reasons == ["offline"]
    assert ranked[3].reasons == ["busy with j-1"]
    assert ranked[0].reasons[0].startswith("online")
    # the highest score of all (8 free GPUs) is still after every eligible machine
    assert ranked[2].score > ranked[0].score


def test_suggest_breaks_ties_by_name() -> None:
    ranked = suggest([machine("b"), machine("a"), machine("c")], request(), {})
    assert [s.name for s in ranked] == ["a", "b", "c"]


def test_preferred_machines_rank_higher() -> None:
    machines = [machine("a", cpu=10.0), machine("b", cpu=20.0)]
    assert suggest(machines, request(), {}, preferred=["b"])[0].name == "b"


def test_auto_selection_picks_the_best_eligible_machines() -> None:
    machines = [
        machine("slow", cpu=95.0, mem=95.0),
        machine("fast", cpu=5.0, mem=5.0),
        machine("mid", cpu=50.0, mem=50.0),
        machine("off", status="offline", cpu=0.0, mem=0.0),
    ]
    sel = select_machines(machines, request(num=2), {})
    assert [m.name for m in sel.chosen] == ["fast", "mid"]
    assert set(sel.reasons) == {"m-fast", "m-mid"}
    assert [s.name for s in sel.rejected] == ["slow", "off"]


def test_manual_selection_keeps_the_order_given() -> None:
    machines = [machine("a", cpu=90.0), machine("b", cpu=10.0)]
    chosen = [machines[0], machines[1]]
    sel = select_machines(machines, request(num=2), {}, chosen=chosen)
    assert [m.name for m in sel.chosen] == ["a", "b"]
    assert sel.rejected == []


def test_manual_selection_of_an_ineligible_machine_is_a_conflict() -> None:
    machines = [machine("a"), machine("b", status="offline", last_error="timeout")]
    with pytest.raises(Conflict) as info:
        select_machines(machines, request(num=2), {}, chosen=machines)
    assert status_of(info.value) == 409
    assert info.value.info["unavailable"] == {"b": ["offline: timeout"]}
    assert [s["name"] for s in info.value.info["suggestions"]] == ["a", "b"]
    assert "b: offline: timeout" in str(info.value)


def test_asking_more_machines_than_available_is_a_conflict_with_suggestions() -> None:
    machines = [machine("a"), machine("b"), machine("c", status="unknown")]
    with pytest.raises(Conflict) as info:
        select_machines(machines, request(num=3), {"m-b": ["j-1"]})
    details = info.value.info
    assert details["needed"] == 3
    assert details["available"] == 1
    assert details["registered"] == 3
    suggestions = details["suggestions"]
    assert [s["name"] for s in suggestions] == ["a", "b", "c"]
    assert [s["eligible"] for s in suggestions] == [True, False, False]
    assert set(suggestions[0]) == {"machine_id", "name", "score", "eligible", "reasons"}
    json.dumps(details)  # the API returns it as is
    assert "3 machines needed, 1 available" in str(info.value)


# -- config --------------------------------------------------------------------------------


def config_request(rule: str = "linear", adjust: bool = True, **config: Any) -> JobRequest:
    return request(
        config=config,
        adjust_config=adjust,
        config_scaling=ConfigScaling(rule=rule),  # type: ignore[arg-type]
    )


def test_adjust_divides_the_batch_and_multiplies_the_lr_by_the_world_size() -> None:
    config = adjusted_config(config_request(batch_size=64, learning_rate=0.001, epochs=3), 4)
    assert config is not None
    assert config["batch_size"] == 16
    assert config["learning_rate"] == pytest.approx(0.004)
    assert config["epochs"] == 3
    dist = config["distributed"]
    assert dist["world_size"] == 4
    assert dist["global_batch_size"] == 64
    assert dist["base_lr"] == pytest.approx(0.001)
    assert dist["lr_scale"] == pytest.approx(4)
    assert dist["lr_scale_rule"] == "linear"
    assert dist["rank0_only_output"] is False


def test_adjust_with_the_sqrt_rule() -> None:
    config = adjusted_config(config_request("sqrt", batch_size=64, learning_rate=0.001), 4)
    assert config is not None
    assert config["batch_size"] == 16
    assert config["learning_rate"] == pytest.approx(0.001 * math.sqrt(4))
    assert config["distributed"]["lr_scale_rule"] == "sqrt"


def test_adjust_marks_rank0_only_output_when_the_config_has_an_output_dir() -> None:
    config = adjusted_config(config_request(batch_size=8, learning_rate=0.1, output_dir="/out"), 2)
    assert config is not None
    assert config["output_dir"] == "/out"
    assert config["distributed"]["rank0_only_output"] is True


def test_adjust_keys_are_configurable() -> None:
    req = request(
        config={"bs": 32, "lr": 0.01},
        adjust_config=True,
        config_scaling=ConfigScaling(batch_size_key="bs", lr_key="lr"),
    )
    config = adjusted_config(req, 2)
    assert config is not None
    assert (config["bs"], config["lr"]) == (16, pytest.approx(0.02))


@pytest.mark.parametrize(
    "config", [{"batch_size": 64}, {"learning_rate": 0.1}, {}], ids=["no-lr", "no-batch", "empty"]
)
def test_adjust_without_its_keys_is_invalid(config: dict[str, Any]) -> None:
    with pytest.raises(Invalid) as info:
        adjusted_config(config_request(**config), 2)
    assert status_of(info.value) == 422
    assert info.value.info == {"field": "config"}


def test_adjust_with_a_batch_smaller_than_the_world_is_invalid() -> None:
    with pytest.raises(Invalid):
        adjusted_config(config_request(batch_size=2, learning_rate=0.1), 4)


def test_without_adjust_the_config_is_unchanged() -> None:
    original = {"batch_size": 64, "learning_rate": 0.001, "nested": {"a": 1}}
    assert adjusted_config(config_request(adjust=False, **original), 8) == original
    assert adjusted_config(request(), 8) is None


# -- secrets -------------------------------------------------------------------------------


def test_stored_request_redacts_secret_env_values() -> None:
    req = request(
        env={"HF_TOKEN": "hf_secret", "DB_URL": "postgres://u:pw@h/db", "PLAIN": "visible"},
        secret_env=["DB_URL"],
    )
    stored = stored_request(req)
    assert stored["env"] == {"HF_TOKEN": REDACTED, "DB_URL": REDACTED, "PLAIN": "visible"}
    assert stored["secret_env"] == ["DB_URL"]
    text = json.dumps(stored)
    assert "hf_secret" not in text
    assert "pw@h" not in text
    # the request itself keeps the values (they reach the supervisor only)
    assert req.env["HF_TOKEN"] == "hf_secret"


# -- execution plan ------------------------------------------------------------------------


def test_execution_plan_of_two_local_machines_matches_corral_plan(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    machines = [machine("sim1", local=True, slots=2), machine("sim2", local=True, slots=2)]
    env = {"HF_TOKEN": "hf_very_secret", "MY_PASS_PHRASE": "swordfish", "PLAIN": "1"}
    req = JobRequest(
        script=str(script),
        args=["--steps", "3"],
        launcher="python",
        nproc_per_node=2,
        master_port=29517,
        env=env,
        secret_env=["MY_PASS_PHRASE"],
        config={"batch_size": 8, "learning_rate": 0.1},
        adjust_config=True,
        resource_requirements=ResourceRequirements(num_machines=2),
    )
    settings = ServerSettings(run_dir=tmp_path / "runs")
    launch = job_description("j-test", req, machines, settings)
    plan = execution_plan(launch, Selection(chosen=machines, reasons={"m-sim1": ["online"]}))

    assert plan["world_size"] == 4
    assert plan["num_machines"] == 2
    assert plan["launcher"] == "python"
    assert plan["master"] == {"host": "sim1", "address": "127.0.0.1", "port": 29517}
    assert [m["name"] for m in plan["machines"]] == ["sim1", "sim2"]
    assert plan["machines"][0]["reasons"] == ["online"]
    assert [n["ranks"] for n in plan["nodes"]] == [[0, 1], [2, 3]]
    assert plan["config"]["batch_size"] == 2
    assert plan["config"]["distributed"]["world_size"] == 4

    # the same job as `corral plan` sees it: a spec and a cluster of two local hosts
    spec = JobSpec(
        script=str(script),
        args=("--steps", "3"),
        launcher="python",
        job_id="j-test",
        nproc_per_node=2,
        master_port=29517,
        collective_timeout=DEFAULT_COLLECTIVE_TIMEOUT,  # every job's, as corral run's
        env={**env, CONFIG_ENV: json.dumps(plan["config"], separators=(",", ":"))},
        secret_env=("MY_PASS_PHRASE",),
        run_dir=str(tmp_path / "runs"),
    )
    cluster = Cluster(
        (Host("sim1", slots=2, local=True), Host("sim2", slots=2, local=True)), source="test"
    )
    printed = [
        [{"label": c.label, "line": c.line} for c in command_lines(cmd)]
        for cmd in dry_run(spec, cluster).commands
    ]
    assert [n["commands"] for n in plan["nodes"]] == printed
    assert [len(c) for c in printed] == [2, 2]  # python launcher: one line per rank

    text = json.dumps(plan)
    assert "hf_very_secret" not in text
    assert "swordfish" not in text
    assert plan["env"] == {"HF_TOKEN": REDACTED, "MY_PASS_PHRASE": REDACTED, "PLAIN": "1"}
    for node in plan["nodes"]:
        assert node["env"]["HF_TOKEN"] == REDACTED
        assert node["env"]["MY_PASS_PHRASE"] == REDACTED
        assert node["env"]["PLAIN"] == "1"
        assert f"'HF_TOKEN={REDACTED}'" in node["commands"][0]["line"]
    # the job description itself (what the supervisor gets over stdin) keeps them
    assert launch.options.env["HF_TOKEN"] == "hf_very_secret"


def test_a_job_cannot_mix_local_and_ssh_machines(tmp_path: Path) -> None:
    machines = [machine("sim1", local=True), machine("gpu1")]
    with pytest.raises(Invalid):
        job_description("j-x", request(num=2), machines, ServerSettings(run_dir=tmp_path))


# -- launchers ------------------------------------------------------------------------------


def _plan_for(tmp_path: Path, **fields: Any) -> dict[str, Any]:
    machines = [machine("sim1", local=True, slots=2), machine("sim2", local=True, slots=2)]
    req = JobRequest(
        nproc_per_node=2,
        master_port=29531,
        resource_requirements=ResourceRequirements(num_machines=2),
        **fields,
    )
    launch = job_description("j-l", req, machines, ServerSettings(run_dir=tmp_path / "runs"))
    assert job_spec(launch.options).launcher == req.launcher
    return execution_plan(launch, Selection(chosen=machines))


def test_a_command_job_is_planned_from_its_template(tmp_path: Path) -> None:
    template = "echo {node_rank} of {nnodes} on {host} > out-{node_rank}.txt"
    plan = _plan_for(tmp_path, launcher="command", command_template=template)
    assert plan["launcher"] == "command" and plan["script"] == ""
    assert plan["command_template"] == template
    lines = [n["commands"][-1]["line"] for n in plan["nodes"]]
    assert "echo 0 of 2 on sim1 > out-0.txt" in lines[0]
    assert "echo 1 of 2 on sim2 > out-1.txt" in lines[1]


@pytest.mark.parametrize("launcher", ["accelerate", "mlx"])
def test_accelerate_and_mlx_jobs_need_no_extra_field(tmp_path: Path, launcher: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    plan = _plan_for(tmp_path, launcher=launcher, script=str(script))
    assert plan["launcher"] == launcher and plan["world_size"] == 4
    assert [n["ranks"] for n in plan["nodes"]] == [[0, 1], [2, 3]]
    env = plan["nodes"][1]["env"]
    assert ("CORRAL_ACCELERATE" if launcher == "accelerate" else "CORRAL_MLX_BACKEND") in env


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"launcher": "command"}, "command_template", "launcher command needs a command_template"),
        (
            {"launcher": "command", "command_template": "echo {rank}"},
            "command_template",
            "command_template: unknown placeholder {rank}",
        ),
        (
            {"launcher": "command", "command_template": "echo {", "script": None},
            "command_template",
            "cannot parse the template",
        ),
        (
            {"launcher": "command", "command_template": "echo hi", "script": "train.py"},
            "script",
            "takes no script",
        ),
        (
            {"launcher": "python", "command_template": "echo hi", "script": "train.py"},
            "command_template",
            "applies to launcher command only",
        ),
    ],
)
def test_command_launch_mistakes_name_their_field(
    tmp_path: Path, fields: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(Invalid) as err:
        _plan_for(tmp_path, **fields)
    assert err.value.info == {"field": field}
    assert says in err.value.message


def test_an_unknown_launcher_is_refused_by_the_model() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="launcher"):
        JobRequest(script="t.py", launcher="madengine")  # type: ignore[arg-type]


# -- workload weights ------------------------------------------------------------------------


def calibration_file(path: Path, rates: dict[str, list[float]]) -> Path:
    """A calibration (as ``corral calibrate`` saves it) of ``host -> examples/s`` per
    local rank; the e2e tests make theirs with it too."""
    total = sum(sum(r) for r in rates.values())
    ranks = []
    for host, per_rank in rates.items():
        for local, rate in enumerate(per_rank):
            ranks.append(
                RankRate(
                    rank=len(ranks),
                    host=host,
                    local_rank=local,
                    examples_per_s=rate,
                    share=rate / total,
                    examples=rate * 10,
                    seconds=10.0,
                    reports=20,
                )
            )
    calibration = Calibration(
        measured_performance={h: sum(r) for h, r in rates.items()},
        workload_distribution={h: sum(r) / total for h, r in rates.items()},
        calibration_notes="made by the test",
        when=datetime(2026, 11, 24, tzinfo=timezone.utc),
        job_id="calibrate-test",
        seconds=10.0,
        hosts=list(rates),
        ranks=ranks,
    )
    return save_calibration(calibration, path)


def _weighted_plan(tmp_path: Path, machines: list[Machine], **fields: Any) -> dict[str, Any]:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    req = JobRequest(
        script=str(script),
        launcher="python",
        master_port=29533,
        resource_requirements=ResourceRequirements(num_machines=len(machines)),
        **fields,
    )
    launch = job_description("j-w", req, machines, ServerSettings(run_dir=tmp_path / "runs"))
    return execution_plan(launch, Selection(chosen=machines))


def test_a_calibration_file_weighs_every_planned_rank(tmp_path: Path) -> None:
    machines = [machine("sim1", local=True, slots=2), machine("sim2", local=True, slots=2)]
    cal = calibration_file(tmp_path / "cal.json", {"sim1": [300.0, 300.0], "sim2": [100.0, 100.0]})
    plan = _weighted_plan(tmp_path, machines, calibration=str(cal), nproc_per_node=2)
    assert plan["workload_weights"] == [
        {"host": "sim1", "node_rank": 0, "local_rank": 0, "weight": 0.375, "fits": None},
        {"host": "sim1", "node_rank": 0, "local_rank": 1, "weight": 0.375, "fits": None},
        {"host": "sim2", "node_rank": 1, "local_rank": 0, "weight": 0.125, "fits": None},
        {"host": "sim2", "node_rank": 1, "local_rank": 1, "weight": 0.125, "fits": None},
    ]
    assert plan["rebalance"] is False
    # every rank gets them in its environment, as corral run hands them over
    for node in plan["nodes"]:
        assert node["env"]["CORRAL_WORKLOAD_WEIGHTS"] == "0.375,0.375,0.125,0.125"


def test_a_calibration_of_more_hosts_is_renormalised_over_the_chosen_ones(tmp_path: Path) -> None:
    machines = [machine("sim2", local=True, slots=1), machine("sim3", local=True, slots=1)]
    rates = {"sim1": [500.0], "sim2": [300.0], "sim3": [100.0]}
    cal = calibration_file(tmp_path / "cal.json", rates)
    plan = _weighted_plan(tmp_path, machines, calibration=str(cal), rebalance=True)
    assert [(w["host"], w["weight"]) for w in plan["workload_weights"]] == [
        ("sim2", 0.75),
        ("sim3", 0.25),
    ]
    assert plan["rebalance"] is True


def test_ssh_machines_match_a_calibration_by_address(tmp_path: Path) -> None:
    # `corral calibrate --hosts gpu1.lan,gpu2.lan` names the hosts by address
    machines = [machine("gpu1", slots=1), machine("gpu2", slots=1)]
    cal = calibration_file(tmp_path / "cal.json", {"gpu1.lan": [200.0], "gpu2.lan": [100.0]})
    req = request(num=2, calibration=str(cal))
    launch = job_description("j-a", req, machines, ServerSettings(run_dir=tmp_path / "runs"))
    assert list(launch.options.workload_weights) == [round(2 / 3, 6), round(1 / 3, 6)]
    assert job_spec(launch.options).workload_weights == tuple(launch.options.workload_weights)


def test_workload_weights_given_directly_are_normalised(tmp_path: Path) -> None:
    machines = [machine("sim1", local=True, slots=1), machine("sim2", local=True, slots=1)]
    plan = _weighted_plan(tmp_path, machines, workload_weights=[3, 1])
    assert [w["weight"] for w in plan["workload_weights"]] == [0.75, 0.25]


def test_an_even_job_has_no_weights(tmp_path: Path) -> None:
    machines = [machine("sim1", local=True, slots=1)]
    plan = _weighted_plan(tmp_path, machines)
    assert plan["workload_weights"] is None
    assert "CORRAL_WORKLOAD_WEIGHTS" not in plan["nodes"][0]["env"]


@pytest.mark.parametrize(
    ("rates", "fields", "field", "says"),
    [
        (None, {}, "calibration", "calibration: calibration file"),
        ({"sim1": [1.0, 1.0]}, {}, "calibration", "host sim2 is not in the calibration"),
        (
            {"sim1": [1.0], "sim2": [2.0]},
            {},
            "calibration",
            "host sim1 ran 1 rank(s) in the calibration but this run plans 2",
        ),
        (
            {"sim1": [1.0, 1.0], "sim2": [2.0, 2.0]},
            {"workload_weights": [1.0, 2.0]},
            "calibration",
            "not both",
        ),
    ],
    ids=["missing-file", "unmeasured-host", "other-rank-count", "both"],
)
def test_a_calibration_that_does_not_fit_is_invalid_naming_the_field(
    tmp_path: Path,
    rates: dict[str, list[float]] | None,
    fields: dict[str, Any],
    field: str,
    says: str,
) -> None:
    machines = [machine("sim1", local=True, slots=2), machine("sim2", local=True, slots=2)]
    path = tmp_path / "cal.json"
    if rates is not None:
        calibration_file(path, rates)
    with pytest.raises(Invalid) as err:
        _weighted_plan(tmp_path, machines, calibration=str(path), nproc_per_node=2, **fields)
    assert err.value.info == {"field": field}
    assert says in err.value.message
    if rates is not None and "sim2" not in rates:  # the fix, for these machines
        assert "corral calibrate --hosts local:2 --nproc-per-node 2" in err.value.message
        assert "names its nodes local-0, local-1: register the local machines" in (
            err.value.message
        )


def test_local_machines_named_as_local_n_match_a_local_n_calibration(tmp_path: Path) -> None:
    # what `corral calibrate --hosts local:2` saves: nodes local-0 and local-1
    machines = [machine("local-0", local=True, slots=1), machine("local-1", local=True, slots=1)]
    cal = calibration_file(tmp_path / "cal.json", {"local-0": [100.0], "local-1": [300.0]})
    plan = _weighted_plan(tmp_path, machines, calibration=str(cal))
    assert [w["weight"] for w in plan["workload_weights"]] == [0.25, 0.75]
    with pytest.raises(Invalid) as err:  # one rank planned per node, two measured on local-1
        calibration_file(cal, {"local-0": [100.0], "local-1": [300.0, 300.0]})
        _weighted_plan(tmp_path, machines, calibration=str(cal))
    assert "host local-1 ran 2 rank(s)" in err.value.message
    assert "register the local machines" not in err.value.message


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"workload_weights": [1.0, 1.0, 1.0]}, "workload_weights", "3 weights for 2 planned"),
        ({"rebalance": True}, "rebalance", "rebalance needs a calibration"),
    ],
)
def test_weights_mistakes_name_their_field(
    tmp_path: Path, fields: dict[str, Any], field: str, says: str
) -> None:
    machines = [machine("sim1", local=True, slots=1), machine("sim2", local=True, slots=1)]
    with pytest.raises(Invalid) as err:
        _weighted_plan(tmp_path, machines, **fields)
    assert err.value.info == {"field": field}
    assert says in err.value.message


@pytest.mark.parametrize("weights", [[1.0, 0.0], [1.0, -2.0], [], [1.0, math.inf]])
def test_workload_weights_must_be_positive_numbers(weights: list[float]) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="workload_weights"):
        JobRequest(script="t.py", workload_weights=weights)


@pytest.mark.parametrize(
    "where", ["directory", "/dev/null", "fifo", "missing", "binary", "not-json", "other-json"]
)
def test_a_calibration_the_server_cannot_use_is_one_message_whatever_the_reason(
    tmp_path: Path, where: str
) -> None:
    """Nothing in the answer tells whether (or what) a file of the server is there."""
    machines = [machine("sim1", local=True, slots=1)]
    path = tmp_path / where
    if where == "directory":
        path.mkdir()
    elif where == "fifo":
        os.mkfifo(path)  # no writer: a read would block the planner
    elif where == "binary":
        path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    elif where == "not-json":
        path.write_text("root:x:0:0:root:/root:/bin/bash\n")
    elif where == "other-json":
        path.write_text('{"users": ["alice"]}')
    given = "/dev/null" if where == "/dev/null" else str(path)
    with pytest.raises(Invalid) as err:
        _weighted_plan(tmp_path, machines, calibration=given)
    assert err.value.info == {"field": "calibration"}
    assert err.value.message == (
        f"calibration: calibration file {given!r} cannot be used: it is not a file of "
        "`corral calibrate` that the server can read (give the path, on the server, of "
        "the JSON file corral calibrate saved)"
    )


def test_a_calibration_path_with_a_nul_byte_is_refused_by_the_model() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="calibration"):
        JobRequest(script="t.py", calibration="runs/\0.json")
