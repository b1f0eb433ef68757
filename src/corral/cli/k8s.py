"""``corral k8s render|apply|logs|delete``: the same job as an Indexed Job on Kubernetes."""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from corral.cli.options import NO_FLAGS, JobFlags, ScriptArg, job_flags
from corral.cluster.model import Cluster
from corral.console import make_console
from corral.errors import ConfigError
from corral.job.describe import JobDescription
from corral.job.ids import new_job_id
from corral.k8s.render import (
    K8sTarget,
    k8s_spec,
    render_k8s,
    to_yaml,
)
from corral.plan.spec import JobSpec

_K = "Kubernetes"

k8s_app = typer.Typer(
    name="k8s",
    help="Run the job on Kubernetes: an Indexed Job (one pod per node) and a headless "
    "Service for the pods' stable names.",
    no_args_is_help=True,
)

ImageOpt = Annotated[
    str | None,
    typer.Option(
        "--image",
        metavar="IMAGE",
        help="Container image (with torch and the code).",
        rich_help_panel=_K,
    ),
]
NodesOpt = Annotated[
    int, typer.Option("--nodes", metavar="N", help="Pods (nodes).", rich_help_panel=_K)
]
GpusOpt = Annotated[
    int,
    typer.Option(
        "--gpus-per-node", metavar="G", help="nvidia.com/gpu per pod; 0 = CPU.", rich_help_panel=_K
    ),
]
NamespaceOpt = Annotated[
    str,
    typer.Option(
        "--namespace",
        "-n",
        metavar="NS",
        envvar="CORRAL_K8S_NAMESPACE",
        help="Kubernetes namespace.",
        rich_help_panel=_K,
    ),
]
SecretOpt = Annotated[
    str | None,
    typer.Option(
        "--k8s-secret",
        metavar="NAME",
        help="The Secret holding every secret --env key (a bare --env KEY, a "
        "--secret-env KEY, names with TOKEN, KEY, ...): pods read them from it; no "
        "secret value is ever written to the YAML.",
        rich_help_panel=_K,
    ),
]
ShmOpt = Annotated[
    str | None,
    typer.Option(
        "--shm-size",
        metavar="SIZE",
        help="Size limit of /dev/shm (an in-memory volume), e.g. 16Gi.",
        rich_help_panel=_K,
    ),
]
PvcOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--pvc",
        metavar="CLAIM:PATH",
        help="Mount a PersistentVolumeClaim in every pod (repeatable), e.g. for --checkpoint-dir.",
        rich_help_panel=_K,
    ),
]
FailCodeOpt = Annotated[
    list[int] | None,
    typer.Option(
        "--fail-exit-code",
        metavar="CODE",
        help="A container exit code that fails the Job at once, without a restart "
        "(repeatable; default 2: a usage error).",
        rich_help_panel=_K,
    ),
]
_P = "Kubernetes scheduling"


def _resource_opt(flag: str, help_text: str) -> Any:
    return typer.Option(flag, metavar="QUANTITY", help=help_text, rich_help_panel=_P)


CpuOpt = Annotated[str | None, _resource_opt("--cpu", "CPU request of each pod, e.g. 8 or 500m.")]
MemoryOpt = Annotated[
    str | None, _resource_opt("--memory", "Memory request of each pod, e.g. 64Gi.")
]
CpuLimitOpt = Annotated[
    str | None, _resource_opt("--cpu-limit", "CPU limit of each pod (default: none).")
]
MemoryLimitOpt = Annotated[
    str | None, _resource_opt("--memory-limit", "Memory limit of each pod (default: none).")
]
NodeSelectorOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--node-selector",
        metavar="LABEL=VALUE",
        help="Run only on nodes with this label (repeatable): the pods' nodeSelector.",
        rich_help_panel=_P,
    ),
]
TolerationOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--toleration",
        metavar="KEY=VALUE:EFFECT",
        help="Tolerate this taint, written as kubectl taint does (repeatable); =VALUE "
        "and :EFFECT are optional: without a value any value, without an effect every "
        "one. E.g. nvidia.com/gpu:NoSchedule.",
        rich_help_panel=_P,
    ),
]
PullSecretOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--image-pull-secret",
        metavar="NAME",
        help="A Secret with registry credentials to pull the image (repeatable).",
        rich_help_panel=_P,
    ),
]
ServiceAccountOpt = Annotated[
    str | None,
    typer.Option(
        "--service-account",
        metavar="NAME",
        help="The pods' service account (serviceAccountName).",
        rich_help_panel=_P,
    ),
]
KubeconfigOpt = Annotated[
    str | None,
    typer.Option(
        "--kubeconfig",
        metavar="FILE",
        help="Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the "
        "in-cluster service account).",
        rich_help_panel=_K,
    ),
]
ContextOpt = Annotated[
    str | None,
    typer.Option(
        "--context",
        metavar="NAME",
        help="Kubeconfig context (default: current).",
        rich_help_panel=_K,
    ),
]
JobArg = Annotated[str, typer.Argument(metavar="JOB", help="The job id (the Job's name).")]


