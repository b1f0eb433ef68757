"""Schemathesis over the OpenAPI schema of a real ``corral serve``.

The server has two local machines and one finished job, so generated requests
meet real rows as well as unknown ids. Every operation of the schema is tested
(examples, coverage and fuzzing phases, a few examples each); no response may be
a server error, and each must match its documented schema.

Where an *accepted* request would start real work (a job, a queue entry, a pip
install) the operation is tested too, but such a request is not sent
(:func:`starts_work`): only the ones the server must refuse are. The server
reaches every SSH machine the fuzzer registers at 127.0.0.1 through its ssh
config, so health checks never leave this machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from pydantic import BaseModel, ValidationError
from schemathesis import checks

from corral.api.app import create_app
from corral.api.services import Services
from corral.service.models import DispatchIn, JobRequest, PrepareIn
from corral.service.settings import ServerSettings
from corral.store import open_store
from tests.serverlib import TOKEN, LiveServer, live_server, wait_status

AUTH = {"Authorization": f"Bearer {TOKEN}"}

# Operations whose accepted bodies start work: a dispatch starts a planned job's
# supervisor, dispatch_job and execute_job plan and start a job, prepare_dependencies
# rsyncs a tree and runs pip. Only bodies that fail validation are sent to them.
BODY_STARTS_WORK: dict[tuple[str, str], type[BaseModel]] = {
    ("POST", "/api/network/distributed/dispatch"): DispatchIn,
    ("POST", "/api/network/distributed_jobs/dispatch"): DispatchIn,
    ("POST", "/api/network/machines/{machine_id}/dispatch_job"): JobRequest,
    ("POST", "/api/network/execute_job"): JobRequest,
    ("POST", "/api/network/prepare_dependencies"): PrepareIn,
}
# Queuing an existing task starts a job as soon as machines are free: these are sent
# only for task ids the server does not know (a 404).
QUEUES_TASK = {
    (method, path)
    for method in ("GET", "POST")
    for path in (
        "/api/tasks/{task_id}/queue_distributed",
        "/api/tasks/{task_id}/queue/{machine_id}",
    )
}
# Resubmitting a job queues it again: sent only for job ids the server does not know.
RESUBMITS = ("POST", "/api/jobs/{job_id}/resubmit")

# Checks every response must pass. Left out, on purpose:
# - negative_data_rejection: pydantic's lax mode takes 0/1 for false/true, which the
#   schema's "boolean" does not;
# - positive_data_acceptance: some rules are beyond the schema (a job needs a script
#   or a plugin_name; a plan needs machines that can take it);
# - allow_header_conformance: Starlette's 405 names the methods of one route of a
#   path, not of all of them.
CHECKS = [
    checks.not_a_server_error,
    checks.response_schema_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.ignored_auth,
    checks.missing_required_header,
    checks.unsupported_method,
]
# FastAPI documents neither the 401 of a missing token nor the 400 of a body that is
# not even text; every other status must be one the schema lists.
UNDOCUMENTED_BY_DESIGN = (400, 401)

# The coverage phase (every boundary and every way to break each field) costs about
# 15 s per operation with a JobRequest body on 2 cores: it runs for the plan route,
# and not again for the other operations that take the same body model.
SAME_BODY_AS_PLAN = (
    "^/api/network/distributed_jobs/plan$|^/api/network/execute_job$"
    "|^/api/network/machines/[^/]+/dispatch_job$|^/api/tasks$"
)
CONFIG = schemathesis.Config.from_dict(
    {
        "operations": [
            {"include-path-regex": SAME_BODY_AS_PLAN, "phases": {"coverage": {"enabled": False}}}
        ]
    }
)

SSH_SANDBOX = "Host *\n  HostName 127.0.0.1\n  Port 1\n  ConnectTimeout 2\n"


def accepted(model: type[BaseModel], body: Any) -> bool:
    """Whether the server's own model takes ``body`` (as Python or as JSON)."""
    try:
        model.model_validate(body)
        return True
    except ValidationError:
        pass
    try:
        model.model_validate_json(json.dumps(body))
        return True
    except (ValidationError, TypeError, ValueError):
        return False


