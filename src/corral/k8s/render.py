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

The restart budget (``--max-restarts N``) on Kubernetes:

* torchrun in every pod runs with ``--max-restarts=N``: when a rank fails, or a pod
  is lost and replaced, the pods that are left restart all ranks in place (a new
  rendezvous round, resumed from the last checkpoint), one restart of the budget.
* A pod lost to a disruption (eviction, preemption, node drain: the
  ``DisruptionTarget`` condition) is replaced without counting.
* A pod whose ranks failed because pod 0, which hosts the rendezvous, was replaced
  exits with :data:`MASTER_LOST_EXIT` (its master's address changed): it is replaced
  without counting too, and rejoins the new pod 0.
* When torchrun gives up (its restarts are spent, or the rendezvous failed), the pod
  exits with :data:`GAVE_UP_EXIT` and the Job fails at once (``FailJob``), as it does
  on the ``--fail-exit-code`` codes: no second round of N restarts in new pods.
* Any other pod failure (the container killed, say by the OOM killer) counts against
  ``backoffLimit = N``. With the ``python`` launcher (no in-place restarts) every
  restart takes all pods down: ``backoffLimit = N x nodes``.

Secret environment values are never written: a secret ``--env`` key becomes a
``secretKeyRef`` into a Secret the user names.
"""

from __future__ import annotations

import dataclasses
import math
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import yaml

from corral import redact
from corral.contract import (
    CHECKPOINT_DIR_ENV,
    CONTRACT_VARS,
    DIST_TIMEOUT_ENV,
    JOB_ID_ENV,
    RDZV_TIMEOUT_ENV,
    SHARED_DATA_PATH_ENV,
    is_env_name,
)
from corral.defaults import DEFAULT_COLLECTIVE_TIMEOUT, DEFAULT_MASTER_PORT
from corral.errors import ConfigError
from corral.plan.spec import JobSpec

if TYPE_CHECKING:
    from corral.job.describe import JobDescription

__all__ = [
    "COMPLETION_INDEX",
    "CONTAINER",
    "GAVE_UP_EXIT",
    "JOB_LABEL",
    "K8S_LAUNCHERS",
    "MASTER_LOST_EXIT",
    "MASTER_NOT_READY_EXIT",
    "K8sTarget",
    "k8s_spec",
    "master_addr",
    "needs_quotes",
    "render_k8s",
    "render_spec",
    "secret_keys",
    "to_yaml",
    "toleration",
]

CONTAINER = "trainer"
"""The name of the training container in every pod."""
JOB_LABEL = "corral/job-id"
"""The label that ties a job's pods to its Service (and only its pods)."""
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
"""The pod annotation holding its index in an Indexed Job."""
K8S_LAUNCHERS = ("torchrun", "python")
MASTER_NOT_READY_EXIT = 3
"""Exit code of a pod whose master never became reachable."""
MASTER_LOST_EXIT = 4
"""Exit code of a pod whose ranks failed after pod 0 was replaced (not counted)."""
GAVE_UP_EXIT = 5
"""Exit code of a pod whose torchrun gave up (restarts spent): fails the Job at once."""
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
READ_TIMEOUT = 60
"""torchrun's c10d ``read_timeout`` (seconds), as ``corral run`` uses."""

_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
# a Kubernetes quantity as CPU and memory take it: 500m, 2, 1.5, 64Gi, 1e3
_RESOURCE = re.compile(r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|e[0-9]+)?$")
_SUFFIX = {
    "m": Decimal("0.001"), "k": Decimal(10) ** 3, "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18, "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}  # fmt: skip
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")

# Set by the render for every pod; --env may not override them.
_RENDERED_VARS = (
    *CONTRACT_VARS,
    RDZV_TIMEOUT_ENV,
    DIST_TIMEOUT_ENV,
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
)

# Waits for the master (pod 0) on the other pods: name resolution, then a TCP
# connection. Fed to python on stdin; contains no "$" (Kubernetes expands $(VAR)).
_WAIT_FOR_MASTER = f"""\
import os, socket, sys, time
host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
limit = float(os.environ["{RDZV_TIMEOUT_ENV}"])
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
print(socket.gethostbyname(host))  # the address the pod joined, for _MASTER_REPLACED
"""

# After the ranks of a pod other than 0 failed: exit 0 when its master is gone or
# has another address than when the pod joined (its argument: pod 0 was replaced),
# else 1.
_MASTER_REPLACED = """\
import os, socket, sys
joined = sys.argv[1]
try:
    now = socket.gethostbyname(os.environ["MASTER_ADDR"])
except OSError:
    now = None
sys.exit(0 if now != joined else 1)
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
    dist_timeout: float = DEFAULT_COLLECTIVE_TIMEOUT
    cpu: str | None = None
    """CPU request of each pod (``--cpu``, e.g. 8 or 500m)."""
    memory: str | None = None
    """Memory request of each pod (``--memory``, e.g. 64Gi)."""
    cpu_limit: str | None = None
    memory_limit: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    """(label, value) pairs a node must have (``--node-selector K=V``)."""
    tolerations: tuple[str, ...] = ()
    """``KEY[=VALUE][:EFFECT]`` taints the pods tolerate (``--toleration``)."""
    image_pull_secrets: tuple[str, ...] = ()
    service_account: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "pvcs", tuple(tuple(p) for p in self.pvcs))
        object.__setattr__(self, "fail_exit_codes", tuple(self.fail_exit_codes))
        object.__setattr__(self, "node_selector", tuple(tuple(p) for p in self.node_selector))
        object.__setattr__(self, "tolerations", tuple(self.tolerations))
        object.__setattr__(self, "image_pull_secrets", tuple(self.image_pull_secrets))


def master_addr(job_id: str) -> str:
    """The stable name of pod 0: ``<job>-0.<service>`` (the Service is named as the job)."""
    return f"{job_id}-0.{job_id}"


def secret_keys(spec: JobSpec) -> list[str]:
    """The env keys the pods read from the Secret: those named like secrets or listed
    in ``spec.secret_env`` (a bare ``--env K`` lands there), in a stable order."""
    keys = redact.secret_keys(spec.env, spec.secret_env)
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
        if code == MASTER_LOST_EXIT:
            raise ConfigError(
                f"{code} is the exit code of a pod whose master was replaced, which is "
                "replaced without counting; it cannot also fail the Job",
                option="--fail-exit-code",
            )
    _validate_volumes(target)
    _validate_env(spec, target)
    _validate_scheduling(target)


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


def _quantity(value: str, option: str) -> Decimal:
    """The amount a CPU or memory quantity stands for; ConfigError naming ``option``."""
    found = _RESOURCE.match(value)
    if found is None:
        raise ConfigError(
            f"{value!r} is not a Kubernetes quantity (e.g. 8, 500m, 64Gi)", option=option
        )
    number, suffix = found.group(1), found.group(3) or ""
    if suffix.startswith("e"):
        return Decimal(number) * Decimal(10) ** int(suffix[1:])
    return Decimal(number) * _SUFFIX.get(suffix, Decimal(1))


def _is_label_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (not _SUBDOMAIN.match(prefix) or len(prefix) > 253):
        return False
    return _LABEL_NAME.match(name) is not None


def toleration(text: str) -> dict[str, str]:
    """``KEY[=VALUE][:EFFECT]`` (as ``kubectl taint`` writes a taint) as a toleration:
    without a value it tolerates the key with any value, without an effect every effect."""
    rest, _, effect = text.rpartition(":") if ":" in text else (text, "", "")
    key, sep, value = rest.partition("=")
    if not key or not _is_label_key(key):
        raise ConfigError(
            f"{text!r}: {key!r} is not a taint key (KEY[=VALUE][:EFFECT])", option="--toleration"
        )
    if sep and value and not _LABEL_NAME.match(value):
        raise ConfigError(f"{text!r}: {value!r} is not a taint value", option="--toleration")
    if ":" in text and effect not in TAINT_EFFECTS:
        raise ConfigError(
            f"{text!r}: the effect must be one of {', '.join(TAINT_EFFECTS)}",
            option="--toleration",
        )
    out = {"key": key, "operator": "Equal" if sep else "Exists"}
    if sep:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out


def _validate_scheduling(target: K8sTarget) -> None:
    for request, limit, what in (
        (target.cpu, target.cpu_limit, "cpu"),
        (target.memory, target.memory_limit, "memory"),
    ):
        low = _quantity(request, f"--{what}") if request is not None else None
        high = _quantity(limit, f"--{what}-limit") if limit is not None else None
        if low is not None and high is not None and high < low:
            raise ConfigError(
                f"{limit} is less than the request --{what} {request}", option=f"--{what}-limit"
            )
    for key, value in target.node_selector:
        if not _is_label_key(key):
            raise ConfigError(f"{key!r} is not a label key", option="--node-selector")
        if value and not _LABEL_NAME.match(value):
            raise ConfigError(
                f"{value!r} (of {key}) is not a label value", option="--node-selector"
            )
    for text in target.tolerations:
        toleration(text)
    for name, option in [
        *((n, "--image-pull-secret") for n in target.image_pull_secrets),
        *(((target.service_account, "--service-account"),) if target.service_account else ()),
    ]:
        if not _SUBDOMAIN.match(name) or len(name) > 253:
            raise ConfigError(f"{name!r} is not a Kubernetes object name", option=option)


def _validate_env(spec: JobSpec, target: K8sTarget) -> None:
    for key in [*spec.env, *spec.secret_env]:
        if not is_env_name(key):
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
        _value(JOB_ID_ENV, spec.job_id),
        _value(RDZV_TIMEOUT_ENV, _seconds(spec.rdzv_timeout)),
        _value(DIST_TIMEOUT_ENV, _seconds(target.dist_timeout)),
    ]
    # only when asked: NCCL and gloo pick the pod's interface themselves
    if spec.nccl_interface:
        env.append(_value("NCCL_SOCKET_IFNAME", _literal(spec.nccl_interface)))
    if spec.gloo_interface:
        env.append(_value("GLOO_SOCKET_IFNAME", _literal(spec.gloo_interface)))
    if spec.checkpoint_dir:
        env.append(_value(CHECKPOINT_DIR_ENV, _literal(spec.checkpoint_dir)))
    if spec.shared_data_path:
        env.append(_value(SHARED_DATA_PATH_ENV, _literal(spec.shared_data_path)))
    return env


_RANK_WRAPPER = shlex.quote('export NODE_RANK="$GROUP_RANK"; exec "$0" "$@"')


def _entrypoint(spec: JobSpec, target: K8sTarget, nproc: int) -> str:
    """The container's ``sh -c`` script; the user's SCRIPT ARGS are its ``"$@"``."""
    python = shlex.quote(spec.python or "python3")
    if spec.launcher == "python":
        launch = f'{python} "$@"'
        failed = 'exit "$status"\n'
    else:
        launch = (
            f"{python} -m torch.distributed.run \\\n"
            f"  --nnodes={target.nodes} --nproc-per-node={nproc} \\\n"
            '  --rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}" \\\n'
            f"  --rdzv-id={spec.job_id} \\\n"
            '  --rdzv-conf="join_timeout=${CORRAL_RDZV_TIMEOUT},'
            f'read_timeout={READ_TIMEOUT},is_host=${{is_host}}" \\\n'
            f"  --max-restarts={spec.max_restarts} --no-python \\\n"
            # c10d numbers nodes as they join (not by pod index): each rank's NODE_RANK is
            # torchrun's GROUP_RANK for it, so RANK = NODE_RANK * nproc + LOCAL_RANK holds
            f'  sh -c {_RANK_WRAPPER} {python} "$@"'
        )
        failed = (
            'echo "corral: torchrun gave up (exit $status): its restarts '
            f"(--max-restarts {spec.max_restarts}) are spent or the rendezvous failed; "
            f'exiting {GAVE_UP_EXIT}, which fails the Job" >&2\n'
            f"exit {GAVE_UP_EXIT}\n"
        )
    return (
        "set -eu\n"
        "is_host=0\n"
        "joined=\n"
        'if [ "${NODE_RANK}" = 0 ]; then\n'
        "  is_host=1\n"
        "else\n"
        # backquotes: Kubernetes would take a dollar-parenthesis for one of its $(VAR)
        f"  joined=`{python} - <<'PY'\n"
        f"{_WAIT_FOR_MASTER}"
        "PY\n"
        "`\n"
        "fi\n"
        "# in the background, so that the pod's SIGTERM reaches the ranks\n"
        f"{launch} &\n"
        "child=$!\n"
        "stopping=0\n"
        "trap 'stopping=1; kill -TERM \"$child\" 2>/dev/null || true' TERM INT\n"
        "status=0\n"
        'wait "$child" || status=$?\n'
        'while kill -0 "$child" 2>/dev/null; do\n'
        "  status=0\n"
        '  wait "$child" || status=$?\n'
        "done\n"
        'if [ "$status" -eq 0 ] || [ "$stopping" = 1 ]; then\n'
        '  exit "$status"\n'
        "fi\n"
        f'if [ "${{NODE_RANK}}" != 0 ] && {python} - "$joined" <<\'PY\'\n'
        f"{_MASTER_REPLACED}"
        "PY\n"
        "then\n"
        '  echo "corral: the ranks failed (exit $status) after pod 0 was replaced: '
        f'exiting {MASTER_LOST_EXIT}, so that a new pod rejoins it" >&2\n'
        f"  exit {MASTER_LOST_EXIT}\n"
        "fi\n"
        f"{failed}"
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
    resources = _resources(target)
    if resources:
        container["resources"] = resources
    return container


def _resources(target: K8sTarget) -> dict[str, dict[str, Any]]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    for name, request, limit in (
        ("cpu", target.cpu, target.cpu_limit),
        ("memory", target.memory, target.memory_limit),
    ):
        if request is not None:
            requests[name] = request
        if limit is not None:
            limits[name] = limit
    if target.gpus_per_node:  # extended resources: the request is the limit
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = target.gpus_per_node
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


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


def _pod_spec(spec: JobSpec, target: K8sTarget, volumes: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = {"subdomain": spec.job_id, "restartPolicy": "Never"}
    if target.service_account:
        pod["serviceAccountName"] = target.service_account
    if target.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": n} for n in dict.fromkeys(target.image_pull_secrets)]
    if target.node_selector:
        pod["nodeSelector"] = dict(target.node_selector)
    if target.tolerations:
        pod["tolerations"] = [toleration(t) for t in target.tolerations]
    pod["containers"] = [_container(spec, target)]
    pod["volumes"] = volumes
    return pod


def _job(spec: JobSpec, target: K8sTarget) -> dict[str, Any]:
    fail = set(target.fail_exit_codes)
    if spec.launcher == "torchrun":
        fail.add(GAVE_UP_EXIT)
    rules: list[dict[str, Any]] = [
        # an evicted or preempted pod is replaced without using up a restart (first: the
        # exit code of a pod stopped by a disruption says nothing)
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        # so is a pod whose ranks failed because pod 0 was replaced
        {
            "action": "Ignore",
            "onExitCodes": {
                "containerName": CONTAINER,
                "operator": "In",
                "values": [MASTER_LOST_EXIT],
            },
        },
    ]
    if fail:
        rules.append(
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": sorted(fail),
                },
            }
        )
    # torchrun restarts the ranks in place; without it every restart takes all pods down
    per_restart = 1 if spec.launcher == "torchrun" else target.nodes
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": target.nodes,
        "parallelism": target.nodes,
        "backoffLimit": spec.max_restarts * per_restart,
        "podFailurePolicy": {"rules": rules},
    }
    if spec.timeout is not None:
        job_spec["activeDeadlineSeconds"] = max(1, math.ceil(spec.timeout))
    volumes = _volumes(target)[0]
    job_spec["template"] = {
        "metadata": {"labels": _labels(spec.job_id)},
        "spec": _pod_spec(spec, target, volumes),
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


def k8s_spec(description: JobDescription) -> JobSpec:
    """The JobSpec the pods run: the description's options built and validated as every
    job is (:func:`corral.job.build.job_spec`, its restart budget included: torchrun's
    own on Kubernetes). A master port of 0 (a free port picked at launch, every
    entry point's default) is, on Kubernetes, the pods' one fixed port
    (``DEFAULT_MASTER_PORT``): every pod must know it before any of them starts."""
    from corral.job.build import job_spec  # the builder: only when rendering

    options = description.options
    if options.master_port == 0:
        options = dataclasses.replace(options, master_port=DEFAULT_MASTER_PORT)
    return job_spec(options)


def render_k8s(description: JobDescription, target: K8sTarget) -> list[dict[str, Any]]:
    """The headless Service and the Indexed Job that run the job of ``description`` on
    ``target`` (its pods are the nodes: the description's cluster is not used).

    Raises :class:`~corral.errors.ConfigError` naming the option at fault.
    """
    return render_spec(k8s_spec(description), target)


def render_spec(spec: JobSpec, target: K8sTarget) -> list[dict[str, Any]]:
    """The objects of a built ``spec`` (:func:`k8s_spec`) on ``target``."""
    _validate(spec, target)
    return [_service(spec, target), _job(spec, target)]


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line strings (the entrypoint script) as literal blocks, and
    every string another YAML reader would take for something else in quotes."""


# Plain scalars that some YAML reader resolves to a non-string: YAML 1.1 (the full
# spec: y/n too, sexagesimal, timestamps), YAML 1.2's core schema (0o17, 1e-2, .inf)
# and Kubernetes' own reader (go-yaml v2: drops "_", then Go's ParseInt with base 0 and
# its float syntax). Matched case-insensitively, after removing "_"; quoting more than
# strictly needed is harmless, quoting less changes what a pod gets.
_NOT_A_STRING = re.compile(
    r"""
    | ~ | null | y | yes | n | no | true | false | on | off | = | <<   # null, bool, merge
    | [-+]? (0b[01]+ | 0o?[0-7]+ | 0x[0-9a-f]+ | [0-9]+)               # int
    | [-+]? [0-9]+ (:[0-5]?[0-9])+ (\.[0-9]*)?                         # sexagesimal
    | [-+]? ([0-9]+ (\.[0-9.]*)? | \.[0-9][0-9.]*) (e[-+]?[0-9]+)?     # float
    | [-+]? \.? (inf | infinity | nan)                                  # .inf, .nan
    | [0-9]{4}-[0-9]{1,2}-[0-9]{1,2} ([t\s].*)?                         # timestamp
    """,
    re.IGNORECASE | re.VERBOSE,
)


def needs_quotes(value: str) -> bool:
    """Whether ``value`` written plain would be read as another type than string
    by some YAML 1.1 or 1.2 reader (Kubernetes' included)."""
    return _NOT_A_STRING.fullmatch(value.replace("_", "").strip()) is not None


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else "'" if needs_quotes(value) else None
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
