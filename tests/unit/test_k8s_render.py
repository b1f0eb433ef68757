"""``corral k8s render``: golden YAML, every render valid against the Kubernetes
schemas (strict), the Service that selects only its own job's pods (seed 004's
selected every pod as "master"), secrets never in the YAML, bad input, and the
``[pod:rank]`` log prefix on real ``kubernetes.client`` models."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from corral.cli import main as cli_main
from corral.cli.main import _register, app
from corral.errors import ConfigError
from corral.k8s.render import (
    _MASTER_REPLACED,
    COMPLETION_INDEX,
    CONTAINER,
    GAVE_UP_EXIT,
    JOB_LABEL,
    MASTER_LOST_EXIT,
    K8sTarget,
    master_addr,
    render_k8s,
    render_spec,
    secret_keys,
    to_yaml,
)
from corral.plan.spec import JobSpec
from tests.conftest import require

_register()
GOLDEN = Path(__file__).parent / "golden" / "k8s"
SCHEMA_VERSIONS = ("1.31.0", "1.37.0")  # podFailurePolicy is GA from 1.31


def _spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = dict(
        script="train.py",
        args=("--epochs", "3", "--data", "$(not a k8s var)"),
        job_id="train-1",
        env={"WANDB_MODE": "offline"},
        rdzv_timeout=600.0,
    )
    base.update(kw)
    return JobSpec(**base)


CASES: dict[str, tuple[JobSpec, K8sTarget]] = {
    "cpu": (_spec(), K8sTarget(image="registry.example/train:1", nodes=2)),
    "gpu": (
        _spec(max_restarts=2, timeout=7200.5, checkpoint_dir="/ckpt/train-1", workdir="/code"),
        K8sTarget(
            image="registry.example/train:1",
            nodes=4,
            gpus_per_node=8,
            shm_size="16Gi",
            pvcs=(("checkpoints", "/ckpt"),),
            fail_exit_codes=(2, 42),
        ),
    ),
    "secret_env": (
        _spec(env={"WANDB_MODE": "offline"}, secret_env=("HF_TOKEN", "DB_URL")),
        K8sTarget(image="registry.example/train:1", nodes=2, secret_name="train-secrets"),
    ),
    "namespace_python": (
        _spec(launcher="python", nccl_interface="ib0", gloo_interface="eth1", master_port=23456),
        K8sTarget(image="registry.example/train:1", nodes=3, namespace="ml-team"),
    ),
}


def _render(case: str) -> list[dict[str, Any]]:
    spec, target = CASES[case]
    return render_spec(spec, target)


def _job(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "Job")


def _service(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "Service")


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = _job(objects)["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == [CONTAINER]
    return dict(containers[0])


def _env(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in _container(objects)["env"]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_render_matches_golden(case: str) -> None:
    spec, target = CASES[case]
    text = to_yaml(render_spec(spec, target), header=f"golden case {case}")
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("CORRAL_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()
    assert [d for d in yaml.safe_load_all(text) if d] == render_spec(spec, target)


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_render_is_valid_kubernetes(case: str, version: str) -> None:
    validator = require("kubernetes_validate", "schema validation of the renders")
    for obj in _render(case):
        try:
            validator.validate(obj, version, strict=True)
        except validator.ValidationError as exc:
            pytest.fail(f"{case}: {obj['kind']} invalid for Kubernetes {version}: {exc.message}")


def test_the_validator_rejects_a_broken_job() -> None:
    """The check above can fail: an unknown field and a string count are refused."""
    validator = require("kubernetes_validate", "schema validation of the renders")
    job = _job(_render("cpu"))
    broken = yaml.safe_load(yaml.safe_dump(job))
    broken["spec"]["completions"] = "2"
    with pytest.raises(validator.ValidationError):
        validator.validate(broken, "1.37.0", strict=True)
    broken = yaml.safe_load(yaml.safe_dump(job))
    broken["spec"]["template"]["spec"]["containers"][0]["gpus"] = 8
    with pytest.raises(validator.ValidationError):
        validator.validate(broken, "1.37.0", strict=True)


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_service_selects_only_its_own_jobs_pods() -> None:
    """Seed 004's Service selected ``role: master`` on every pod of every job; corral's
    selects its job's pods by job id, and no pod of another job."""
    mine = _render("cpu")
    other = render_spec(_spec(job_id="train-2"), CASES["cpu"][1])
    selector = _service(mine)["spec"]["selector"]
    assert selector == {JOB_LABEL: "train-1"}
    assert "role" not in selector
    my_pods = _job(mine)["spec"]["template"]["metadata"]["labels"]
    other_pods = _job(other)["spec"]["template"]["metadata"]["labels"]
    assert _selects(selector, my_pods)
    assert not _selects(selector, other_pods)
    assert not _selects(_service(other)["spec"]["selector"], my_pods)


