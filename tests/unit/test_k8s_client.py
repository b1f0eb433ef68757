"""``corral k8s apply|logs|delete`` with the real ``kubernetes`` client, over real HTTP,
against a small in-process fake of the API server's endpoints they use (there is no
Kubernetes cluster on this machine). The fake records every request, so the tests
see what the client really sent: the rendered objects, the bearer token from the
kubeconfig, the propagation policy that takes the pods with the Job."""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from corral.cli import main as cli_main
from corral.cli.main import _register
from corral.k8s.render import COMPLETION_INDEX, K8sTarget, render_spec, to_yaml
from corral.plan.spec import JobSpec
from tests.conftest import require

_register()
TOKEN = "t0k3n-for-the-fake"
_OBJECT = re.compile(
    r"^/(api/v1|apis/batch/v1)/namespaces/([^/]+)/(services|jobs|pods)(?:/([^/]+))?(/log)?$"
)


@dataclass
class FakeApiServer:
    """The few API server endpoints corral uses, with their status codes and bodies."""

    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, list[str]], Any]] = field(default_factory=list)
    forbidden: bool = False
    url: str = ""

    def add_pod(
        self, job: str, index: int | None, phase: str, log: str, ns: str = "default"
    ) -> str:
        name = f"{job}-{index}-{len(self.objects):05d}"
        uid = self.objects[("jobs", ns, job)]["spec"]["selector"]["matchLabels"]
        marks = {COMPLETION_INDEX: str(index)} if index is not None else {}
        self.objects[("pods", ns, name)] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": dict(uid), "annotations": marks},
            "spec": {"containers": [{"name": "trainer", "image": "img"}]},
            "status": {"phase": phase},
        }
        self.logs[name] = log
        return name

    def finish(self, job: str, kind: str, reason: str, message: str, ns: str = "default") -> None:
        condition = {"type": kind, "status": "True", "reason": reason, "message": message}
        self.objects[("jobs", ns, job)]["status"] = {"conditions": [condition]}

    def handle(self, method: str, target: str, body: Any, auth: str | None) -> tuple[int, Any]:
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        self.requests.append((method, parts.path, query, body))
        if auth != f"Bearer {TOKEN}" or self.forbidden:
            return 403, _status(403, "Forbidden", 'jobs.batch is forbidden: User "x" cannot')
        match = _OBJECT.match(parts.path)
        if match is None:
            return 404, _status(404, "NotFound", f"no route {parts.path}")
        _, ns, plural, name, log = match.groups()
        key = (plural, ns, name or "")
        if method == "POST" and name is None:
            name = body["metadata"]["name"]
            key = (plural, ns, name)
            if key in self.objects:
                return 409, _status(409, "AlreadyExists", f'{plural} "{name}" already exists')
            stored = json.loads(json.dumps(body))
            if plural == "jobs":
                uid = {"batch.kubernetes.io/controller-uid": f"uid-{name}"}
                stored["spec"]["selector"] = {"matchLabels": uid}
                stored["status"] = {}
            self.objects[key] = stored
            return 201, stored
        if method == "GET" and plural == "pods" and name is None:
            wanted = dict(p.split("=", 1) for p in query["labelSelector"][0].split(","))
            items = [
                o
                for (kind, space, _), o in self.objects.items()
                if kind == "pods"
                and space == ns
                and all(o["metadata"]["labels"].get(k) == v for k, v in wanted.items())
            ]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
        if key not in self.objects:
            return 404, _status(404, "NotFound", f'{plural} "{name}" not found')
        if log:
            return 200, self.logs[name or ""]
        if method == "DELETE":  # a Service answers with itself, a Job with a Status
            gone = self.objects.pop(key)
            return 200, gone if plural == "services" else _status(200, "Success", "")
        return 200, self.objects[key]


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure" if code >= 400 else "Success",
            "message": message, "reason": reason, "code": code}  # fmt: skip


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    require("kubernetes.client", "the kubernetes client (corral[k8s])")
    fake = FakeApiServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            code, reply = fake.handle(
                self.command, self.path, body, self.headers.get("Authorization")
            )
            data = (reply if isinstance(reply, str) else json.dumps(reply)).encode()
            self.send_response(code)
            kind = "text/plain" if isinstance(reply, str) else "application/json"
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "me", "user": {"token": TOKEN}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
                "current-context": "fake",
            }
        )
    )
    return path


