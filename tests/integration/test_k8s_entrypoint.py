"""The container command ``corral k8s render`` writes, run for real (no cluster here).

Each "pod" is a local process started with the rendered ``command`` + ``args`` and
the env its pod would get: the completion index for the downward-API fields, the
Secret's values for ``secretKeyRef``, and ``$(VAR)``/``$$`` expanded as the kubelet
does. Only MASTER_ADDR is pointed at 127.0.0.1 (pod 0's DNS name exists only in a
cluster); the tests of the master-readiness wait use the real name. torchrun's
c10d rendezvous and a gloo all-reduce run for real on CPU.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from corral.k8s.render import GAVE_UP_EXIT, MASTER_NOT_READY_EXIT, K8sTarget, render_spec
from corral.plan.spec import JobSpec

pytestmark = pytest.mark.torch

TIMEOUT = 180
SECRETS = {"HF_TOKEN": "hf-s3cr3t"}
TRAIN = """\
import os, sys
if os.environ.get("FAIL_FIRST") and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
    # every rank, in the first round only, before its group: a round torn down while
    # gloo's mesh is half built leaves the next round unable to connect on torch 2.13
    # (and before importing torch, which costs each rank ~2 CPU-s)
    sys.exit(7)
if os.environ.get("NO_TORCH"):
    # where torchrun's restart is the subject, not the group: the rank says what torchrun
    # gave it, without importing torch
    os.write(1, (f"rank {os.environ['RANK']}/{os.environ['WORLD_SIZE']} "
                 f"node {os.environ['NODE_RANK']} round {os.environ['TORCHELASTIC_RESTART_COUNT']}"
                 "\\n").encode())
    sys.exit(0)
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank)])
dist.all_reduce(total)
token = os.environ.get("HF_TOKEN") == "hf-s3cr3t"
# one write per line: the pod's ranks share its stdout (and PYTHONUNBUFFERED makes
# print() write the text and its newline separately)
os.write(1, (f"rank {rank}/{world} node {os.environ['NODE_RANK']} sum {total.item():g} "
             f"token {token} arg {sys.argv[1]}\\n").encode())
