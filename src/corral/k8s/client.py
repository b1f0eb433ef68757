"""Drive a rendered job on a Kubernetes cluster with the official ``kubernetes`` client.

``connect`` finds the cluster (``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``,
else the in-cluster service account); ``apply`` creates the Service and the Job
(and removes what it created when a later object is refused); ``delete`` removes
both, the Job's pods with it; ``job_logs``/``follow_job_logs`` print every pod's
log with each line prefixed ``[pod:rank]``, the rank being the pod's completion
index. Every failure is a :class:`~corral.errors.CorralError`: a missing
kubeconfig or unknown job is a ConfigError, an unreachable or refusing API server a
ConnectError, an object the cluster rejects a LaunchError.
"""

from __future__ import annotations

import codecs
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from corral.errors import ConfigError, ConnectError, CorralError, LaunchError
from corral.k8s.render import COMPLETION_INDEX, CONTAINER

__all__ = [
    "DEFAULT_KUBECONFIG",
    "JobOutcome",
    "K8sApi",
    "apply",
    "connect",
    "delete",
    "follow_job_logs",
    "job_logs",
    "log_prefix",
    "pod_rank",
    "prefixed_lines",
]

DEFAULT_KUBECONFIG = "~/.kube/config"
REQUEST_TIMEOUT = 30.0
"""Seconds any single API call (not a followed log stream) may take."""
STREAM_DRAIN = 120.0
"""Seconds the log streams of a finished Job get to deliver their last lines."""

Sink = Callable[[str], None]


@dataclass(frozen=True)
class K8sApi:
    """The API groups corral uses, on one connection to one cluster."""

    core: Any  # kubernetes.client.CoreV1Api
    batch: Any  # kubernetes.client.BatchV1Api
    server: str


@dataclass(frozen=True)
class JobOutcome:
    """How a followed Job ended: ``succeeded`` and the cluster's reason for it."""

    succeeded: bool
    message: str