@pytest.mark.parametrize("case", sorted(CASES))
def test_pods_have_stable_names_and_a_rank_each(case: str) -> None:
    objects = _render(case)
    job, service = _job(objects), _service(objects)
    name = job["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == CASES[case][1].nodes
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    env = _env(objects)
    assert env["MASTER_ADDR"]["value"] == f"{name}-0.{service['metadata']['name']}"
    assert master_addr(name) == env["MASTER_ADDR"]["value"]
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        f"metadata.annotations['{COMPLETION_INDEX}']"
    )
    assert env["NNODES"]["value"] == str(CASES[case][1].nodes)
    port = service["spec"]["ports"][0]["port"]
    assert env["MASTER_PORT"]["value"] == str(port)
    assert _container(objects)["ports"][0]["containerPort"] == port


def test_torchrun_uses_c10d_with_explicit_timeouts() -> None:
    script = _container(_render("gpu"))["command"][2]
    assert "python3 -m torch.distributed.run" in script
    assert "--nnodes=4 --nproc-per-node=8" in script
    assert "--rdzv-backend=c10d" in script
    assert '--rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}"' in script
    assert "--rdzv-id=train-1" in script
    assert "join_timeout=${CORRAL_RDZV_TIMEOUT},read_timeout=60,is_host=${is_host}" in script
    assert "--max-restarts=2" in script
    env = _env(_render("gpu"))
    assert env["CORRAL_RDZV_TIMEOUT"]["value"] == "600"
    assert env["CORRAL_DIST_TIMEOUT"]["value"] == "1800"
    assert env["WORLD_SIZE"]["value"] == "32"


def test_non_zero_pods_wait_for_the_master_first() -> None:
    script = _container(_render("cpu"))["command"][2]
    wait = script.index("socket.create_connection")
    assert script.index('if [ "${NODE_RANK}" = 0 ]') < wait < script.index("torch.distributed")
    assert "does not resolve" in script and "refuses connections" in script
    assert "sys.exit(3)" in script


