"""The YAML of ``corral k8s render`` means the same to every reader: strings that a
YAML 1.1 or 1.2 reader (Kubernetes' go-yaml included) would take for a number, a
bool, a null or a date are quoted. Checked over a table of such strings, with
PyYAML, and with ``kubectl --local`` (Kubernetes' own YAML decoding, no cluster)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral.k8s.render import CONTAINER, K8sTarget, needs_quotes, render_spec, to_yaml
from corral.plan.spec import JobSpec
from tests.conftest import missing_dependency

# Each is read as something else than a string by some YAML reader when written plain.
AMBIGUOUS = [
    "3e-4", "1e-2", "1E+3", "6.8523015e+5", "-1.5", ".5", "1.", "08", "0o17", "0O17",
    "017", "0x1F", "-0x1f", "0b101", "+5", "-12", "1_000", "1:20", "190:20:30.15",
    ".inf", "-.Inf", "+.INF", ".nan", ".NaN", "NaN", "inf",
    "y", "Y", "n", "N", "yes", "No", "ON", "off", "true", "False", "TRUE",
    "~", "null", "Null", "NULL", "", "<<", "=",
    "2001-12-14", "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.10 -5",
]  # fmt: skip
# ... and these are strings to every reader: written plain, as before.
PLAIN = ["train.py", "--lr", "offline", "eth0", "16Gi", "500m", "v1.2", "3e", "e3", "a1", "x=y"]


def _pod(strings: list[str]) -> dict[str, Any]:
    """A Pod whose container has ``strings`` as args, env names and env values."""
    env = [{"name": value, "value": value} for value in strings]
    container = {"name": "c", "image": "img:1", "args": list(strings), "env": env}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"x": "0o17"}},
        "spec": {"containers": [container], "nodeSelector": {s or "k": s for s in strings}},
    }


@pytest.mark.parametrize("value", AMBIGUOUS)
def test_ambiguous_strings_are_quoted(value: str) -> None:
    assert needs_quotes(value)
    text = to_yaml([{"v": value}])
    assert text.strip() in (f"v: '{value}'", f'v: "{value}"'), text
    assert yaml.safe_load(text) == {"v": value}


@pytest.mark.parametrize("value", PLAIN)
def test_plain_strings_stay_plain(value: str) -> None:
    assert not needs_quotes(value)
    assert to_yaml([{"v": value}]) == f"v: {value}\n"


def _kubectl(path: Path) -> list[dict[str, Any]]:
    """The objects of ``path`` as Kubernetes decodes them: ``kubectl label --local`` (no
    cluster) prints each as JSON."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        missing_dependency("kubectl is not installed (Kubernetes' YAML decoding)")
    done = subprocess.run(
        [kubectl, "label", "--local", "-f", str(path), "corral-test=1", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": str(path.parent / "no-kubeconfig")},
    )
    assert done.returncode == 0, done.stderr
    objects: list[dict[str, Any]] = []
    decoder, text, at = json.JSONDecoder(), done.stdout, 0
    while text[at:].strip():
        obj, end = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
        objects.append(obj)
        at = end
    return objects


def test_kubectl_reads_every_ambiguous_string_as_written(tmp_path: Path) -> None:
    strings = [s for s in AMBIGUOUS if s] + PLAIN
    path = tmp_path / "pod.yaml"
    path.write_text(to_yaml([_pod(strings)]))
    (pod,) = _kubectl(path)
    container = pod["spec"]["containers"][0]
    assert container["args"] == strings
    assert container["env"] == [{"name": s, "value": s} for s in strings]
    assert pod["spec"]["nodeSelector"] == {s: s for s in strings}
    assert pod["metadata"]["labels"] == {"x": "0o17", "corral-test": "1"}


def test_kubectl_reads_the_rendered_job_as_written(tmp_path: Path) -> None:
    """The issue's render: ``--env LR=3e-4 --env N=0o17 -- train.py --lr 3e-4``."""
    spec = JobSpec(
        script="train.py",
        args=("--lr", "3e-4", "--wd", "1e-2", "--resume", "yes", "--date", "2024-01-02"),
        job_id="run1",
        env={"LR": "3e-4", "N": "0o17", "Y": "off", "WHEN": "1:20"},
        secret_env=("HF_TOKEN",),
    )
    target = K8sTarget(image="ghcr.io/me/train:1", nodes=4, gpus_per_node=8, secret_name="s")
    objects = render_spec(spec, target)
    path = tmp_path / "x.yaml"
    path.write_text(to_yaml(objects, header="test"))
    service, job = _kubectl(path)
    assert (service["kind"], job["kind"]) == ("Service", "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["name"] == CONTAINER
    assert container["args"] == ["train.py", *spec.args]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {k: env[k] for k in spec.env} == dict(spec.env)
    assert all(isinstance(e["name"], str) for e in container["env"])
