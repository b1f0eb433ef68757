"""Render a corral job as a Kubernetes Indexed Job plus a headless Service (pure, no I/O).

One pod per node. The Service selects only this job's pods (``corral/job-id``)
and publishes their addresses before they are ready, so pod ``i`` is reachable as
``<job>-<i>.<job>`` (the Job's pods get ``subdomain: <job>``) as soon as it runs.
Every pod gets ``MASTER_ADDR=<job>-0.<job>``, ``NODE_RANK`` from its completion
index (downward API), and runs torchrun with c10d rendezvous and explicit
timeouts (or, with the ``python`` launcher, the script itself, one rank per pod).
Pods other than 0 first wait, up to the rendezvous timeout, until pod 0's name
resolves and its port accepts connections, and exit with
:data:`MASTER_NOT_READY_EXIT` and a message naming what failed when it does not.

Secret environment values are never written: a secret ``--env`` key becomes a
``secretKeyRef`` into a Secret the user names.
"""

from __future__ import annotations

import math
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from corral.errors import ConfigError
from corral.plan.render import CONTRACT_VARS
from corral.plan.spec import JobSpec
from corral.redact import is_secret

__all__ = [
    "COMPLETION_INDEX",
    "CONTAINER",
    "DEFAULT_DIST_TIMEOUT",
    "DEFAULT_INTERFACE",
    "JOB_LABEL",
    "K8S_LAUNCHERS",
    "MASTER_NOT_READY_EXIT",
    "K8sTarget",
    "master_addr",
    "render_k8s",
    "secret_keys",
    "to_yaml",
]

CONTAINER = "trainer"
"""The name of the training container in every pod."""
JOB_LABEL = "corral/job-id"
"""The label that ties a job's pods to its Service (and only its pods)."""
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
"""The pod annotation holding its index in an Indexed Job."""
K8S_LAUNCHERS = ("torchrun", "python")
DEFAULT_INTERFACE = "eth0"
"""The pod network's interface, used for NCCL/GLOO unless told otherwise."""
DEFAULT_DIST_TIMEOUT = 1800.0
"""Seconds for process-group init and each collective (``CORRAL_DIST_TIMEOUT``)."""
MASTER_NOT_READY_EXIT = 3
"""Exit code of a pod whose master never became reachable."""
READ_TIMEOUT = 60
"""torchrun's c10d ``read_timeout`` (seconds), as ``corral run`` uses."""

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Set by the render for every pod; --env may not override them.
_RENDERED_VARS = (
    *CONTRACT_VARS,
    "CORRAL_RDZV_TIMEOUT",
    "CORRAL_DIST_TIMEOUT",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
)

# Waits for the master (pod 0) on the other pods: name resolution, then a TCP
# connection. Fed to python on stdin; contains no "$" (Kubernetes expands $(VAR)).
_WAIT_FOR_MASTER = f"""\
import os, socket, sys, time
host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
limit = float(os.environ["CORRAL_RDZV_TIMEOUT"])
end = time.monotonic() + limit
print(f"corral: waiting up to {{limit:g}}s for {{host}}:{{port}}", file=sys.stderr, flush=True)
while True:
    try:
        socket.create_connection((host, port), timeout=5).close()
        break
    except socket.gaierror as exc:
        why = f"{{host}} does not resolve ({{exc}}): is the headless Service there?"
    except OSError as exc:
        why = f"{{host}}:{{port}} refuses connections ({{exc}}): has pod 0 started?"
    if time.monotonic() >= end:
        print(f"corral: master not ready after {{limit:g}}s: {{why}}", file=sys.stderr, flush=True)
        sys.exit({MASTER_NOT_READY_EXIT})
    time.sleep(2)
print(f"corral: master {{host}}:{{port}} is ready", file=sys.stderr, flush=True)
"""


@dataclass(frozen=True)
class K8sTarget:
    """Where and how the job runs on Kubernetes (what a JobSpec does not say)."""

    image: str
    nodes: int
    gpus_per_node: int = 0
    namespace: str = "default"
    secret_name: str | None = None
    """The Secret that holds every secret ``--env`` key (``--k8s-secret``)."""
    shm_size: str | None = None
    """``sizeLimit`` of the in-memory ``/dev/shm`` volume (None: no limit)."""
    pvcs: tuple[tuple[str, str], ...] = ()
    """(claim, mount path) pairs mounted in every pod (``--pvc CLAIM:PATH``)."""
    fail_exit_codes: tuple[int, ...] = (2,)
    """Container exit codes that fail the whole Job at once, without a retry."""
    dist_timeout: float = DEFAULT_DIST_TIMEOUT

    def __post_init__(self) -> None:
        object.__setattr__(self, "pvcs", tuple(tuple(p) for p in self.pvcs))
        object.__setattr__(self, "fail_exit_codes", tuple(self.fail_exit_codes))