def test_gpu_shm_restarts_and_failure_policy() -> None:
    objects = _render("gpu")
    job, container = _job(objects), _container(objects)
    assert container["resources"] == {
        "requests": {"nvidia.com/gpu": 8},
        "limits": {"nvidia.com/gpu": 8},
    }
    pod = job["spec"]["template"]["spec"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in pod["volumes"]
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    # torchrun restarts the ranks in place: a pod that fails by itself costs one restart
    assert job["spec"]["backoffLimit"] == 2
    assert job["spec"]["activeDeadlineSeconds"] == 7201
    rules = job["spec"]["podFailurePolicy"]["rules"]
    # a disruption first: the exit code of a pod stopped by one says nothing
    assert rules[0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert rules[1]["action"] == "Ignore"
    assert rules[1]["onExitCodes"]["values"] == [MASTER_LOST_EXIT]
    assert rules[2]["action"] == "FailJob"
    assert rules[2]["onExitCodes"]["values"] == sorted([2, 42, GAVE_UP_EXIT])
    assert rules[2]["onExitCodes"]["containerName"] == CONTAINER
    assert len(rules) == 3


def test_cpu_pods_ask_for_no_gpu() -> None:
    objects = _render("cpu")
    assert "resources" not in _container(objects)
    assert _job(objects)["spec"]["backoffLimit"] == 0
    env = _env(objects)
    # NCCL and gloo pick the pod's interface themselves unless told: no eth0 forced
    assert "NCCL_SOCKET_IFNAME" not in env and "GLOO_SOCKET_IFNAME" not in env


def test_interfaces_namespace_and_the_python_launcher() -> None:
    objects = _render("namespace_python")
    assert {o["metadata"]["namespace"] for o in objects} == {"ml-team"}
    env = _env(objects)
    assert env["NCCL_SOCKET_IFNAME"]["value"] == "ib0"
    assert env["GLOO_SOCKET_IFNAME"]["value"] == "eth1"
    assert env["RANK"]["valueFrom"] == env["NODE_RANK"]["valueFrom"]
    assert env["WORLD_SIZE"]["value"] == "3"
    script = _container(objects)["command"][2]
    assert 'python3 "$@" &' in script and "torch.distributed.run" not in script
    # no in-place restarts: every restart of the job takes all pods down
    spec, target = CASES["namespace_python"]
    job = _job(render_spec(dataclasses.replace(spec, max_restarts=2), target))
    assert job["spec"]["backoffLimit"] == 2 * 3
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[-1]["onExitCodes"]["values"] == [2]  # no GAVE_UP_EXIT: no torchrun


def test_secrets_are_references_never_values() -> None:
    objects = _render("secret_env")
    env = _env(objects)
    for key in ("HF_TOKEN", "DB_URL"):
        assert env[key] == {
            "name": key,
            "valueFrom": {"secretKeyRef": {"name": "train-secrets", "key": key}},
        }
    assert env["WANDB_MODE"] == {"name": "WANDB_MODE", "value": "offline"}
    assert secret_keys(CASES["secret_env"][0]) == ["HF_TOKEN", "DB_URL"]


def test_a_secret_value_is_refused_not_written() -> None:
    spec = _spec(env={"HF_TOKEN": "hf_s3cr3t"})
    with pytest.raises(ConfigError, match="HF_TOKEN is secret") as err:
        render_spec(spec, K8sTarget(image="i", nodes=1, secret_name="s"))
    assert err.value.option == "--env"
    assert "hf_s3cr3t" not in str(err.value)


def test_user_strings_are_not_expanded_by_kubernetes() -> None:
    """Kubernetes expands $(VAR) in command, args and env values; corral escapes the
    user's, and its own script contains no $( nor $$."""
    container = _container(_render("cpu"))
    assert container["args"][-1] == "$$(not a k8s var)"
    script = container["command"][2]
    assert "$(" not in script and "$$" not in script


BAD: list[tuple[dict[str, Any], dict[str, Any], str, str]] = [
    ({"job_id": "Train_1"}, {}, "--job-id", "lower-case letters"),
    ({"job_id": "7up"}, {}, "--job-id", "starting with a letter"),
    ({"job_id": "a" * 62}, {"nodes": 10}, "--job-id", "at most"),
    ({}, {"namespace": "ML"}, "--namespace", "not a namespace"),
    ({}, {"nodes": 0}, "--nodes", "at least 1"),
    ({}, {"gpus_per_node": -1}, "--gpus-per-node", "0 (CPU)"),
    ({}, {"image": "my image"}, "--image", "not an image"),
    ({"launcher": "mlx"}, {}, "--launcher", "not available on Kubernetes"),
    ({"launcher": "python", "nproc_per_node": 2}, {}, "--nproc-per-node", "one rank per pod"),
    ({"master_port": 0}, {}, "--master-port", "fixed port"),
    ({"rdzv_timeout": 0.0}, {}, "--rdzv-timeout", "positive"),
    ({}, {"shm_size": "16 GB"}, "--shm-size", "quantity"),
    ({}, {"pvcs": (("data", "rel/path"),)}, "--pvc", "absolute"),
    ({}, {"pvcs": (("data", "/dev/shm"),)}, "--pvc", "mounted twice"),
    ({}, {"fail_exit_codes": (0,)}, "--fail-exit-code", "1-255"),
    ({"env": {"MASTER_ADDR": "x"}}, {}, "--env", "set by corral"),
    ({"env": {"1X": "x"}}, {}, "--env", "not a valid environment variable"),
    ({"secret_env": ("HF_TOKEN",)}, {}, "--k8s-secret", "name it with"),
    ({}, {"secret_name": "s"}, "--k8s-secret", "no secret --env key"),
    ({"secret_env": ("A",)}, {"secret_name": "Bad_Name"}, "--k8s-secret", "not a Secret"),
    ({}, {"fail_exit_codes": (MASTER_LOST_EXIT,)}, "--fail-exit-code", "master was replaced"),
    ({}, {"cpu": "8 cores"}, "--cpu", "not a Kubernetes quantity"),
    ({}, {"memory": "64GB"}, "--memory", "not a Kubernetes quantity"),
    ({}, {"cpu": "2", "cpu_limit": "1500m"}, "--cpu-limit", "less than the request"),
    ({}, {"memory": "1Gi", "memory_limit": "1000Mi"}, "--memory-limit", "less than"),
    ({}, {"node_selector": (("bad key!", "x"),)}, "--node-selector", "not a label key"),
    ({}, {"node_selector": (("pool", "a b"),)}, "--node-selector", "not a label value"),
    ({}, {"tolerations": ("gpu=true:Sometimes",)}, "--toleration", "effect must be one of"),
    ({}, {"tolerations": ("=x:NoSchedule",)}, "--toleration", "not a taint key"),
    ({}, {"image_pull_secrets": ("Regcred",)}, "--image-pull-secret", "not a Kubernetes"),
    ({}, {"service_account": "trainer_sa"}, "--service-account", "not a Kubernetes"),
]


@pytest.mark.parametrize(("spec_kw", "target_kw", "option", "words"), BAD)
def test_bad_input_names_the_option(
    spec_kw: dict[str, Any], target_kw: dict[str, Any], option: str, words: str
) -> None:
    target: dict[str, Any] = {"image": "img:1", "nodes": 2}
    target.update(target_kw)
    with pytest.raises(ConfigError) as err:
        render_spec(_spec(**spec_kw), K8sTarget(**target))
    assert err.value.option == option
    assert words in str(err.value)


# --- the command line -------------------------------------------------------------


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["k8s", *args], env={"COLUMNS": "100"})
    return result.exit_code, result.stdout, result.stderr


def _main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["corral", "k8s", *args])
    with pytest.raises(SystemExit) as exited:
        cli_main.main()
    return int(exited.value.code or 0)


