"""The gate a node's processes wait at while the checklist runs (corral.agent.gate), and
which plans the held processes may run (corral.agent.prestart.mismatch): real
processes, stdlib scripts."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.agent import gate
from corral.agent.gate import WORKER, gated_argv, imports_torch, split_argv
from corral.agent.prestart import mismatch
from corral.cluster import Cluster, Host
from corral.job.agents import HostProbe, held_nodes
from corral.plan.spec import JobSpec

SRC = str(Path(corral.__file__).parents[1])
SCRIPT = """
import json, os, sys
with open(sys.argv[1], "w") as fh:
    json.dump({"argv": sys.argv[1:], "A": os.environ.get("A"), "B": os.environ.get("B"),
               "RANK": os.environ.get("RANK")}, fh)
"""


def _held(tmp_path: Path, args: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """A worker started through the gate (as the agent starts it); the gate's write end."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    read, write = os.pipe()
    argv = gated_argv([sys.executable, "-u", "-m", "corral.agent.worker", str(script), *args], read)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": SRC, "A": "early", "B": "gone", "RANK": "5"}
    proc = subprocess.Popen(argv, env=env, pass_fds=(read,), cwd=tmp_path)
    os.close(read)
    return proc, write


def test_split_and_gated_argv() -> None:
    torchrun = ["/py", "-m", "torch.distributed.run", "--nnodes=2", "-m", "corral.agent.worker"]
    assert split_argv(torchrun) == (torchrun[:3], torchrun[3:])
    worker = ["/py", "-u", "-m", "corral.agent.worker", "train.py", "--lr", "1"]
    assert split_argv(worker) == (worker[:4], ["train.py", "--lr", "1"])
    assert gated_argv(worker, 7) == [
        "/py",
        "-u",
        "-m",
        "corral.agent.gate",
        "7",
        "corral.agent.worker",
        "train.py",
        "--lr",
        "1",
    ]
    for other in (["/py", "train.py"], ["/py", "-m", "accelerate.commands.launch"], ["sh", "-c"]):
        assert split_argv(other) is None
    with pytest.raises(ValueError):
        gated_argv(["bash", "run.sh"], 3)