def master_addr(job_id: str) -> str:
    """The stable name of pod 0: ``<job>-0.<service>`` (the Service is named as the job)."""
    return f"{job_id}-0.{job_id}"


def secret_keys(spec: JobSpec) -> list[str]:
    """The env keys the pods read from the Secret: those named like secrets or listed
    in ``spec.secret_env`` (a bare ``--env K`` lands there), in a stable order."""
    keys = [k for k in spec.env if is_secret(k, spec.secret_env)]
    keys += [k for k in spec.secret_env if k not in spec.env]
    return list(dict.fromkeys(keys))


def _nproc(spec: JobSpec, target: K8sTarget) -> int:
    if spec.nproc_per_node is not None:
        return spec.nproc_per_node
    return target.gpus_per_node or 1


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _literal(value: str) -> str:
    """``value`` as Kubernetes passes it on: ``$`` doubled, so that no ``$(VAR)`` in
    an argument or env value is expanded."""
    return value.replace("$", "$$")


def _validate(spec: JobSpec, target: K8sTarget) -> None:
    name = spec.job_id
    if not target.image or any(c.isspace() for c in target.image):
        raise ConfigError(f"{target.image!r} is not an image reference", option="--image")
    if target.nodes < 1:
        raise ConfigError(f"must be at least 1 (got {target.nodes})", option="--nodes")
    if target.gpus_per_node < 0:
        raise ConfigError(
            f"must be 0 (CPU) or more (got {target.gpus_per_node})", option="--gpus-per-node"
        )
    longest = len(name) + 1 + len(str(target.nodes - 1))
    if not _DNS_1035.match(name) or longest > 63:
        raise ConfigError(
            f"{name!r} cannot name a Kubernetes Job, its Service and its pods' host names: "
            "use lower-case letters, digits and '-', starting with a letter, at most "
            f"{63 - longest + len(name)} characters",
            option="--job-id",
        )
    if not _DNS_1123.match(target.namespace) or len(target.namespace) > 63:
        raise ConfigError(f"{target.namespace!r} is not a namespace name", option="--namespace")
    if spec.launcher not in K8S_LAUNCHERS:
        raise ConfigError(
            f"launcher {spec.launcher!r} is not available on Kubernetes; choose one of "
            f"{', '.join(K8S_LAUNCHERS)}",
            option="--launcher",
        )
    nproc = _nproc(spec, target)
    if nproc < 1:
        raise ConfigError(f"must be at least 1 (got {nproc})", option="--nproc-per-node")
    if spec.launcher == "python" and nproc != 1:
        raise ConfigError(
            f"the python launcher runs one rank per pod, not {nproc}: use --launcher "
            "torchrun for several ranks per pod",
            option="--nproc-per-node",
        )
    if not 1 <= spec.master_port <= 65535:
        raise ConfigError(
            f"{spec.master_port} is not a TCP port (every pod uses the same fixed port)",
            option="--master-port",
        )
    for option, seconds in (
        ("--rdzv-timeout", spec.rdzv_timeout),
        ("--dist-timeout", target.dist_timeout),
    ):
        if not seconds > 0:
            raise ConfigError(f"must be positive (got {seconds:g})", option=option)
    if spec.timeout is not None and not spec.timeout > 0:
        raise ConfigError(f"must be positive (got {spec.timeout:g})", option="--timeout")
    if spec.max_restarts < 0:
        raise ConfigError(f"must be 0 or more (got {spec.max_restarts})", option="--max-restarts")
    python = spec.python or "python3"
    if "$" in python or not python.strip():
        raise ConfigError(f"{python!r} cannot name the image's interpreter", option="--python")
    if target.shm_size is not None and not _QUANTITY.match(target.shm_size):
        raise ConfigError(
            f"{target.shm_size!r} is not a Kubernetes quantity (e.g. 16Gi, 512Mi)",
            option="--shm-size",
        )
    for code in target.fail_exit_codes:
        if not 1 <= code <= 255:
            raise ConfigError(
                f"{code} is not a failing exit code (1-255)", option="--fail-exit-code"
            )
    _validate_volumes(target)
    _validate_env(spec, target)