def starts_work(case: schemathesis.Case, client: httpx.Client) -> bool:
    """Whether the server would start real work for ``case`` (then it is not sent)."""
    key = (case.method.upper(), case.operation.path)
    model = BODY_STARTS_WORK.get(key)
    if model is not None:
        return accepted(model, case.body)
    if key in QUEUES_TASK:
        task_id = str((case.path_parameters or {}).get("task_id", ""))
        return not task_id or client.get(f"/api/tasks/{task_id}").status_code != 404
    if key == RESUBMITS:
        job_id = str((case.path_parameters or {}).get("job_id", ""))
        return not job_id or client.get(f"/api/jobs/{job_id}").status_code != 404
    return False


def app_schema() -> dict[str, Any]:
    """The OpenAPI schema ``corral serve`` serves (its app's, built over an in-memory
    store); :func:`test_the_tested_schema_is_the_served_one` pins that it is."""
    store = open_store("sqlite://")
    try:
        return dict(create_app(Services.build(store, ServerSettings()), TOKEN).openapi())
    finally:
        store.close()


# The schema is needed when pytest collects the tests (one per operation), before any
# server runs: schemathesis' lazy loader (schemathesis.pytest.from_fixture) does not
# work with pytest 9 ('Function' object has no attribute '_nodeid').
SCHEMA = app_schema()
schema = schemathesis.openapi.from_dict(SCHEMA, config=CONFIG)
SERVER_ERRORS: list[str] = []


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """``corral serve`` with machines sim1 and sim2 and one finished job."""
    root = tmp_path_factory.mktemp("schema")
    ssh_config = root / "ssh_config"
    ssh_config.write_text(SSH_SANDBOX)
    with live_server(root, args=["--ssh-config", str(ssh_config)]) as srv, srv.client() as client:
        for name in ("sim1", "sim2"):
            r = client.post("/api/network/machines", json={"name": name, "local": True})
            assert r.status_code == 201, r.text
        script = Path(root) / "job.py"
        script.write_text("print('hello')\n")
        planned = client.post(
            "/api/network/distributed/plan",
            json={"script": str(script), "launcher": "python", "preflight": False},
        )
        assert planned.status_code == 200, planned.text
        job_id = planned.json()["job_id"]
        r = client.post("/api/network/distributed/dispatch", json={"job_id": job_id})
        assert r.status_code == 200, r.text
        assert wait_status(client, job_id, ("succeeded",))["status"] == "succeeded"
        yield srv


def test_the_tested_schema_is_the_served_one(server: LiveServer) -> None:
    with server.client() as client:
        assert client.get("/openapi.json").json() == SCHEMA


@schema.parametrize()
@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_server_error(case: schemathesis.Case, server: LiveServer) -> None:
    with server.client() as client:
        if starts_work(case, client):
            return
    response = case.call(base_url=server.url, headers=AUTH, timeout=30)
    if response.status_code >= 500:
        SERVER_ERRORS.append(f"{case.method} {case.formatted_path}: {response.status_code}")
    wanted = list(CHECKS)
    if response.status_code not in UNDOCUMENTED_BY_DESIGN:
        wanted.append(checks.status_code_conformance)
    case.validate_response(
        response,
        checks=wanted,
        headers=AUTH,
        transport_kwargs={"base_url": server.url, "headers": AUTH, "timeout": 30},
    )


def test_no_server_error_at_all(server: LiveServer) -> None:
    """After all of the above: no 5xx, and nothing went wrong inside the server."""
    assert SERVER_ERRORS == []
    with server.client() as client:
        assert client.get("/healthz").status_code == 200
    log = (server.root / "serve.log").read_text(errors="replace")
    assert "Traceback" not in log
    assert "unexpected error" not in log