def connect(
    kubeconfig: str | None = None,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> K8sApi:
    """A client for the cluster of ``kubeconfig`` (else ``$KUBECONFIG``, else
    ``~/.kube/config``); inside a pod with none of them, the pod's service account."""
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError as exc:
        raise ConfigError(
            f"the Kubernetes client is not installed ({exc}): pip install 'corral[k8s]'"
        ) from exc
    env = os.environ if environ is None else environ
    path = kubeconfig or env.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    files = [os.path.expanduser(p) for p in path.split(os.pathsep) if p]
    found = [f for f in files if os.path.isfile(f)]
    in_cluster = kubeconfig is None and not env.get("KUBECONFIG") and not found
    configuration = client.Configuration()
    try:
        if in_cluster and env.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        elif not found:
            raise ConfigError(
                f"no kubeconfig at {path}; set KUBECONFIG or pass --kubeconfig FILE",
                option="--kubeconfig",
            )
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=os.pathsep.join(found),
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
    except (ConfigException, ValueError, KeyError, TypeError, OSError) as exc:
        where = "the in-cluster service account" if in_cluster else f"kubeconfig {path}"
        raise ConfigError(f"{where}: {exc}", option="--kubeconfig") from exc
    api_client = client.ApiClient(configuration)
    return K8sApi(client.CoreV1Api(api_client), client.BatchV1Api(api_client), configuration.host)


def _status_message(exc: Any) -> str:
    """The ``message`` of the API server's Status body, else its HTTP reason."""
    body = getattr(exc, "body", None)
    try:
        message = json.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        message = None
    return str(message or getattr(exc, "reason", None) or exc)


@contextmanager
def _api_errors(api: K8sApi, what: str) -> Iterator[None]:
    """Turn the client's exceptions during ``what`` into CorralErrors (a 404 passes
    through as :class:`_Missing` for the caller to word)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except ApiException as exc:
        status = exc.status
        message = _status_message(exc)
        if status == 404:
            raise _Missing(message) from exc
        if status in (401, 403):
            raise ConnectError(
                f"the API server refused to {what}", host=api.server, cause=f"{status}: {message}"
            ) from exc
        if status == 409:
            raise LaunchError(f"cannot {what}: {message} (corral k8s delete JOB first)") from exc
        raise LaunchError(f"cannot {what}: {status} {message}") from exc
    except HTTPError as exc:
        reason = getattr(exc, "reason", None) or exc
        raise ConnectError(
            "cannot reach the Kubernetes API server", host=api.server, cause=str(reason)
        ) from exc
    except ValueError as exc:  # an answer the client's models cannot read
        raise LaunchError(f"cannot {what}: unexpected answer from {api.server}: {exc}") from exc


class _Missing(CorralError):
    """A 404 from the API server (worded by the caller)."""


def _name(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return str(obj.get("kind")), str(meta.get("name")), str(meta.get("namespace") or "default")


def _discard(response: Any) -> None:
    """Read and release a raw response whose object corral does not need."""
    response.read()
    response.release_conn()


def _create(api: K8sApi, obj: Mapping[str, Any]) -> None:
    kind, name, namespace = _name(obj)
    create = (
        api.core.create_namespaced_service if kind == "Service" else api.batch.create_namespaced_job
    )
    with _api_errors(api, f"create {kind.lower()} {name} in namespace {namespace}"):
        _discard(
            create(
                namespace, body=dict(obj), _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        )


def _remove(api: K8sApi, kind: str, name: str, namespace: str) -> bool:
    """Delete one object (a Job with its pods); False when it was not there."""
    try:
        with _api_errors(api, f"delete {kind.lower()} {name} in namespace {namespace}"):
            if kind == "Service":
                response = api.core.delete_namespaced_service(
                    name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
                )
            else:
                response = api.batch.delete_namespaced_job(
                    name,
                    namespace,
                    propagation_policy="Background",  # the API's default orphans the pods
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT,
                )
            _discard(response)
    except _Missing:
        return False
    return True


def apply(api: K8sApi, objects: Sequence[Mapping[str, Any]]) -> list[str]:
    """Create ``objects`` (Services and Jobs, in order); ``kind/name`` of each.

    When one is refused, the ones created before it are deleted again.
    """
    for obj in objects:
        if obj.get("kind") not in ("Service", "Job"):
            raise ConfigError(
                f"corral k8s apply creates the Service and Job of corral k8s render, not a "
                f"{obj.get('kind')!r}: use kubectl apply for other objects",
                option="-f",
            )
    created: list[tuple[str, str, str]] = []
    try:
        for obj in objects:
            _create(api, obj)
            created.append(_name(obj))
    except _Missing as exc:
        kind, name, namespace = _name(objects[len(created)])
        _undo(api, created)
        raise ConfigError(
            f"cannot create {kind.lower()} {name} in namespace {namespace}: {exc}",
            option="--namespace",
        ) from exc
    except CorralError:
        _undo(api, created)
        raise
    return [f"{kind.lower()}/{name}" for kind, name, _ in created]


def _undo(api: K8sApi, created: Iterable[tuple[str, str, str]]) -> None:
    for kind, name, namespace in reversed(list(created)):
        with suppress(CorralError):  # the first error is the one to report
            _remove(api, kind, name, namespace)


def delete(api: K8sApi, namespace: str, job: str) -> list[str]:
    """Delete the Job ``job`` (its pods too) and its Service; what was deleted."""
    gone = [
        f"{kind.lower()}/{job}" for kind in ("Job", "Service") if _remove(api, kind, job, namespace)
    ]
    if not gone:
        raise ConfigError(f"no job {job} in namespace {namespace}", option="JOB")
    return gone


def pod_rank(pod: Any) -> str:
    """The pod's completion index (its node rank) as text, ``?`` when it has none."""
    meta = pod.metadata
    for source in (meta.annotations, meta.labels):
        if source and COMPLETION_INDEX in source:
            return str(source[COMPLETION_INDEX])
    return "?"


def log_prefix(pod: Any) -> str:
    """``[pod:rank]``: what every line of the pod's log is prefixed with."""
    return f"[{pod.metadata.name}:{pod_rank(pod)}]"


def prefixed_lines(pod: Any, text: str) -> list[str]:
    """Each line of ``text`` (the pod's log) prefixed with :func:`log_prefix`."""
    prefix = log_prefix(pod)
    return [f"{prefix} {line}" for line in text.splitlines()]


def _order(pod: Any) -> tuple[int, str, str]:
    rank = pod_rank(pod)
    created = pod.metadata.creation_timestamp
    return (int(rank) if rank.isdigit() else 1 << 30, str(created or ""), pod.metadata.name)


def _container(pod: Any) -> str | None:
    names = [c.name for c in (pod.spec.containers if pod.spec else [])]
    if CONTAINER in names or not names:
        return CONTAINER
    return names[0] if len(names) > 1 else None


def _read_job(api: K8sApi, namespace: str, job: str) -> Any:
    try:
        with _api_errors(api, f"read job {job} in namespace {namespace}"):
            return api.batch.read_namespaced_job(job, namespace, _request_timeout=REQUEST_TIMEOUT)
    except _Missing as exc:
        raise ConfigError(f"no job {job} in namespace {namespace}", option="JOB") from exc


def _pods(api: K8sApi, namespace: str, job: Any) -> list[Any]:
    """The pods of ``job`` (by its own selector, so only its pods), in rank order."""
    labels = (job.spec.selector.match_labels if job.spec and job.spec.selector else None) or {
        "job-name": job.metadata.name
    }
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    with _api_errors(api, f"list the pods of job {job.metadata.name}"):
        listed = api.core.list_namespaced_pod(
            namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT
        )
    return sorted(listed.items or [], key=_order)


def _started(pod: Any) -> bool:
    return (pod.status.phase if pod.status else None) in ("Running", "Succeeded", "Failed")


def job_logs(api: K8sApi, namespace: str, job: str, out: Sink, note: Sink) -> None:
    """Every started pod's log so far, prefixed, pods in rank order; ``note`` names
    the pods that have no log yet."""
    pods = _pods(api, namespace, _read_job(api, namespace, job))
    if not pods:
        note(f"job {job} has no pods (yet)")
    for pod in pods:
        if not _started(pod):
            note(f"{log_prefix(pod)} not started ({pod.status.phase if pod.status else 'unknown'})")
            continue
        try:
            with _api_errors(api, f"read the log of pod {pod.metadata.name}"):
                text = api.core.read_namespaced_pod_log(
                    pod.metadata.name,
                    namespace,
                    container=_container(pod),
                    _request_timeout=REQUEST_TIMEOUT,
                )
        except _Missing:
            note(f"{log_prefix(pod)} is gone")
            continue
        for line in prefixed_lines(pod, text or ""):
            out(line)


def _outcome(job: Any) -> JobOutcome | None:
    for condition in (job.status.conditions if job.status else None) or []:
        if condition.status == "True" and condition.type in ("Complete", "Failed"):
            why = ": ".join(p for p in (condition.reason, condition.message) if p)
            return JobOutcome(condition.type == "Complete", why or condition.type)
    return None


def _stream(api: K8sApi, namespace: str, pod: Any, out: Sink, note: Sink) -> None:
    """Follow one pod's log to its end, line by line (run in its own thread)."""
    prefix = log_prefix(pod)
    try:
        with _api_errors(api, f"follow the log of pod {pod.metadata.name}"):
            response = api.core.read_namespaced_pod_log(
                pod.metadata.name,
                namespace,
                container=_container(pod),
                follow=True,
                _preload_content=False,
                # no timeout: a rank may be quiet for hours; the Job's end closes the stream
            )
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            pending = ""
            for chunk in response.stream(4096):
                pending += decoder.decode(chunk)
                *lines, pending = pending.split("\n")
                for line in lines:
                    out(f"{prefix} {line}")
            pending += decoder.decode(b"", final=True)
            if pending:
                out(f"{prefix} {pending}")
    except CorralError as exc:
        note(f"{prefix} log stream ended: {exc}")


def follow_job_logs(
    api: K8sApi, namespace: str, job: str, out: Sink, note: Sink, poll: float = 2.0
) -> JobOutcome:
    """Follow every pod of ``job`` (new ones too: replacements after a failure) until
    the Job has finished and every stream has ended; how the Job ended."""
    streams: dict[str, threading.Thread] = {}

    def start_new(job_object: Any) -> None:
        for pod in _pods(api, namespace, job_object):
            if pod.metadata.name not in streams and _started(pod):
                thread = threading.Thread(
                    target=_stream, args=(api, namespace, pod, out, note), daemon=True
                )
                streams[pod.metadata.name] = thread
                thread.start()

    while True:
        job_object = _read_job(api, namespace, job)
        start_new(job_object)
        outcome = _outcome(job_object)
        if outcome is not None:
            deadline = time.monotonic() + STREAM_DRAIN
            for thread in streams.values():
                thread.join(max(0.0, deadline - time.monotonic()))
            return outcome
        time.sleep(poll)
