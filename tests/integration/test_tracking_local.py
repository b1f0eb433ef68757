"""corral run --track: a real local:2 job's reports, parameters and final state in
TensorBoard's event files, an MLflow store and an offline W&B run (read back with
each tool's own reader), a tracker that fails being only a warning line."""

from __future__ import annotations

import glob
import json
import struct
from pathlib import Path
from typing import Any

from tests.conftest import require
from tests.integration.conftest import SCRIPTS, run_corral


def _wandb_records(path: str) -> list[Any]:
    """The records of an offline W&B run file (LevelDB-log framing: 32 KiB blocks of
    ``crc32 | length | type`` chunks after a 7-byte ``:W&B`` header)."""
    pb = require("wandb.proto.wandb_internal_pb2", "the [wandb] extra: make setup")
    raw = Path(path).read_bytes()
    assert raw[:4] == b":W&B"
    pos, block, chunk, records = 7, 32768, b"", []
    while pos + 7 <= len(raw):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, size, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        chunk += raw[pos + 7 : pos + 7 + size]
        pos += 7 + size
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def _key(item: Any) -> str:
    """A W&B history/summary/config item's name (``key``, or its ``nested_key`` path)."""
    return str(item.key or "/".join(item.nested_key))


def test_run_track_forwards_reports_params_and_final_state(tmp_path: Path) -> None:
    require("tensorboard", "the [tensorboard] extra: make setup")
    require("mlflow", "the [mlflow] extra: make setup")
    require("wandb", "the [wandb] extra: make setup")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    db = f"sqlite:///{tmp_path}/mlflow.db"
    broken = tmp_path / "not-a-dir"
    broken.write_text("a file where the tracker wants a directory")
    proc = run_corral(
        "run", "--hosts", "local:2", "--launcher", "python", "--no-preflight",
        "--master-port", "0", "--run-dir", "runs", "--job-id", "tracked",
        "--track", "tensorboard:tb", "--track", f"mlflow:{db}", "--track", "wandb:corral-test",
        "--track", f"tensorboard:{broken}",
        "--", str(SCRIPTS / "report_steps.py"), "--steps", "24",
        cwd=tmp_path, env={"WANDB_MODE": "offline"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert f"tracking: tensorboard ({broken}) could not start its run" in out  # a warning only

    # TensorBoard: one series per metric and rank, the params and the final state as text
    events = EventAccumulator(str(tmp_path / "tb" / "tracked"))
    events.Reload()
    loss = [(e.step, round(e.value, 4)) for e in events.Scalars("loss")]
    assert loss == [(s, round(1 / (s + 1), 4)) for s in range(24)]
    assert [round(e.value, 4) for e in events.Scalars("rank1/loss")][:4] == [2.0, 1.0, 0.6667, 0.5]
    rates = [t for t in events.Tags()["scalars"] if t.startswith("throughput/rank")]
    assert rates  # measured over half a second at least: the ranks run 1.2 s or more
    assert all(e.value > 0 for tag in rates for e in events.Scalars(tag))
    assert [e.value for e in events.Scalars("exit_code")] == [0.0]
    params = events.Tensors("params")[0].tensor_proto.string_val[0].decode()
    assert "| world_size | 2 |" in params and "| launcher | python |" in params
    assert "report_steps.py" in params and "| args | --steps 24 |" in params
    assert (
        "| state | succeeded |"
        in events.Tensors("final_state")[0].tensor_proto.string_val[0].decode()
    )

    # MLflow: one run named after the job, its params, the per-step history, FINISHED
    client = MlflowClient(tracking_uri=db)
    experiment = client.get_experiment_by_name("corral")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert run.data.params["world_size"] == "2" and run.data.params["launcher"] == "python"
    assert run.data.params["args"] == "--steps 24"
    assert run.data.tags["corral.state"] == "succeeded" and run.data.metrics["exit_code"] == 0
    history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    assert history == [(s, 1 / (s + 1)) for s in range(24)]
    assert set(rates) <= set(run.data.metrics)

    # W&B: the offline run under the job's run dir, with the history and the end
    (path,) = glob.glob(str(tmp_path / "runs/tracked/wandb/offline-run-*/run-*.wandb"))
    records = _wandb_records(path)
    rows = [
        {_key(i): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    steps = sorted((row["step"], row["loss"]) for row in rows if "loss" in row)
    assert steps == [(s, 1 / (s + 1)) for s in range(24)]
    config = next(r.run.config for r in records if r.WhichOneof("record_type") == "run")
    values = {_key(u): json.loads(u.value_json) for u in config.update}
    assert values["world_size"] == 2 and values["script"].endswith("report_steps.py")
    summary: dict[str, Any] = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            for u in r.summary.update:
                summary[_key(u)] = json.loads(u.value_json)
    assert summary["state"] == "succeeded" and summary["exit_code"] == 0
    assert any(r.WhichOneof("record_type") == "exit" for r in records)
