"""The REST API over real HTTP: the app served by uvicorn in a thread on a free port,
a SQLite store in ``tmp_path``, ``local: true`` machines (no SSH), python-launcher
jobs running small scripts. The cases that need the real ``corral serve`` process
(its environment, its exit status) start it as a subprocess."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from corral.api.app import create_app
from corral.api.services import Services
from corral.fleet.capabilities import MachineHealth
from corral.service.eventlog import EVENTS_FILE
from corral.service.settings import ServerSettings
from corral.store import open_store
from tests.serverlib import follow_events, free_port, live_server, tls_context, wait_status
from tests.unit.test_service_planner import calibration_file

TOKEN = "api-test-token-" + "y" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DONE = ("succeeded", "failed", "timed_out", "cancelled", "lost")

PRINT_LINES = """\
import os, sys, time
rank = os.environ["RANK"]
for i in range({lines}):
    print(f"line {{i}} of rank {{rank}}", flush=True)
    time.sleep({pause})
"""


@dataclass
class Api:
    """One served app and an authenticated client of it."""

    root: Path
    url: str
    client: httpx.Client
    svc: Services

    def add_machine(self, name: str, slots: int = 2) -> dict[str, Any]:
        r = self.client.post(
            "/api/network/machines", json={"name": name, "local": True, "slots": slots}
        )
        assert r.status_code == 201, r.text
        return dict(r.json())

    def script(self, lines: int = 3, pause: float = 0.0, name: str = "job.py") -> str:
        path = self.root / name
        path.write_text(PRINT_LINES.format(lines=lines, pause=pause))
        return str(path)

    def plan(self, **body: Any) -> httpx.Response:
        body.setdefault("launcher", "python")
        body.setdefault("preflight", False)
        return self.client.post("/api/network/distributed/plan", json=body)

    def dispatch(self, job_id: str) -> httpx.Response:
        return self.client.post("/api/network/distributed/dispatch", json={"job_id": job_id})

    def run(self, **body: Any) -> dict[str, Any]:
        """Plan, dispatch and wait for the job to end; its final status."""
        planned = self.plan(**body)
        assert planned.status_code == 200, planned.text
        job_id = planned.json()["job_id"]
        assert self.dispatch(job_id).status_code == 200
        return self.wait(job_id)

    def wait(self, job_id: str, states: tuple[str, ...] = DONE) -> dict[str, Any]:
        return dict(wait_status(self.client, job_id, states, timeout=90))

    def total_jobs(self) -> int:
        return int(self.client.get("/api/jobs").json()["total"])


@contextmanager
def served(root: Path) -> Iterator[Api]:
    """The app of ``corral serve`` (background tasks on) in a uvicorn thread."""
    root.mkdir(parents=True, exist_ok=True)
    store = open_store(f"sqlite:///{root / 'corral.db'}")
    # ingest at the served default (0.2 s): at 0.05 s its idle loop cost 2% of a core
    settings = ServerSettings(
        run_dir=root / "runs", ingest_interval=0.2, schedule_interval=0.2, health_interval=0
    )
    svc = Services.build(store, settings)
    port = free_port()
    config = uvicorn.Config(
        create_app(svc, TOKEN), host="127.0.0.1", port=port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, headers=AUTH, timeout=60, verify=tls_context()) as client:
            yield Api(root, url, client, svc)
    finally:
        server.should_exit = True
        thread.join(30)
        store.close()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    with served(tmp_path / "server") as served_api:
        yield served_api


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, dict[str, Any]]]:
    """A server with machines sim1 and sim2 and one finished 2-rank job on both
    (40 lines per rank); the read-only tests share it."""
    with served(tmp_path_factory.mktemp("finished")) as served_api:
        for name in ("sim1", "sim2"):
            served_api.add_machine(name)
        status = served_api.run(
            script=served_api.script(lines=40),
            nproc_per_node=1,
            machine_selection="manual",
            selected_machines=["sim1", "sim2"],
            resource_requirements={"num_machines": 2},
        )
        assert status["status"] == "succeeded", status
        yield served_api, status


def assert_error(r: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    """``r`` is a ``status`` in the one error shape; its details."""
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"type", "message", "details"}
    assert body["error"]["type"] == kind
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    details: dict[str, Any] = body["error"]["details"]
    return details


# -- auth ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer {TOKEN}x"},
    ],
    ids=["none", "wrong", "basic-scheme", "no-scheme", "empty", "longer"],
)
def test_without_the_token_every_api_route_is_401_and_says_nothing(
    api: Api, headers: dict[str, str]
) -> None:
    machine = api.add_machine("secret-name-sim")
    paths = [
        f"/api/network/machines/{machine['id']}",
        "/api/network/machines/no-such-machine",
        "/api/network/machines",
        "/api/jobs",
        "/api/tasks",
        "/openapi.json",
        "/docs",
        "/metrics",
    ]
    bodies = set()
    with httpx.Client(base_url=api.url, timeout=30) as anonymous:
        for path in paths:
            r = anonymous.get(path, headers=headers)
            assert_error(r, 401, "unauthorized")
            assert r.headers["www-authenticate"] == "Bearer"
            assert "secret-name-sim" not in r.text
            assert machine["id"] not in r.text
            bodies.add(r.text)
        r = anonymous.post(
            "/api/network/machines", headers=headers, json={"name": "sneaky", "local": True}
        )
        assert_error(r, 401, "unauthorized")
        bodies.add(r.text)
        r = anonymous.delete(f"/api/network/machines/{machine['id']}", headers=headers)
        assert_error(r, 401, "unauthorized")
        bodies.add(r.text)
    # the same answer whether the resource exists or not
    assert len(bodies) == 1
    names = [m["name"] for m in api.client.get("/api/network/machines").json()]
    assert names == ["secret-name-sim"]


def test_healthz_is_open_and_the_schema_needs_the_token(api: Api) -> None:
    r = httpx.get(f"{api.url}/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}
    schema = api.client.get("/openapi.json")
    assert schema.status_code == 200
    assert "/api/network/distributed/plan" in schema.json()["paths"]


# -- machines ------------------------------------------------------------------------------


def test_machines_crud(api: Api) -> None:
    sim1 = api.add_machine("sim1", slots=3)
    assert sim1["name"] == "sim1"
    assert sim1["local"] is True
    assert sim1["slots"] == 3
    assert sim1["status"] == "online"  # a local machine is this one: checked at once
    assert sim1["running_jobs"] == []
    sim2 = api.add_machine("sim2")

    listed = api.client.get("/api/network/machines").json()
    assert [m["name"] for m in listed] == ["sim1", "sim2"]
    assert api.client.get(f"/api/network/machines/{sim1['id']}").json()["id"] == sim1["id"]
    assert api.client.get("/api/network/machines/sim2").json()["id"] == sim2["id"]
    status = api.client.get("/api/network/status").json()
    assert (status["total"], status["online"]) == (2, 2)

    details = assert_error(
        api.client.post("/api/network/machines", json={"name": "sim1", "local": True}),
        409,
        "conflict",
    )
    assert details["name"] == "sim1"

    assert_error(api.client.get("/api/network/machines/nope"), 404, "not_found")
    assert_error(api.client.delete("/api/network/machines/nope"), 404, "not_found")
    assert_error(api.client.delete("/api/network/machines/by-name/nope"), 404, "not_found")

    deleted = api.client.delete(f"/api/network/machines/{sim1['id']}")
    assert deleted.status_code == 200
    assert deleted.json()["name"] == "sim1"
    assert_error(api.client.get(f"/api/network/machines/{sim1['id']}"), 404, "not_found")
    by_name = api.client.delete("/api/network/machines/by-name/sim2")
    assert by_name.status_code == 200
    assert by_name.json()["id"] == sim2["id"]
    assert api.client.get("/api/network/machines").json() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "m", "local": True, "slots": 0}, "slots"),
        ({"name": "m", "host": "h", "port": 70000}, "port"),
        ({"name": "bad name!", "local": True}, "name"),
        ({"local": True}, "name"),
        ({"name": "m", "local": True, "colour": "red"}, "colour"),
        ({"name": "m", "host": "h", "password_env": "not a var"}, "password_env"),
    ],
    ids=["slots-0", "port", "name-pattern", "name-missing", "extra-field", "password-env"],
)
def test_an_invalid_machine_is_422_naming_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    details = assert_error(api.client.post("/api/network/machines", json=body), 422, "invalid")
    assert field in details["fields"][0]["field"]
    assert details["fields"][0]["message"]
    assert api.client.get("/api/network/machines").json() == []


def test_a_local_machine_with_a_host_is_422(api: Api) -> None:
    r = api.client.post(
        "/api/network/machines", json={"name": "m", "local": True, "host": "10.0.0.1"}
    )
    details = assert_error(r, 422, "invalid")
    assert details == {"field": "local"}


# -- plan, dispatch, stop --------------------------------------------------------------------


def test_planning_more_machines_than_registered_is_409_and_stores_nothing(api: Api) -> None:
    for name in ("sim1", "sim2"):
        api.add_machine(name)
    before = api.total_jobs()
    r = api.plan(script=api.script(), resource_requirements={"num_machines": 3})
    details = assert_error(r, 409, "conflict")
    assert details["needed"] == 3
    assert details["available"] == 2
    assert sorted(s["name"] for s in details["suggestions"]) == ["sim1", "sim2"]
    assert all(s["eligible"] for s in details["suggestions"])
    assert api.total_jobs() == before == 0


def test_plan_dispatch_wait_then_dispatch_again_is_409(api: Api) -> None:
    for name in ("sim1", "sim2"):
        api.add_machine(name)
    planned = api.plan(
        script=api.script(),
        nproc_per_node=1,
        resource_requirements={"num_machines": 2},
        env={"HF_TOKEN": "hf_plan_secret"},
    )
    assert planned.status_code == 200, planned.text
    body = planned.json()
    job_id = body["job_id"]
    assert body["status"] == "planned"
    plan = body["execution_plan"]
    assert plan["world_size"] == 2
    assert sorted(m["name"] for m in plan["machines"]) == ["sim1", "sim2"]
    assert "hf_plan_secret" not in planned.text
    assert api.client.get(f"/api/network/distributed/status/{job_id}").json()["status"] == (
        "planned"
    )

    dispatched = api.dispatch(job_id)
    assert dispatched.status_code == 200, dispatched.text
    assert dispatched.json()["status"] not in ("planned", "queued")
    status = api.wait(job_id)
    assert status["status"] == "succeeded", status
    assert status["exit_code"] == 0
    assert sorted(status["machines"]) == ["sim1", "sim2"]
    assert len(status["nodes"]) == 2
    assert "hf_plan_secret" not in api.client.get(f"/api/jobs/{job_id}").text

    details = assert_error(api.dispatch(job_id), 409, "conflict")
    assert details["status"] == "succeeded"

    stopped = api.client.post(f"/api/network/distributed/stop/{job_id}")
    assert stopped.status_code == 200
    assert stopped.json()["stopping"] is False
    assert stopped.json()["status"] == "succeeded"
    machines = api.client.get("/api/network/machines").json()
    assert [m["status"] for m in machines] == ["online", "online"]


def test_stopping_a_planned_job_cancels_it(api: Api) -> None:
    api.add_machine("sim1")
    job_id = api.plan(script=api.script()).json()["job_id"]
    stopped = api.client.post(f"/api/network/distributed/stop/{job_id}")
    assert stopped.status_code == 200
    assert stopped.json()["status"] == "cancelled"
    assert stopped.json()["stopping"] is False
    assert api.client.get(f"/api/jobs/{job_id}").json()["status"] == "cancelled"
    assert_error(api.dispatch(job_id), 409, "conflict")
    assert_error(api.client.post("/api/network/distributed/stop/nope"), 404, "not_found")
    assert_error(api.dispatch("nope"), 404, "not_found")


def test_a_command_job_runs_its_template_on_every_machine(api: Api) -> None:
    for name in ("sim1", "sim2"):
        api.add_machine(name)
    template = "echo node {node_rank} of {nnodes} on {host} with {world_size} ranks"
    status = api.run(
        launcher="command",
        command_template=template,
        nproc_per_node=1,
        machine_selection="manual",
        selected_machines=["sim1", "sim2"],
        resource_requirements={"num_machines": 2},
    )
    assert status["status"] == "succeeded", status
    assert status["exit_code"] == 0
    output = api.client.get(f"/api/network/local_job_output/{status['job_id']}").json()
    lines = output["lines"]
    assert "[sim1] node 0 of 2 on sim1 with 2 ranks" in lines
    assert "[sim2] node 1 of 2 on sim2 with 2 ranks" in lines
    listed = api.client.get("/api/jobs").json()["jobs"][0]
    assert listed["script"] == template
    record = api.client.get(f"/api/network/local_job_file/{status['job_id']}/job")
    assert json.loads(record.text)["command"][:2] == ["bash", "-c"]


@pytest.mark.parametrize("launcher", ["accelerate", "mlx"])
def test_accelerate_and_mlx_jobs_are_planned(api: Api, launcher: str) -> None:
    api.add_machine("sim1")
    planned = api.plan(script=api.script(), launcher=launcher, nproc_per_node=2)
    assert planned.status_code == 200, planned.text
    plan = planned.json()["execution_plan"]
    assert plan["launcher"] == launcher and plan["world_size"] == 2


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"launcher": "command"}, "command_template", "needs a command_template"),
        (
            {"launcher": "command", "command_template": "echo {rank}"},
            "command_template",
            "unknown placeholder {rank}",
        ),
        (
            {"launcher": "command", "command_template": "echo hi", "script": "t.py"},
            "script",
            "takes no script",
        ),
        ({"command_template": "echo hi", "script": "t.py"}, "command_template", "command only"),
    ],
)
def test_command_job_mistakes_are_422_naming_the_field(
    api: Api, body: dict[str, Any], field: str, says: str
) -> None:
    api.add_machine("sim1")
    r = api.plan(**body)
    assert assert_error(r, 422, "invalid") == {"field": field}
    assert says in r.json()["error"]["message"]
    assert api.total_jobs() == 0


def test_an_unknown_launcher_is_422_naming_the_field(api: Api) -> None:
    details = assert_error(api.plan(script="t.py", launcher="madengine"), 422, "invalid")
    assert details["fields"][0]["field"] == "body.launcher"


# -- workload weights (corral calibrate's file) ---------------------------------------------

PRINT_WEIGHTS = """\
import os
print("weights", os.environ["CORRAL_WORKLOAD_WEIGHTS"], flush=True)
"""


def test_a_calibrated_job_shows_its_weights_in_the_plan_and_the_status(api: Api) -> None:
    for name in ("sim1", "sim2"):
        api.add_machine(name, slots=1)
    cal = calibration_file(api.root / "calibration.json", {"sim1": [90.0], "sim2": [30.0]})
    script = api.root / "weights.py"
    script.write_text(PRINT_WEIGHTS)
    planned = api.plan(
        script=str(script),
        calibration=str(cal),
        machine_selection="manual",
        selected_machines=["sim1", "sim2"],
        resource_requirements={"num_machines": 2},
    )
    assert planned.status_code == 200, planned.text
    expected = [
        {"host": "sim1", "node_rank": 0, "local_rank": 0, "weight": 0.75, "fits": None},
        {"host": "sim2", "node_rank": 1, "local_rank": 0, "weight": 0.25, "fits": None},
    ]
    plan = planned.json()["execution_plan"]
    assert plan["workload_weights"] == expected
    job_id = planned.json()["job_id"]
    assert api.client.get(f"/api/jobs/{job_id}").json()["workload_weights"] == expected

    cal.unlink()  # read once, at plan time: the dispatch runs what the plan showed
    assert api.dispatch(job_id).status_code == 200
    status = api.wait(job_id)
    assert status["status"] == "succeeded", status
    assert status["workload_weights"] == expected
    seed = api.client.get(f"/api/network/distributed/status/{job_id}").json()
    assert seed["workload_weights"] == expected
    lines = api.client.get(f"/api/network/local_job_output/{job_id}").json()["lines"]
    assert "[sim1:0] weights 0.75,0.25" in lines and "[sim2:1] weights 0.75,0.25" in lines

    even = api.run(script=api.script(lines=1), nproc_per_node=1)
    assert even["status"] == "succeeded" and even["workload_weights"] is None


@pytest.mark.parametrize(
    ("rates", "says"),
    [
        (None, "calibration: calibration file"),
        ({"sim1": [10.0]}, "calibration: host sim2 is not in the calibration"),
        ({"sim1": [10.0, 10.0], "sim2": [5.0, 5.0]}, "ran 2 rank(s) in the calibration"),
    ],
    ids=["missing", "unmeasured-host", "other-rank-count"],
)
def test_a_calibration_that_does_not_fit_is_422_naming_the_field(
    api: Api, rates: dict[str, list[float]] | None, says: str
) -> None:
    for name in ("sim1", "sim2"):
        api.add_machine(name, slots=1)
    path = api.root / "calibration.json"
    if rates is not None:
        calibration_file(path, rates)
    r = api.plan(
        script=api.script(), calibration=str(path), resource_requirements={"num_machines": 2}
    )
    assert assert_error(r, 422, "invalid") == {"field": "calibration"}
    assert says in r.json()["error"]["message"]
    assert api.total_jobs() == 0
    bad = api.plan(script=api.script(), workload_weights=[1.0, -1.0])
    assert assert_error(bad, 422, "invalid")["fields"][0]["field"].startswith(
        "body.workload_weights"
    )


# Attempt 0: both ranks step at the same pace for 11.5 s (the drift monitor judges a rank
# after 10 s of reports), rank 0 processing twice the examples per step, then rank 0
# fails; attempt 1 prints the weights it was given.
TWICE_THE_EXAMPLES = """\
import os, sys, time
from corral import sdk