@pytest.fixture(autouse=True)
def _no_corral_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("CORRAL_") and name != "CORRAL_UPDATE_GOLDEN":
            monkeypatch.delenv(name)


def test_cli_render_prints_the_same_yaml_as_the_function() -> None:
    code, out, err = _cli(
        "render", "--image", "registry.example/train:1", "--nodes", "2", "--job-id", "train-1",
        "--env", "WANDB_MODE=offline", "--rdzv-timeout", "600",
        "--", "train.py", "--epochs", "3", "--data", "$(not a k8s var)",
    )  # fmt: skip
    assert code == 0, err
    assert [d for d in yaml.safe_load_all(out) if d] == _render("cpu")


def test_cli_render_bare_env_and_secret_env_become_secret_refs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "job.yaml"
    code = _main(
        monkeypatch,
        "render", "--image", "img:1", "--nodes", "2", "--gpus-per-node", "1",
        "--job-id", "t", "--env", "HF_TOKEN", "--env", "DB_URL=postgres://u:pw@db/x",
        "--secret-env", "DB_URL", "--k8s-secret", "creds", "-o", str(target), "--", "t.py",
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2, out + err  # a value for a --secret-env key: refused, never written
    assert "DB_URL is secret" in err and "pw@db" not in out + err and not target.exists()
    code, out, err = _cli(
        "render", "--image", "img:1", "--nodes", "2", "--gpus-per-node", "1",
        "--job-id", "t", "--env", "HF_TOKEN", "--env", "DB_URL", "--k8s-secret", "creds",
        "-o", str(target), "--", "t.py",
    )  # fmt: skip
    assert code == 0, err
    assert out == "" and f"wrote {target}" in err
    env = _env([d for d in yaml.safe_load_all(target.read_text()) if d])
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "creds", "key": "HF_TOKEN"}
    assert env["DB_URL"]["valueFrom"]["secretKeyRef"] == {"name": "creds", "key": "DB_URL"}