def _validate_volumes(target: K8sTarget) -> None:
    paths = {"/dev/shm"}
    for claim, path in target.pvcs:
        if not _SUBDOMAIN.match(claim) or len(claim) > 253:
            raise ConfigError(f"{claim!r} is not a PersistentVolumeClaim name", option="--pvc")
        if not posixpath.isabs(path):
            raise ConfigError(f"mount path {path!r} must be absolute", option="--pvc")
        if posixpath.normpath(path) in paths:
            raise ConfigError(f"{path} is mounted twice", option="--pvc")
        paths.add(posixpath.normpath(path))


def _validate_env(spec: JobSpec, target: K8sTarget) -> None:
    for key in [*spec.env, *spec.secret_env]:
        if not _ENV_NAME.match(key):
            raise ConfigError(f"{key!r} is not a valid environment variable name", option="--env")
        if key in _RENDERED_VARS:
            raise ConfigError(
                f"{key} is set by corral for every pod and cannot be overridden", option="--env"
            )
    keys = secret_keys(spec)
    for key in keys:
        if key in spec.env:
            raise ConfigError(
                f"{key} is secret: its value would be written into the YAML. Put it in a "
                f"Kubernetes Secret and pass --env {key} --k8s-secret NAME",
                option="--env",
            )
    if keys and target.secret_name is None:
        raise ConfigError(
            f"{', '.join(keys)}: secret values are read from a Kubernetes Secret; name it with "
            "--k8s-secret NAME (kubectl create secret generic NAME --from-env-file=FILE)",
            option="--k8s-secret",
        )
    if target.secret_name is not None:
        if not keys:
            raise ConfigError(
                "no secret --env key to read from it: give the keys with --env KEY",
                option="--k8s-secret",
            )
        if not _SUBDOMAIN.match(target.secret_name) or len(target.secret_name) > 253:
            raise ConfigError(f"{target.secret_name!r} is not a Secret name", option="--k8s-secret")


def _labels(job_id: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "corral",
        "app.kubernetes.io/managed-by": "corral",
        JOB_LABEL: job_id,
    }