dist.destroy_process_group()
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    sys.exit(2)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kubelet_expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of ``command``/``args``/env values: ``$$`` is ``$``,
    ``$(VAR)`` the value of a var defined before (else left as written)."""
    out: list[str] = []
    i = 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if value.startswith("$(", i) and (end := value.find(")", i + 2)) != -1:
            name = value[i + 2 : end]
            out.append(env.get(name, value[i : end + 1]))
            i = end + 1
            continue
        out.append(value[i])
        i += 1
    return "".join(out)


def _pod_env(container: dict[str, Any], index: int, overrides: dict[str, str]) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "JOB_COMPLETION_INDEX": str(index),
    }
    for var in container["env"]:
        source = var.get("valueFrom", {})
        if "fieldRef" in source:
            assert "job-completion-index" in source["fieldRef"]["fieldPath"]
            env[var["name"]] = str(index)
        elif "secretKeyRef" in source:
            env[var["name"]] = SECRETS[source["secretKeyRef"]["key"]]
        else:
            env[var["name"]] = kubelet_expand(var["value"], env)
    env.update(overrides)
    return env


def start_pod(
    objects: list[dict[str, Any]], index: int, cwd: Path, **overrides: str
) -> subprocess.Popen[str]:
    job = next(o for o in objects if o["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = _pod_env(container, index, overrides)
    argv = [kubelet_expand(a, env) for a in (*container["command"], *container["args"])]
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _render(
    tmp_path: Path, launcher: str, nodes: int, nproc: int, **kw: Any
) -> list[dict[str, Any]]:
    (tmp_path / "train.py").write_text(TRAIN)
    spec = JobSpec(
        script="train.py",
        args=("$(not-expanded)",),
        launcher=launcher,  # type: ignore[arg-type]
        job_id="k8s-e2e",
        python=sys.executable,
        nproc_per_node=nproc,
        master_port=kw.pop("port", _free_port()),
        secret_env=("HF_TOKEN",),
        gloo_interface="lo",
        rdzv_timeout=kw.pop("rdzv_timeout", 120.0),
        max_restarts=kw.pop("max_restarts", 0),
    )
    return render_spec(spec, K8sTarget(image="img", nodes=nodes, secret_name="creds"))


def _finish(pods: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    done = []
    for pod in pods:
        out, err = pod.communicate(timeout=TIMEOUT)
        done.append((pod.returncode, out, err))
    return done


@pytest.mark.slow
def test_two_pods_rendezvous_through_the_rendered_entrypoint(tmp_path: Path) -> None:
    objects = _render(tmp_path, "torchrun", nodes=2, nproc=2)
    pods = [start_pod(objects, 1, tmp_path, MASTER_ADDR="127.0.0.1")]
    time.sleep(1.0)  # pod 1 first: it must wait for pod 0
    pods.insert(0, start_pod(objects, 0, tmp_path, MASTER_ADDR="127.0.0.1"))
    (code0, out0, err0), (code1, out1, err1) = _finish(pods)
    assert (code0, code1) == (0, 0), err0 + err1
    # global ranks are assigned at the c10d rendezvous: two per pod, not by pod index
    ranks = [line.split() for line in (out0 + out1).splitlines() if line.startswith("rank ")]
    assert sorted(r[1] for r in ranks) == ["0/4", "1/4", "2/4", "3/4"], out0 + out1 + err0 + err1
    assert sorted(r[3] for r in ranks) == ["0", "0", "1", "1"]
    # each rank's NODE_RANK is the node c10d put it on: RANK = NODE_RANK * 2 + LOCAL_RANK
    assert all(int(r[1].split("/")[0]) // 2 == int(r[3]) for r in ranks), ranks
    assert {" ".join(r[4:]) for r in ranks} == {"sum 6 token True arg $(not-expanded)"}
    assert "corral: waiting up to 120s for 127.0.0.1" in err1
    assert "is ready" in err1 and "waiting" not in err0


@pytest.mark.slow
@pytest.mark.parametrize(("restarts", "codes"), [(1, (0, 0)), (0, (GAVE_UP_EXIT, GAVE_UP_EXIT))])
def test_a_failed_rank_restarts_every_pod_in_place_while_the_budget_allows(
    tmp_path: Path, restarts: int, codes: tuple[int, int]
) -> None:
    """--max-restarts is torchrun's in every pod: the pods restart their ranks in place
    (no pod fails); with no restart left each pod exits GAVE_UP_EXIT (FailJob)."""
    objects = _render(tmp_path, "torchrun", nodes=2, nproc=1, max_restarts=restarts)
    env = {"MASTER_ADDR": "127.0.0.1", "FAIL_FIRST": "1", "NO_TORCH": "1"}
    pods = [start_pod(objects, i, tmp_path, **env) for i in (0, 1)]
    (code0, out0, err0), (code1, out1, err1) = _finish(pods)
    assert (code0, code1) == codes, err0 + err1
    if restarts:
        lines = (out0 + out1).splitlines()
        assert sorted(line.split()[1] for line in lines) == ["0/2", "1/2"]
        assert all(line.endswith(" round 1") for line in lines), lines  # the restarted round
    else:
        assert "torchrun gave up" in err0 + err1 and "rank " not in out0 + out1


@pytest.mark.slow
def test_the_python_launcher_runs_one_rank_per_pod_with_its_exit_code(tmp_path: Path) -> None:
    objects = _render(tmp_path, "python", nodes=2, nproc=1)
    pods = [start_pod(objects, i, tmp_path, MASTER_ADDR="127.0.0.1", FAIL_RANK="1") for i in (0, 1)]
    (code0, out0, err0), (code1, out1, err1) = _finish(pods)
    assert (code0, code1) == (0, 2), err0 + err1  # 2: the code podFailurePolicy fails the Job on
    assert "rank 0/2 node 0 sum 1 token True" in out0
    assert "rank 1/2 node 1 sum 1 token True" in out1


def test_a_master_name_that_never_resolves_is_named(tmp_path: Path) -> None:
    objects = _render(tmp_path, "torchrun", nodes=2, nproc=1, rdzv_timeout=2.0)
    ((code, out, err),) = _finish(
        [start_pod(objects, 1, tmp_path)]
    )  # MASTER_ADDR k8s-e2e-0.k8s-e2e
    assert code == MASTER_NOT_READY_EXIT, err
    assert "corral: master not ready after 2s: k8s-e2e-0.k8s-e2e does not resolve" in err
    assert "rank " not in out


def test_a_master_that_never_listens_is_named(tmp_path: Path) -> None:
    port = _free_port()
    objects = _render(tmp_path, "torchrun", nodes=2, nproc=1, rdzv_timeout=2.0, port=port)
    ((code, _, err),) = _finish([start_pod(objects, 1, tmp_path, MASTER_ADDR="127.0.0.1")])
    assert code == MASTER_NOT_READY_EXIT, err
    assert f"corral: master not ready after 2s: 127.0.0.1:{port} refuses connections" in err