def test_the_gate_runs_the_start_messages_arguments_and_environment(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc, gate = _held(tmp_path, ["planned-argument"])
    message = {"argv": [str(tmp_path / "script.py"), str(out)], "set": {"A": "late", "RANK": "1"}}
    os.write(gate, json.dumps({**message, "unset": ["B"]}).encode() + b"\n")
    os.close(gate)
    assert proc.wait(timeout=60) == 0
    seen = json.loads(out.read_text())
    assert seen == {"argv": [str(out)], "A": "late", "B": None, "RANK": "1"}


def test_a_closed_gate_runs_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    proc, gate = _held(tmp_path, [str(out)])
    os.close(gate)  # the launch was called off
    assert proc.wait(timeout=60) == 0
    assert not out.exists()


def test_imports_torch(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    for source, expected in [
        ("import torch\n", True),
        ("import os\nfrom torch import nn\n", True),
        ("    import torch.distributed as dist\n", True),
        ("import torchvision\n# import torch\nprint('torch')\n", False),
    ]:
        script.write_text(source)
        assert imports_torch(str(script)) is expected, source
    assert not imports_torch(str(tmp_path / "missing.py"))


def _node(**changes: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "argv": ["/py", "-u", "-m", "corral.agent.worker", "train.py"],
        "cwd": "/work",
        "env": {"CORRAL_NODE_DIR": "/runs/j/nodes/a", "MASTER_PORT": "1", "PYTHONPATH": "/x"},
        "ranks": [{"rank": 0, "local_rank": 0, "env": {"RANK": "0"}}],
    }
    node.update(changes)
    return node


def test_what_the_held_processes_may_run() -> None:
    old = _node()
    late = {**old["env"], "MASTER_PORT": "2", "NCCL_SOCKET_IFNAME": "eth1", "CORRAL_ATTEMPT": "0"}
    ranks = [{"rank": 3, "local_rank": 0, "env": {"RANK": "3"}}]
    new_args = ["/py", "-u", "-m", "corral.agent.worker", "train.py", "--more"]
    assert mismatch(old, _node(env=late, ranks=ranks, argv=new_args)) is None
    env = {**old["env"], "PYTHONPATH": "/y"}
    assert mismatch(old, _node(env=env)) == "PYTHONPATH changed"
    env = {**old["env"], "OMP_NUM_THREADS": "4"}
    assert mismatch(old, _node(env=env)) == "OMP_NUM_THREADS changed"
    env = {**old["env"], "CORRAL_NODE_DIR": "/runs/j/nodes/b"}
    assert mismatch(old, _node(env=env)) == "its node directory changed"
    assert mismatch(old, _node(cwd="/other")) == "its working directory changed"
    assert mismatch(old, _node(argv=["/py2", "-u", "-m", "corral.agent.worker", "train.py"]))
    two: list[dict[str, Any]] = [{"rank": r, "local_rank": r, "env": {}} for r in (0, 1)]
    assert mismatch(old, _node(ranks=two)) == "its ranks changed"
    early = [{"rank": 0, "local_rank": 0, "env": {"RANK": "0", "LD_PRELOAD": "x.so"}}]
    assert mismatch(old, _node(ranks=early)) == "LD_PRELOAD changed"


def _rank_node(tmp_path: Path, python: str) -> dict[str, Any]:
    node_dir = tmp_path / "node"
    return {
        "argv": [python, "-u", "-m", "corral.agent.worker", str(tmp_path / "script.py"), "x"],
        "cwd": str(tmp_path),
        "env": {"CORRAL_NODE_DIR": str(node_dir), "CORRAL_JOB_ID": "gatejob", "PYTHONPATH": SRC},
        "ranks": [{"rank": 0, "local_rank": 0, "env": {"RANK": "0", "LOCAL_RANK": "0"}}],
    }


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def test_the_agent_replaces_a_plan_the_probe_corrected_and_an_abort_leaves_nothing(
    tmp_path: Path,
) -> None:
    """The probe's plan names an interpreter the host lacks (nothing held); the plan
    sent after it is held; an abort kills it: no process, no node directory."""
    (tmp_path / "script.py").write_text(SCRIPT)
    agent = subprocess.Popen(
        [sys.executable, "-m", "corral.agent"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": SRC},
    )
    assert agent.stdin is not None and agent.stdout is not None
    guessed = _rank_node(tmp_path, str(tmp_path / "no-such-python"))
    probe = {"op": "probe", "workdir": None, "port": None, "prestart": guessed}
    agent.stdin.write(json.dumps(probe).encode() + b"\n")
    agent.stdin.flush()
    agent.stdout.readline()  # the probe's answer (a frame header)
    assert _children(agent.pid) == []  # the guessed interpreter does not exist
    assert not (tmp_path / "node").exists()
    corrected = {"op": "prestart", "node": _rank_node(tmp_path, sys.executable)}
    agent.stdin.write(json.dumps(corrected).encode() + b"\n")
    agent.stdin.flush()
    deadline = time.monotonic() + 60
    while not _children(agent.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    [held] = _children(agent.pid)
    cmdline = Path(f"/proc/{held}/cmdline").read_bytes().split(b"\0")
    while b"corral.agent.gate" not in cmdline and time.monotonic() < deadline:
        time.sleep(0.02)  # forked, not exec'd yet: it still shows the agent's command
        cmdline = Path(f"/proc/{held}/cmdline").read_bytes().split(b"\0")
    assert b"corral.agent.gate" in cmdline and cmdline[0] == sys.executable.encode()
    assert (tmp_path / "node").is_dir()
    agent.stdin.write(b'{"op": "abort"}\n')
    agent.stdin.close()
    assert agent.wait(timeout=60) == 0
    assert not Path(f"/proc/{held}").exists()  # killed and reaped by the agent
    assert not (tmp_path / "node").exists()
    assert not (tmp_path / "x").exists()  # the script never ran


def test_an_ssh_hosts_plan_goes_with_its_probe_and_again_only_if_its_interpreter_differs() -> None:
    spec = JobSpec(script="train.py", launcher="python", job_id="j", master_port=0, python="/py")
    cluster = Cluster((Host("h1", slots=2), Host("h2", slots=1)))
    plan = held_nodes(spec, cluster, 0, "/venv/bin/python")
    node = plan("h2", None)
    assert node is not None and node["argv"][:4] == ["/venv/bin/python", "-u", "-m", WORKER]
    assert [r["rank"] for r in node["ranks"]] == [2]
    assert plan("h2", _probe("/venv/bin/python")) is None  # the guess was right
    corrected = plan("h2", _probe("/usr/bin/python3"))
    assert corrected is not None and corrected["argv"][0] == "/usr/bin/python3"
    torchrun = held_nodes(dataclasses.replace(spec, launcher="torchrun"), cluster, 0, None)
    first = torchrun("h1", None)
    assert first is not None and first["argv"][1:3] == ["-m", "torch.distributed.run"]


def _probe(python: str) -> HostProbe:
    return HostProbe(
        host="h2", python=python, hostname="h2", has_torch=True, workdir_ok=True, port=None
    )


def test_what_is_imported_before_the_gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    imported: list[str] = []
    monkeypatch.setattr(gate.importlib, "import_module", imported.append)
    uses_torch, plain = tmp_path / "a.py", tmp_path / "b.py"
    uses_torch.write_text("import torch\nimport mymodel\n")
    plain.write_text("import mymodel\n")
    assert gate.preload(gate.WORKER, [str(uses_torch), "--x"]) == [gate.WORKER, "torch"]
    assert gate.preload(gate.WORKER, [str(plain)]) == [gate.WORKER]  # never the script's own
    assert gate.preload(gate.TORCHRUN, ["--nnodes=2"]) == [gate.TORCHRUN]
    assert imported == [gate.WORKER, "torch", gate.WORKER, gate.TORCHRUN]