def _value(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _index_ref(name: str) -> dict[str, Any]:
    path = f"metadata.annotations['{COMPLETION_INDEX}']"
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _env(spec: JobSpec, target: K8sTarget, nproc: int) -> list[dict[str, Any]]:
    secrets = secret_keys(spec)
    env = [_value(k, _literal(v)) for k, v in spec.env.items() if k not in secrets]
    env += [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": target.secret_name, "key": k}}}
        for k in secrets
    ]
    env += [
        _index_ref("NODE_RANK"),
        _value("NNODES", str(target.nodes)),
        _value("WORLD_SIZE", str(target.nodes * nproc)),
    ]
    if spec.launcher == "python":
        env += [_index_ref("RANK"), _value("LOCAL_RANK", "0"), _value("LOCAL_WORLD_SIZE", "1")]
    env += [
        _value("MASTER_ADDR", master_addr(spec.job_id)),
        _value("MASTER_PORT", str(spec.master_port)),
        _value("CORRAL_JOB_ID", spec.job_id),
        _value("CORRAL_RDZV_TIMEOUT", _seconds(spec.rdzv_timeout)),
        _value("CORRAL_DIST_TIMEOUT", _seconds(target.dist_timeout)),
        _value("NCCL_SOCKET_IFNAME", spec.nccl_interface or DEFAULT_INTERFACE),
        _value("GLOO_SOCKET_IFNAME", spec.gloo_interface or DEFAULT_INTERFACE),
    ]
    if spec.checkpoint_dir:
        env.append(_value("CORRAL_CHECKPOINT_DIR", _literal(spec.checkpoint_dir)))
    if spec.shared_data_path:
        env.append(_value("CORRAL_SHARED_DATA_PATH", _literal(spec.shared_data_path)))
    return env


_RANK_WRAPPER = shlex.quote('export NODE_RANK="$GROUP_RANK"; exec "$0" "$@"')


def _entrypoint(spec: JobSpec, target: K8sTarget, nproc: int) -> str:
    """The container's ``sh -c`` script; the user's SCRIPT ARGS are its ``"$@"``."""
    python = shlex.quote(spec.python or "python3")
    if spec.launcher == "python":
        launch = f'exec {python} "$@"\n'
    else:
        launch = (
            f"exec {python} -m torch.distributed.run \\\n"
            f"  --nnodes={target.nodes} --nproc-per-node={nproc} \\\n"
            '  --rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}" \\\n'
            f"  --rdzv-id={spec.job_id} \\\n"
            '  --rdzv-conf="join_timeout=${CORRAL_RDZV_TIMEOUT},'
            f'read_timeout={READ_TIMEOUT},is_host=${{is_host}}" \\\n'
            f"  --max-restarts={spec.max_restarts} --no-python \\\n"
            # c10d numbers nodes as they join (not by pod index): each rank's NODE_RANK is
            # torchrun's GROUP_RANK for it, so RANK = NODE_RANK * nproc + LOCAL_RANK holds
            f'  sh -c {_RANK_WRAPPER} {python} "$@"\n'
        )
    return (
        "set -eu\n"
        "is_host=0\n"
        'if [ "${NODE_RANK}" = 0 ]; then\n'
        "  is_host=1\n"
        "else\n"
        f"  {python} - <<'PY'\n"
        f"{_WAIT_FOR_MASTER}"
        "PY\n"
        "fi\n"
        f"{launch}"
    )


def _volumes(target: K8sTarget) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    shm: dict[str, Any] = {"medium": "Memory"}
    if target.shm_size is not None:
        shm["sizeLimit"] = target.shm_size
    volumes: list[dict[str, Any]] = [{"name": "shm", "emptyDir": shm}]
    mounts: list[dict[str, Any]] = [{"name": "shm", "mountPath": "/dev/shm"}]
    for number, (claim, path) in enumerate(target.pvcs):
        volumes.append({"name": f"pvc-{number}", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": f"pvc-{number}", "mountPath": path})
    return volumes, mounts


def _container(spec: JobSpec, target: K8sTarget) -> dict[str, Any]:
    nproc = _nproc(spec, target)
    volumes_mounts = _volumes(target)[1]
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": target.image,
        "command": ["/bin/sh", "-c", _entrypoint(spec, target, nproc), "corral"],
        "args": [_literal(a) for a in (spec.script, *spec.args)],
        "env": _env(spec, target, nproc),
        "ports": [{"name": "rdzv", "containerPort": spec.master_port, "protocol": "TCP"}],
        "volumeMounts": volumes_mounts,
    }
    if spec.workdir:
        container["workingDir"] = spec.workdir
    if target.gpus_per_node:
        gpus = {"nvidia.com/gpu": target.gpus_per_node}
        container["resources"] = {"requests": dict(gpus), "limits": dict(gpus)}
    return container


def _service(spec: JobSpec, target: K8sTarget) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": spec.job_id,
            "namespace": target.namespace,
            "labels": _labels(spec.job_id),
        },
        "spec": {
            "clusterIP": "None",
            # pods' DNS records exist before they are ready: the others wait on pod 0's
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: spec.job_id},
            "ports": [
                {
                    "name": "rdzv",
                    "port": spec.master_port,
                    "targetPort": spec.master_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def _job(spec: JobSpec, target: K8sTarget) -> dict[str, Any]:
    rules: list[dict[str, Any]] = [
        # an evicted or preempted pod is replaced without using up a restart
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]
    if target.fail_exit_codes:
        rules.insert(
            0,
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": sorted(set(target.fail_exit_codes)),
                },
            },
        )
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": target.nodes,
        "parallelism": target.nodes,
        # every restart can take all pods down: N restarts of the job are N x nodes pods
        "backoffLimit": spec.max_restarts * target.nodes,
        "podFailurePolicy": {"rules": rules},
    }
    if spec.timeout is not None:
        job_spec["activeDeadlineSeconds"] = max(1, math.ceil(spec.timeout))
    volumes = _volumes(target)[0]
    job_spec["template"] = {
        "metadata": {"labels": _labels(spec.job_id)},
        "spec": {
            "subdomain": spec.job_id,
            "restartPolicy": "Never",
            "containers": [_container(spec, target)],
            "volumes": volumes,
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": spec.job_id,
            "namespace": target.namespace,
            "labels": _labels(spec.job_id),
        },
        "spec": job_spec,
    }


def render_k8s(spec: JobSpec, target: K8sTarget) -> list[dict[str, Any]]:
    """The headless Service and the Indexed Job that run ``spec`` on ``target``.

    Raises :class:`~corral.errors.ConfigError` naming the option at fault.
    """
    _validate(spec, target)
    return [_service(spec, target), _job(spec, target)]


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line strings (the entrypoint script) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: Sequence[Mapping[str, Any]], *, header: str | None = None) -> str:
    """``objects`` as one multi-document YAML stream (``kubectl apply -f`` reads it)."""
    docs = [
        yaml.dump(dict(o), Dumper=_Dumper, sort_keys=False, default_flow_style=False)
        for o in objects
    ]
    text = "---\n".join(docs)
    if header:
        text = "".join(f"# {line}\n" for line in header.splitlines()) + "---\n" + text
    return text