me = sdk.info()
if me.attempt > 0:
    print("weights", os.environ["CORRAL_WORKLOAD_WEIGHTS"], flush=True)
    sys.exit(0)
examples = 20 if me.rank == 0 else 10
step, end = 0, time.time() + 11.5
while time.time() < end:
    time.sleep(0.1)
    step += 1
    sdk.report(step, examples=examples)
sys.exit(7 if me.rank == 0 else 0)
"""


def test_rebalance_reweighs_a_served_job_at_its_restart(api: Api) -> None:
    for name in ("sim1", "sim2"):
        api.add_machine(name, slots=1)
    script = api.root / "examples.py"
    script.write_text(TWICE_THE_EXAMPLES)
    status = api.run(
        script=str(script),
        workload_weights=[1, 1],
        rebalance=True,
        max_restarts=1,
        machine_selection="manual",
        selected_machines=["sim1", "sim2"],
        resource_requirements={"num_machines": 2},
    )
    assert status["status"] == "succeeded", status
    assert status["restarts"] == 1
    lines = api.client.get(f"/api/network/local_job_output/{status['job_id']}").json()["lines"]
    printed = [line.split()[-1] for line in lines if line.startswith("[sim1:0] weights ")]
    assert len(printed) == 1, lines  # rank 0 ran twice rank 1's examples/s: about 2/3, 1/3
    assert [float(w) for w in printed[0].split(",")] == pytest.approx([2 / 3, 1 / 3], abs=0.03)
    events = api.root / "runs" / status["job_id"] / "events.jsonl"
    texts = [e.get("text", "") for e in map(json.loads, events.read_text().splitlines())]
    assert any(t.startswith("rebalanced workload weights from the live rates") for t in texts)
    # the status shows the weights the job runs with now, not the planned even split
    shown = [(w["host"], w["local_rank"], w["weight"]) for w in status["workload_weights"]]
    assert [(h, r) for h, r, _ in shown] == [("sim1", 0), ("sim2", 0)]
    assert [w for *_, w in shown] == pytest.approx([float(w) for w in printed[0].split(",")])


# -- a finished job's output, files and events -------------------------------------------


def test_output_pages_cover_every_line_once(finished: tuple[Api, dict[str, Any]]) -> None:
    api, status = finished
    job_id = status["job_id"]
    pages = []
    offset = 0
    while True:
        page = api.client.get(
            f"/api/network/local_job_output/{job_id}", params={"offset": offset, "limit": 7}
        ).json()
        assert page["offset"] == offset
        pages.append(page)
        if page["finished"]:
            break
        assert page["next_offset"] > offset
        offset = page["next_offset"]
        assert len(pages) < 200
    lines = [line for page in pages for line in page["lines"]]
    rank_lines = [line for line in lines if not line.startswith("[corral]")]
    expected = [f"[sim{r + 1}:{r}] line {i} of rank {r}" for r in (0, 1) for i in range(40)]
    assert sorted(rank_lines) == sorted(expected)
    for r in (0, 1):  # each rank's lines in order
        mine = [line for line in rank_lines if line.startswith(f"[sim{r + 1}:{r}]")]
        assert mine == [f"[sim{r + 1}:{r}] line {i} of rank {r}" for i in range(40)]

    whole = api.client.get(
        f"/api/network/local_job_output/{job_id}", params={"limit": 100_000}
    ).json()
    assert whole["lines"] == lines
    assert whole["finished"] is True
    end = api.client.get(
        f"/api/network/local_job_output/{job_id}", params={"offset": whole["next_offset"]}
    ).json()
    assert end["lines"] == []
    assert end["next_offset"] == whole["next_offset"]
    assert_error(api.client.get("/api/network/local_job_output/nope"), 404, "not_found")
    assert_error(
        api.client.get(f"/api/network/local_job_output/{job_id}", params={"offset": -1}),
        422,
        "invalid",
    )


def test_job_files_by_alias_and_path(finished: tuple[Api, dict[str, Any]]) -> None:
    api, status = finished
    job_id = status["job_id"]
    base = f"/api/network/local_job_file/{job_id}"
    result = api.client.get(f"{base}/result")
    assert result.status_code == 200
    assert result.json()["state"] == "succeeded"
    plan = api.client.get(f"{base}/plan")
    assert plan.status_code == 200
    assert plan.json()["job_id"] == job_id
    files = api.client.get(f"/api/jobs/{job_id}/files").json()
    assert "result.json" in files
    log = next(f for f in files if f.startswith("logs/") and f.endswith(".log"))
    assert api.client.get(f"{base}/{log}").status_code == 200

    details = assert_error(api.client.get(f"{base}/no-such-file"), 404, "not_found")
    assert "result.json" in details["files"]
    assert_error(api.client.get("/api/network/local_job_file/nope/result"), 404, "not_found")


@pytest.mark.parametrize(
    "key",
    [
        "%2E%2E/%2E%2E/corral.db",
        "..%2F..%2Fcorral.db",
        "logs/%2E%2E/%2E%2E/%2E%2E/corral.db",
        "%2E%2E",
        "/etc/passwd",
        "%2Fetc%2Fpasswd",
        "escape-link",
    ],
)
def test_job_files_never_leave_the_run_dir(finished: tuple[Api, dict[str, Any]], key: str) -> None:
    api, status = finished
    job_id = status["job_id"]
    run_dir = api.root / "runs" / job_id
    link = run_dir / "escape-link"
    if not link.is_symlink():
        link.symlink_to(api.root / "corral.db")
    r = api.client.get(f"/api/network/local_job_file/{job_id}/{key}")
    assert r.status_code == 403, r.text  # reached the route, and refused there
    assert_error(r, 403, "forbidden")
    assert "SQLite format" not in r.text
    assert "root:" not in r.text


def test_events_replay_ends_with_finished_and_resumes_after_an_id(
    finished: tuple[Api, dict[str, Any]],
) -> None:
    api, status = finished
    job_id = status["job_id"]
    events = follow_events(api.client, job_id, timeout=60)
    kinds = [kind for _, kind, _ in events]
    assert kinds[-1] == "finished"
    assert kinds.count("finished") == 1
    assert "log" in kinds and "state" in kinds
    ids = [int(i) for i, _, _ in events]
    assert ids == sorted(set(ids))  # increasing byte offsets, none twice
    middle = len(events) // 2
    with httpx.Client(
        base_url=api.url, headers={**AUTH, "Last-Event-ID": events[middle][0]}, timeout=60
    ) as resumed:
        assert follow_events(resumed, job_id, timeout=60) == events[middle + 1 :]
    r = api.client.get(f"/api/jobs/{job_id}/events", params={"from": events[-2][0]})
    assert r.status_code == 200
    assert "event: finished" in r.text
    assert_error(api.client.get("/api/jobs/nope/events"), 404, "not_found")


def read_some_events(api: Api, job_id: str, count: int) -> list[tuple[str, str, str]]:
    """The first ``count`` events of the live stream; then the connection is dropped."""
    events: list[tuple[str, str, str]] = []
    current: dict[str, str] = {}
    with api.client.stream("GET", f"/api/jobs/{job_id}/events", timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith(":"):
                continue
            if line:
                key, _, value = line.partition(":")
                current[key] = value[1:] if value.startswith(" ") else value
                continue
            if "data" in current:
                events.append((current.get("id", ""), current["event"], current["data"]))
                if len(events) == count:
                    break
            current = {}
    return events


def test_a_live_event_stream_resumes_without_loss_or_repeat(api: Api) -> None:
    for name in ("sim1", "sim2"):
        api.add_machine(name)
    planned = api.plan(
        script=api.script(lines=15, pause=0.1),
        nproc_per_node=1,
        resource_requirements={"num_machines": 2},
    )
    job_id = planned.json()["job_id"]
    assert api.dispatch(job_id).status_code == 200
    first = read_some_events(api, job_id, 4)
    assert len(first) == 4
    with httpx.Client(
        base_url=api.url, headers={**AUTH, "Last-Event-ID": first[-1][0]}, timeout=60
    ) as resumed:
        rest = follow_events(resumed, job_id, timeout=90)
    assert rest[-1][1] == "finished"
    assert api.wait(job_id)["status"] == "succeeded"
    # the two halves are the whole stream as a reader from the start sees it
    assert first + rest == follow_events(api.client, job_id, timeout=60)
    log_text = "".join(json.loads(data)["text"] for _, kind, data in first + rest if kind == "log")
    for r in (0, 1):
        for i in range(15):
            assert log_text.count(f"line {i} of rank {r}\n") == 1


def test_many_live_streams_of_a_job_each_get_the_whole_stream(api: Api) -> None:
    """The streams of a job share one reader of its events file (service/fanout):
    each still gets every event once, in order, as a replay does."""
    for name in ("sim1", "sim2"):
        api.add_machine(name)
    planned = api.plan(
        script=api.script(lines=20, pause=0.05),
        nproc_per_node=1,
        resource_requirements={"num_machines": 2},
    )
    job_id = planned.json()["job_id"]
    got: dict[int, list[tuple[str, str, str]]] = {}

    def follow(i: int) -> None:
        with httpx.Client(base_url=api.url, headers=AUTH, timeout=90) as client:
            got[i] = follow_events(client, job_id, timeout=90)

    threads = [threading.Thread(target=follow, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    assert api.dispatch(job_id).status_code == 200
    for thread in threads:
        thread.join(120)
    assert api.wait(job_id)["status"] == "succeeded"
    replay = follow_events(api.client, job_id, timeout=60)
    assert replay[-1][1] == "finished"
    assert [got[i] for i in range(8)] == [replay] * 8
    log_text = "".join(json.loads(data)["text"] for _, kind, data in replay if kind == "log")
    for r in (0, 1):
        for i in range(20):
            assert log_text.count(f"line {i} of rank {r}\n") == 1


# -- job listing, metrics, execute_job ------------------------------------------------------


def test_job_listing_metrics_and_execute_job(api: Api) -> None:
    api.add_machine("sim1")
    script = api.script(lines=2)
    first = api.run(script=script, nproc_per_node=1)
    assert first["status"] == "succeeded"

    here = api.client.post(
        "/api/network/execute_job",
        json={"script": script, "launcher": "python", "nproc_per_node": 2, "preflight": False},
    )
    assert here.status_code == 200, here.text
    local = api.wait(here.json()["job_id"])
    assert local["status"] == "succeeded"
    assert local["kind"] == "local"
    assert local["world_size"] == 2
    hostname = socket.gethostname().split(".")[0] or "localhost"
    assert local["machines"] == [hostname]
    output = api.client.get(f"/api/network/local_job_output/{local['job_id']}").json()
    assert f"[{hostname}:1] line 1 of rank 1" in output["lines"]

    planned = api.plan(script=script).json()["job_id"]

    page = api.client.get("/api/jobs", params={"status": "succeeded", "limit": 1}).json()
    assert (page["total"], page["limit"], page["offset"]) == (2, 1, 0)
    assert [j["job_id"] for j in page["jobs"]] == [local["job_id"]]  # newest first
    second = api.client.get(
        "/api/jobs", params={"status": "succeeded", "limit": 1, "offset": 1}
    ).json()
    assert [j["job_id"] for j in second["jobs"]] == [first["job_id"]]
    beyond = api.client.get(
        "/api/jobs", params={"status": "succeeded", "limit": 1, "offset": 2}
    ).json()
    assert (beyond["jobs"], beyond["total"]) == ([], 2)
    both = api.client.get("/api/jobs", params={"status": "succeeded,planned"}).json()
    assert both["total"] == 3
    assert both["jobs"][0]["job_id"] == planned
    assert api.client.get("/api/jobs", params={"kind": "local"}).json()["total"] == 1
    assert api.client.get("/api/jobs", params={"machine": "sim1"}).json()["total"] == 2
    assert_error(api.client.get("/api/jobs", params={"limit": 0}), 422, "invalid")

    metrics = api.client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'corral_jobs{state="succeeded"} 2.0' in metrics.text
    assert 'corral_jobs{state="planned"} 1.0' in metrics.text
    assert "corral_http_request_duration_seconds_bucket" in metrics.text
    assert 'route="/api/jobs"' in metrics.text
    assert 'corral_machine_up{machine="sim1"} 1.0' in metrics.text


# -- tasks, queue, suggestions, preferences -------------------------------------------------


def test_tasks_queue_and_run(api: Api) -> None:
    sim1 = api.add_machine("sim1")
    sim2 = api.add_machine("sim2")
    script = api.script(lines=2)
    request = {
        "script": script,
        "launcher": "python",
        "nproc_per_node": 1,
        "preflight": False,
        "resource_requirements": {"num_machines": 2},
    }
    secret = api.client.post(
        "/api/tasks",
        json={"name": "t", "request": {**request, "env": {"HF_TOKEN": "hf_task_secret"}}},
    )
    details = assert_error(secret, 422, "invalid")
    assert details["field"] == "request.env"
    assert "hf_task_secret" not in secret.text
    assert api.client.get("/api/tasks").json() == []

    created = api.client.post("/api/tasks", json={"name": "train", "request": request})
    assert created.status_code == 201, created.text
    task = created.json()
    assert api.client.get("/api/tasks").json() == [task]
    assert api.client.get(f"/api/tasks/{task['id']}").json() == task
    assert_error(api.client.get("/api/tasks/nope"), 404, "not_found")

    queued = api.client.get(f"/api/tasks/{task['id']}/queue_distributed")
    assert queued.status_code == 200, queued.text
    assert queued.json()["status"] == "queued"
    assert queued.json()["task_id"] == task["id"]
    status = api.wait(queued.json()["job_id"])
    assert status["status"] == "succeeded", status
    assert sorted(status["machines"]) == ["sim1", "sim2"]
    assert status["task_id"] == task["id"]

    on_one = api.client.get(f"/api/tasks/{task['id']}/queue/{sim2['id']}")
    assert on_one.status_code == 200, on_one.text
    single = api.wait(on_one.json()["job_id"])
    assert single["status"] == "succeeded", single
    assert single["machines"] == ["sim2"]
    assert single["kind"] == "single"
    assert single["world_size"] == 1
    assert_error(api.client.get(f"/api/tasks/{task['id']}/queue/nope"), 404, "not_found")
    assert_error(api.client.get(f"/api/tasks/nope/queue/{sim1['id']}"), 404, "not_found")
    listed = api.client.get("/api/jobs", params={"task_id": task["id"]}).json()
    assert listed["total"] == 2


def test_suggestions_and_preferences(api: Api) -> None:
    # the score includes each machine's load: injected samples, never this busy machine's
    samples = {"sim1": (30.0, 40.0), "sim2": (12.5, 61.0)}

    def probe(name: str) -> MachineHealth:
        cpu, mem = samples[name]
        load = {"cpu_percent": cpu, "memory_percent": mem, "load_avg": None, "gpus": []}
        return MachineHealth(name, True, time.time(), 0.0, {"cpus": 4, "gpu_count": 0}, load)

    api.svc.machines.local_probe = probe
    api.add_machine("sim1", slots=2)
    api.add_machine("sim2", slots=4)
    ranked = api.client.get(
        "/api/tasks/distributed/suggest_machines", params={"num_machines": 2}
    ).json()
    assert sorted(s["name"] for s in ranked) == ["sim1", "sim2"]
    assert all(s["eligible"] for s in ranked)
    assert ranked[0]["score"] >= ranked[1]["score"]
    assert {s["name"]: s["score"] for s in ranked} == {"sim1": 10.0, "sim2": 10.7}
    assert "CPU 30%" in next(s for s in ranked if s["name"] == "sim1")["reasons"]
    narrow = api.client.get(
        "/api/tasks/distributed/suggest_machines", params={"nproc_per_node": 4}
    ).json()
    assert [(s["name"], s["eligible"]) for s in narrow] == [("sim2", True), ("sim1", False)]
    assert narrow[1]["reasons"] == ["2 slots, 4 ranks per node asked"]
    assert_error(
        api.client.get("/api/tasks/distributed/suggest_machines", params={"num_machines": 0}),
        422,
        "invalid",
    )

    default = api.client.get("/api/preferences").json()
    assert default == {
        "preferred_machines": [],
        "default_num_machines": 1,
        "default_gpus_per_machine": 0,
        "auto_machine_selection": True,
    }
    wanted = {
        "preferred_machines": ["sim1"],
        "default_num_machines": 2,
        "default_gpus_per_machine": 0,
        "auto_machine_selection": False,
    }
    saved = api.client.put("/api/preferences", json=wanted)
    assert saved.status_code == 200
    assert saved.json() == wanted
    assert api.client.get("/api/preferences").json() == wanted
    details = assert_error(
        api.client.put("/api/preferences", json={**wanted, "default_num_machines": 0}),
        422,
        "invalid",
    )
    assert "default_num_machines" in details["fields"][0]["field"]
    assert api.client.get("/api/preferences").json() == wanted
    # a preferred machine scores 5 more
    after = api.client.get("/api/tasks/distributed/suggest_machines").json()
    before_score = {s["name"]: s["score"] for s in ranked}
    after_score = {s["name"]: s["score"] for s in after}
    assert after_score["sim1"] - before_score["sim1"] == pytest.approx(5.0)


# -- the real server process ------------------------------------------------------------------


def test_an_ssh_machines_password_is_never_returned(tmp_path: Path) -> None:
    secret = "pw-" + os.urandom(8).hex()
    with live_server(tmp_path / "srv", env={"SOME_VAR": secret}) as server:
        texts: list[str] = []
        with server.client() as client:
            added = client.post(
                "/api/network/machines",
                json={
                    "name": "gpu1",
                    "host": "127.0.0.1",
                    "port": 1,
                    "user": "ml",
                    "password_env": "SOME_VAR",
                },
            )
            assert added.status_code == 201, added.text
            assert added.json()["password_env"] == "SOME_VAR"
            machine_id = added.json()["id"]
            texts.append(added.text)
            pinged = client.post(f"/api/network/machines/{machine_id}/ping")
            assert pinged.status_code == 200
            assert pinged.json()["status"] == "offline"
            texts.append(pinged.text)
            for method, path in [
                ("GET", "/api/network/machines"),
                ("GET", f"/api/network/machines/{machine_id}"),
                ("GET", "/api/network/status"),
                ("POST", "/api/network/health-check?deadline=10"),
                ("GET", "/api/tasks/distributed/suggest_machines"),
                ("GET", "/metrics"),
                ("GET", "/openapi.json"),
            ]:
                r = client.request(method, path)
                assert r.status_code == 200, (path, r.text)
                texts.append(r.text)
            plan = client.post(
                "/api/network/distributed/plan",
                json={
                    "script": "train.py",
                    "machine_selection": "manual",
                    "selected_machines": ["gpu1"],
                },
            )
            assert plan.status_code == 409  # offline
            texts.append(plan.text)
        log = server.log()
    for text in [*texts, log]:
        assert secret not in text


def test_serve_with_a_db_it_cannot_write_exits_with_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory should be\n")
    db = blocker / "sub" / "corral.db"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral",
            "serve",
            "--port",
            str(free_port()),
            "--db",
            f"sqlite:///{db}",
            "--run-dir",
            str(tmp_path / "runs"),
            "--token-file",
            str(tmp_path / "token"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    out = (proc.stdout + proc.stderr).strip()
    assert "Traceback" not in out
    assert len(out.splitlines()) == 1, out
    assert str(db) in out
    assert "--db" in out


def _folded_job(api: Api, between: list[dict[str, Any]]) -> str:
    """A job whose events are a two-node teardown (its noise folded), ``between`` the
    noise and the state that ended it; its id."""
    for name in ("sim1", "sim2"):
        api.add_machine(name)
    status = api.run(
        script=api.script(lines=1),
        nproc_per_node=1,
        machine_selection="manual",
        selected_machines=["sim1", "sim2"],
        resource_requirements={"num_machines": 2},
    )
    job_id = str(status["job_id"])
    now = time.time()
    noise = "Traceback (most recent call last):\nSignalException: Process 7 got signal: 15\n"
    written = [
        {"kind": "attempt_started", "time": now, "number": 0, "hosts": ["sim1", "sim2"],
         "world_size": 2},
        {"kind": "log", "time": now, "host": "sim1", "rank": 0, "text": "step 1\n"},
        {"kind": "state", "time": now, "old": "running", "state": "stopping", "attempt": 0},
        {"kind": "log", "time": now, "host": "sim1", "rank": -1, "text": noise},
        {"kind": "log", "time": now, "host": "sim2", "rank": -1, "text": noise},
        *between,
        {"kind": "state", "time": now, "old": "stopping", "state": "failed", "attempt": 0},
        {"kind": "finished", "time": now, "state": "failed", "exit_code": 1,
         "result": {"ended": now, "failures": []}},
    ]  # fmt: skip
    events_file = Path(api.svc.jobs.row(job_id).run_dir) / EVENTS_FILE
    events_file.write_text("".join(json.dumps(e) + "\n" for e in written))
    return job_id


def test_notes_after_a_line_that_ends_where_they_resume_send_no_id_of_it_again(
    api: Api,
) -> None:
    """A rank's line between the teardown's noise and the state that ended it ends
    where the notes resume: the notes carry no id then (one id twice failed a netns
    run beside a CPU hog)."""
    bye = {"kind": "log", "time": time.time(), "host": "sim2", "rank": 0, "text": "bye\n"}
    job_id = _folded_job(api, [bye])
    events = follow_events(api.client, job_id, timeout=60)
    kinds = [kind for _, kind, _ in events]
    assert kinds[-4:] == ["message", "message", "state", "finished"], kinds
    assert "log" in kinds
    ids = [int(i) for i, _, _ in events if i]
    assert ids == sorted(set(ids))  # increasing byte offsets, none twice


def test_a_folded_teardowns_notes_never_send_one_id_twice(api: Api) -> None:
    """The teardown is folded into one note per node, all resuming at the event that
    ended it: only the last note carries that id (an id sent twice failed a netns run)."""
    job_id = _folded_job(api, [])
    events = follow_events(api.client, job_id, timeout=60)
    notes = [(i, json.loads(d)["text"]) for i, kind, d in events if kind == "message"]
    assert [text.split(":")[0] for _, text in notes] == ["sim1", "sim2"], notes
    assert notes[0][0] == "" and notes[1][0] != ""  # the last note carries the id
    ids = [int(i) for i, _, _ in events if i]
    assert ids == sorted(set(ids))  # increasing byte offsets, none twice
    with httpx.Client(
        base_url=api.url, headers={**AUTH, "Last-Event-ID": notes[1][0]}, timeout=60
    ) as resumed:  # from the last note: nothing repeated
        assert [k for _, k, _ in follow_events(resumed, job_id, timeout=60)] == [
            "state",
            "finished",
        ]