def _env(items: list[str] | None, secret: list[str] | None) -> tuple[dict[str, str], list[str]]:
    """``--env`` items: ``K=V`` literals, and bare keys, which are read from the Secret."""
    env: dict[str, str] = {}
    keys = list(secret or [])
    for item in items or []:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
        else:
            keys.append(key)
    return env, keys


def _pvcs(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in items or []:
        claim, sep, path = item.partition(":")
        if not sep or not claim or not path:
            raise ConfigError(f"{item!r} is not CLAIM:PATH", option="--pvc")
        pairs.append((claim, path))
    return tuple(pairs)


def _selector(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{item!r} is not LABEL=VALUE", option="--node-selector")
        pairs.append((key, value))
    return tuple(pairs)


def _render(
    command: list[str] | None, image: str | None, flags: JobFlags, **kw: Any
) -> tuple[list[dict[str, Any]], JobSpec, K8sTarget]:
    """The objects of ``command`` and the options (shared by render and apply)."""
    if not command:
        raise ConfigError("no script given: corral k8s render [OPTIONS] -- SCRIPT [ARGS...]")
    if not image:
        raise ConfigError("the pods need an image: --image IMAGE", option="--image")
    env, secret_keys = _env(flags["env"], flags["secret_env"])
    # the job as every entry point describes and validates it (the schema's options)
    options = flags.options(
        command,
        launcher=flags["launcher"] or "torchrun",
        job_id=flags["job_id"] or f"corral-{new_job_id()}",
        master_port=flags["master_port"],  # 0: the render's fixed port (k8s_spec)
        env=env,
        secret_env=tuple(secret_keys),
    )
    description = JobDescription(options, Cluster((), source="kubernetes"))  # pods: its nodes
    spec = k8s_spec(description)
    codes = kw["fail_exit_code"]
    target = K8sTarget(
        image=image,
        nodes=kw["nodes"],
        gpus_per_node=kw["gpus_per_node"],
        namespace=kw["namespace"],
        secret_name=kw["k8s_secret"],
        shm_size=kw["shm_size"],
        pvcs=_pvcs(kw["pvc"]),
        fail_exit_codes=(2,) if codes is None else tuple(codes),
        dist_timeout=options.collective_timeout,
        cpu=kw["cpu"],
        memory=kw["memory"],
        cpu_limit=kw["cpu_limit"],
        memory_limit=kw["memory_limit"],
        node_selector=_selector(kw["node_selector"]),
        tolerations=tuple(kw["toleration"] or ()),
        image_pull_secrets=tuple(kw["image_pull_secret"] or ()),
        service_account=kw["service_account"],
    )
    return render_k8s(description, target), spec, target


def _header(spec: JobSpec, target: K8sTarget) -> str:
    return (
        f"corral k8s render: job {spec.job_id}, {target.nodes} pod(s), namespace "
        f"{target.namespace}\nkubectl apply -f FILE, or: corral k8s apply -f FILE"
    )


@k8s_app.command("render", context_settings={"allow_interspersed_args": False})
@job_flags("k8s")
def render(
    command: ScriptArg = None,
    image: ImageOpt = None,
    nodes: NodesOpt = 1,
    gpus_per_node: GpusOpt = 0,
    namespace: NamespaceOpt = "default",
    k8s_secret: SecretOpt = None,
    shm_size: ShmOpt = None,
    pvc: PvcOpt = None,
    fail_exit_code: FailCodeOpt = None,
    cpu: CpuOpt = None,
    memory: MemoryOpt = None,
    cpu_limit: CpuLimitOpt = None,
    memory_limit: MemoryLimitOpt = None,
    node_selector: NodeSelectorOpt = None,
    toleration: TolerationOpt = None,
    image_pull_secret: PullSecretOpt = None,
    service_account: ServiceAccountOpt = None,
    flags: JobFlags = NO_FLAGS,  # the job's flags, see job_flags
    output: Annotated[
        Path | None, typer.Option("--output", "-o", metavar="FILE", help="Write the YAML here.")
    ] = None,
) -> None:
    """Print the Kubernetes YAML of the job: a headless Service and an Indexed Job.

    Pod i is reachable as <job>-i.<job>; MASTER_ADDR is pod 0's name, NODE_RANK its
    completion index. Other pods wait for pod 0 (up to --rdzv-timeout), then torchrun
    joins the c10d rendezvous. --max-restarts N: torchrun restarts the ranks in place up
    to N times; an evicted or preempted pod is replaced without counting; when torchrun
    gives up the Job fails; other pod failures count against backoffLimit N (see
    docs/kubernetes.md).
    """
    objects, spec, target = _render(**{k: v for k, v in locals().items() if k != "output"})
    text = to_yaml(objects, header=_header(spec, target))
    if output is None:
        sys.stdout.write(text)
        return
    output.write_text(text, encoding="utf-8")
    make_console().print(f"wrote {output} (job {spec.job_id})", markup=False)


def _load(path: str) -> list[dict[str, Any]]:
    """The objects of a rendered YAML file (``-`` = stdin)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}", option="-f") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not YAML: {exc}", option="-f") from exc
    objects: list[dict[str, Any]] = []
    for doc in docs:
        items = doc.get("items") if isinstance(doc, dict) and doc.get("kind") == "List" else [doc]
        for item in items or []:
            if not isinstance(item, dict):
                raise ConfigError(f"{path}: not a Kubernetes object: {item!r:.60}", option="-f")
            objects.append(item)
    if not objects:
        raise ConfigError(f"{path} holds no object", option="-f")
    return objects


def _with_job_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` taking, after its own options, every option of :func:`render` but
    ``-o`` (typer reads the function's ``__signature__``); they arrive as ``**job``."""
    own = [
        p
        for p in inspect.signature(command, eval_str=True).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    shared = inspect.signature(render, eval_str=True).parameters
    job = [p for name, p in shared.items() if name != "output"]
    command.__signature__ = inspect.Signature([*own, *job])  # type: ignore[attr-defined]
    return command


@k8s_app.command("apply", context_settings={"allow_interspersed_args": False})
@_with_job_options
def apply(
    file: Annotated[
        str | None,
        typer.Option(
            "--filename",
            "-f",
            metavar="FILE",
            help="Create the objects of this rendered file ('-': stdin) instead.",
        ),
    ] = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    **job: Any,
) -> None:
    """Create the job on the cluster: what `corral k8s render` prints, or -f FILE."""
    from corral.k8s import client as k8s_client

    if file is not None:
        if job["command"]:
            raise ConfigError("give either -f FILE or -- SCRIPT [ARGS...], not both", option="-f")
        objects = _load(file)
    else:
        objects = _render(flags=JobFlags.take("k8s", job), **job)[0]
    api = k8s_client.connect(kubeconfig, context)
    created = k8s_client.apply(api, objects)
    name = next((o["metadata"]["name"] for o in objects if o.get("kind") == "Job"), None)
    ns = next(iter({(o.get("metadata") or {}).get("namespace") or "default" for o in objects}))
    console = make_console()
    console.print(f"created {', '.join(created)} in namespace {ns}", markup=False)
    if name:
        console.print(f"follow it: corral k8s logs {name} -f -n {ns}", style="dim", markup=False)


@k8s_app.command("logs")
def logs(
    job: JobArg,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Stream until the Job ends; exit 0 if it succeeded."),
    ] = False,
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Print every pod's log, each line prefixed [pod:rank] (rank = completion index)."""
    from corral.k8s import client as k8s_client

    api = k8s_client.connect(kubeconfig, context)
    lock = threading.Lock()
    err = make_console()

    def out(line: str) -> None:
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def note(line: str) -> None:
        with lock:
            err.print(line, style="dim", markup=False)

    if not follow:
        k8s_client.job_logs(api, namespace, job, out, note)
        return
    try:
        outcome = k8s_client.follow_job_logs(api, namespace, job, out, note)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if outcome.succeeded:
        err.print(f"job {job} succeeded", markup=False)
        return
    err.print(f"job {job} failed: {outcome.message}", style="red", markup=False)
    raise typer.Exit(1)


@k8s_app.command("delete")
def delete(
    job: JobArg,
    namespace: NamespaceOpt = "default",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Delete the Job (its pods with it) and its Service."""
    from corral.k8s import client as k8s_client

    api = k8s_client.connect(kubeconfig, context)
    gone = k8s_client.delete(api, namespace, job)
    make_console().print(f"deleted {', '.join(gone)} in namespace {namespace}", markup=False)


def register(app: typer.Typer) -> None:
    """Add the ``k8s`` verb group to the root app."""
    app.add_typer(k8s_app, name="k8s")