def test_cli_render_default_job_id_is_a_valid_name() -> None:
    code, out, err = _cli("render", "--image", "img:1", "--", "t.py")
    assert code == 0, err
    job = _job([d for d in yaml.safe_load_all(out) if d])
    assert job["metadata"]["name"].startswith("corral-")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["render", "--", "t.py"], "error: --image: the pods need an image: --image IMAGE"),
        (["render", "--image", "i"], "error: no script given"),
        (
            ["render", "--image", "i", "--nproc-per-node", "x", "--", "t.py"],
            "error: --nproc-per-node",
        ),
        (["render", "--image", "i", "--pvc", "nocolon", "--", "t.py"], "error: --pvc: 'nocolon'"),
        (["apply", "-f", "/nonexistent/job.yaml"], "error: -f: cannot read /nonexistent/job.yaml"),
    ],
)
def test_cli_errors_are_one_line(
    args: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _main(monkeypatch, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["apply", "--image", "img:1", "--", "t.py"],
        ["logs", "train-1"],
        ["logs", "train-1", "-f"],
        ["delete", "train-1"],
    ],
)
def test_without_a_cluster_every_verb_says_so(
    args: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert _main(monkeypatch, *args) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "error: --kubeconfig: no kubeconfig at ~/.kube/config; set KUBECONFIG or pass "
        "--kubeconfig FILE"
    )


def test_a_broken_kubeconfig_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    monkeypatch.setenv("KUBECONFIG", str(config))
    assert _main(monkeypatch, "delete", "train-1") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --kubeconfig: kubeconfig {config}: "), err
    assert "Traceback" not in err


# --- logs: [pod:rank] on real kubernetes.client models ----------------------------------


def _pod(name: str, index: str | None, *, label: bool = False) -> Any:
    client = require("kubernetes.client", "the kubernetes client (corral[k8s])")
    marks = {COMPLETION_INDEX: index} if index is not None else None
    meta = client.V1ObjectMeta(
        name=name, annotations=None if label else marks, labels=marks if label else None
    )
    return client.V1Pod(metadata=meta)


def test_log_lines_are_prefixed_pod_and_rank() -> None:
    from corral.k8s.client import log_prefix, pod_rank, prefixed_lines

    pod = _pod("train-1-1-x7k2p", "1")
    assert pod_rank(pod) == "1"
    assert log_prefix(pod) == "[train-1-1-x7k2p:1]"
    assert prefixed_lines(pod, "loss 0.5\nloss 0.4\n") == [
        "[train-1-1-x7k2p:1] loss 0.5",
        "[train-1-1-x7k2p:1] loss 0.4",
    ]
    assert prefixed_lines(pod, "") == []
    assert pod_rank(_pod("p", "3", label=True)) == "3"  # the label (Kubernetes >= 1.28)
    assert log_prefix(_pod("p", None)) == "[p:?]"