@pytest.fixture
def kubeconfig(api_server: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = _kubeconfig(tmp_path / "kubeconfig", api_server.url)
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path


def _main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    monkeypatch.setattr(sys, "argv", ["corral", "k8s", *args])
    with pytest.raises(SystemExit) as exited:
        cli_main.main()
    return int(exited.value.code or 0)


RENDER = [
    "--image",
    "img:1",
    "--nodes",
    "2",
    "--job-id",
    "train-1",
    "--",
    "train.py",
    "--lr",
    "0.1",
]


def _objects() -> list[dict[str, Any]]:
    spec = JobSpec(script="train.py", args=("--lr", "0.1"), job_id="train-1")
    return render_spec(spec, K8sTarget(image="img:1", nodes=2))


def _created(fake: FakeApiServer) -> list[tuple[str, Any]]:
    return [(path, body) for method, path, _, body in fake.requests if method == "POST"]


def test_apply_creates_the_service_then_the_job(
    api_server: FakeApiServer,
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _main(monkeypatch, "apply", *RENDER) == 0
    assert _created(api_server) == [
        ("/api/v1/namespaces/default/services", _objects()[0]),
        ("/apis/batch/v1/namespaces/default/jobs", _objects()[1]),
    ]
    err = capsys.readouterr().err
    assert "created service/train-1, job/train-1 in namespace default" in err
    assert "corral k8s logs train-1 -f -n default" in err


def test_apply_a_rendered_file(
    api_server: FakeApiServer,
    kubeconfig: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered = tmp_path / "job.yaml"
    rendered.write_text(to_yaml(_objects(), header="rendered"))
    assert _main(monkeypatch, "apply", "-f", str(rendered)) == 0
    assert [body for _, body in _created(api_server)] == _objects()


def test_apply_over_an_existing_job_fails_and_leaves_nothing_new(
    api_server: FakeApiServer,
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api_server.objects[("jobs", "default", "train-1")] = _objects()[1]
    assert _main(monkeypatch, "apply", *RENDER) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        'error: cannot create job train-1 in namespace default: jobs "train-1" already exists '
        "(corral k8s delete JOB first)"
    ), err
    assert ("services", "default", "train-1") not in api_server.objects  # rolled back
    assert ("DELETE", "/api/v1/namespaces/default/services/train-1") in [
        (m, p) for m, p, _, _ in api_server.requests
    ]


def test_delete_takes_the_pods_with_the_job(
    api_server: FakeApiServer,
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _main(monkeypatch, "apply", *RENDER) == 0
    assert _main(monkeypatch, "delete", "train-1") == 0
    deletes = [(p, q) for m, p, q, _ in api_server.requests if m == "DELETE"]
    assert deletes == [
        ("/apis/batch/v1/namespaces/default/jobs/train-1", {"propagationPolicy": ["Background"]}),
        ("/api/v1/namespaces/default/services/train-1", {}),
    ]
    assert "deleted job/train-1, service/train-1 in namespace default" in capsys.readouterr().err
    assert _main(monkeypatch, "delete", "train-1") == 2
    assert capsys.readouterr().err.strip() == "error: JOB: no job train-1 in namespace default"


def _running_job(fake: FakeApiServer) -> tuple[str, str]:
    """train-1 with pods of rank 1 (running), 0 (done), 2 (pending), and another job's pod."""
    for name in ("train-1", "other"):
        job = render_spec(JobSpec(script="t.py", job_id=name), K8sTarget(image="i", nodes=3))[1]
        fake.handle("POST", "/apis/batch/v1/namespaces/default/jobs", job, f"Bearer {TOKEN}")
    one = fake.add_pod("train-1", 1, "Running", "rank 1 up\nloss 0.5\n")
    zero = fake.add_pod("train-1", 0, "Succeeded", "rank 0 up\nloss 0.4")
    fake.add_pod("train-1", 2, "Pending", "")
    fake.add_pod("other", 0, "Running", "not mine")
    fake.requests.clear()
    return zero, one


def test_logs_prefix_every_line_with_pod_and_rank(
    api_server: FakeApiServer,
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    zero, one = _running_job(api_server)
    assert _main(monkeypatch, "logs", "train-1") == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"[{zero}:0] rank 0 up",
        f"[{zero}:0] loss 0.4",
        f"[{one}:1] rank 1 up",
        f"[{one}:1] loss 0.5",
    ]
    assert "train-1-2-" in err and "not started (Pending)" in err
    selectors = [q["labelSelector"] for m, p, q, _ in api_server.requests if p.endswith("/pods")]
    assert selectors == [["batch.kubernetes.io/controller-uid=uid-train-1"]]


@pytest.mark.parametrize(
    ("kind", "code", "last"),
    [
        ("Complete", 0, "job train-1 succeeded"),
        (
            "Failed",
            1,
            "job train-1 failed: BackoffLimitExceeded: Job has reached the specified backoff limit",
        ),
    ],
)
def test_logs_follow_streams_until_the_job_ends(
    kind: str,
    code: int,
    last: str,
    api_server: FakeApiServer,
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    zero, one = _running_job(api_server)
    reason = "Completed" if kind == "Complete" else "BackoffLimitExceeded"
    api_server.finish(
        "train-1", kind, reason, "Job has reached the specified backoff limit" if code else ""
    )
    assert _main(monkeypatch, "logs", "train-1", "-f") == code
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [line for line in lines if line.startswith(f"[{zero}:0]")] == [
        f"[{zero}:0] rank 0 up",
        f"[{zero}:0] loss 0.4",
    ]
    assert [line for line in lines if line.startswith(f"[{one}:1]")] == [
        f"[{one}:1] rank 1 up",
        f"[{one}:1] loss 0.5",
    ]
    assert len(lines) == 4
    assert err.strip().splitlines()[-1] == last
    assert "log stream ended" not in err
    follows = [q for m, p, q, _ in api_server.requests if p.endswith("/log")]
    assert all(q["follow"] == ["true"] and q["container"] == ["trainer"] for q in follows)


def test_logs_of_an_unknown_job(
    api_server: FakeApiServer,
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _main(monkeypatch, "logs", "nope", "-n", "ml") == 2
    assert capsys.readouterr().err.strip() == "error: JOB: no job nope in namespace ml"


def test_a_refusing_api_server_is_named(
    api_server: FakeApiServer,
    kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api_server.forbidden = True
    assert _main(monkeypatch, "delete", "train-1") == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {api_server.url}: the API server refused to delete job train-1 in namespace "
        'default (403: jobs.batch is forbidden: User "x" cannot)'
    )


def test_an_unreachable_api_server_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    require("kubernetes.client", "the kubernetes client (corral[k8s])")
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    config = _kubeconfig(tmp_path / "kubeconfig", url)
    assert _main(monkeypatch, "apply", "--kubeconfig", str(config), *RENDER) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {url}: cannot reach the Kubernetes API server ("), err
    assert "Traceback" not in err