def test_scheduling_options_reach_the_pod() -> None:
    target = K8sTarget(
        image="img:1",
        nodes=2,
        gpus_per_node=8,
        cpu="16",
        memory="128Gi",
        cpu_limit="32",
        memory_limit="128Gi",
        node_selector=(("cloud.google.com/gke-accelerator", "nvidia-h100-80gb"), ("pool", "on")),
        tolerations=("nvidia.com/gpu:NoSchedule", "dedicated=ml", "spot=true:NoExecute"),
        image_pull_secrets=("regcred", "regcred", "mirror"),
        service_account="trainer",
    )
    objects = render_spec(_spec(), target)
    pod = _job(objects)["spec"]["template"]["spec"]
    assert _container(objects)["resources"] == {
        "requests": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": 8},
        "limits": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": 8},
    }
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
        "pool": "on",
    }
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml"},
        {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute"},
    ]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}]
    assert pod["serviceAccountName"] == "trainer"
    # a request without a limit: no limit written
    only = render_spec(_spec(), K8sTarget(image="i", nodes=1, cpu="500m", memory="1e3"))
    assert _container(only)["resources"] == {"requests": {"cpu": "500m", "memory": "1e3"}}
    validator = require("kubernetes_validate", "schema validation of the renders")
    for version in SCHEMA_VERSIONS:
        for obj in objects:
            validator.validate(obj, version, strict=True)


def test_interfaces_are_set_only_when_asked() -> None:
    env = _env(render_spec(_spec(nccl_interface="ib0"), K8sTarget(image="i", nodes=2)))
    assert env["NCCL_SOCKET_IFNAME"]["value"] == "ib0"
    assert "GLOO_SOCKET_IFNAME" not in env


@pytest.mark.parametrize(
    ("joined", "master", "replaced"),
    [("127.0.0.1", "127.0.0.1", False), ("10.9.8.7", "127.0.0.1", True), ("127.0.0.1", "", True)],
)
def test_the_master_replaced_check(joined: str, master: str, replaced: bool) -> None:
    """After its ranks failed, a pod other than 0 exits MASTER_LOST_EXIT (not counted)
    only when pod 0's address changed since it joined, or it no longer resolves."""
    name = master or "corral-no-such-host.invalid"
    done = subprocess.run(
        [sys.executable, "-", joined],
        input=_MASTER_REPLACED,
        text=True,
        env={**os.environ, "MASTER_ADDR": name},
        timeout=60,
    )
    assert done.returncode == (0 if replaced else 1)


def test_cli_scheduling_options(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(
        "render", "--image", "img:1", "--nodes", "2", "--job-id", "t",
        "--cpu", "4", "--memory", "16Gi", "--cpu-limit", "8", "--memory-limit", "16Gi",
        "--node-selector", "pool=gpu", "--toleration", "nvidia.com/gpu:NoSchedule",
        "--image-pull-secret", "regcred", "--service-account", "trainer", "--", "t.py",
    )  # fmt: skip
    assert code == 0, err
    objects = [d for d in yaml.safe_load_all(out) if d]
    pod = _job(objects)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "trainer"
    assert _container(objects)["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"cpu": "8", "memory": "16Gi"},
    }
    code = _main(monkeypatch, "render", "--image", "i", "--node-selector", "novalue", "--", "t")
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --node-selector: 'novalue' is not LABEL=VALUE")


def test_the_render_takes_the_job_description_built_by_the_builder() -> None:
    """The render of a JobDescription is the golden case's: its spec is built and
    validated by the one builder (the restart budget from the options, not patched in),
    and a bad option is refused as ``corral run`` refuses it."""
    from corral.cluster.model import Cluster
    from corral.job.describe import JobDescription, JobOptions
    from corral.k8s.render import k8s_spec

    spec, target = CASES["gpu"]
    options = JobOptions(
        command=(spec.script, *spec.args),
        job_id=spec.job_id,
        env=dict(spec.env),
        rdzv_timeout=spec.rdzv_timeout,
        max_restarts=2,
        timeout=spec.timeout,
        checkpoint_dir=spec.checkpoint_dir,
        workdir=spec.workdir,
        master_port=spec.master_port,
    )
    description = JobDescription(options, Cluster((), source="kubernetes"))
    assert k8s_spec(description).max_restarts == 2
    assert render_k8s(description, target) == render_spec(spec, target)
    bad = JobDescription(dataclasses.replace(options, launcher="bogus"), description.cluster)
    with pytest.raises(ConfigError) as caught:
        render_k8s(bad, target)
    assert caught.value.option == "--launcher"
