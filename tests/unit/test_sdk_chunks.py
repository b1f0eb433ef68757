"""corral.sdk.chunks: the seed's boundaries, progress, state file and resume after a crash."""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import textwrap
import types
import weakref
from pathlib import Path

import pytest

from corral import sdk
from corral.sdk._chunks import _percent
from corral.sdk._resume import CHECKPOINT_DIR_ENV
from tests.conftest import require

pytestmark = pytest.mark.usefixtures("clean_dist_env")
ROOT = Path(__file__).resolve().parents[2]
_REAL_COLLECT = gc.collect


@pytest.fixture(autouse=True)
def _no_checkpoint_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CHECKPOINT_DIR_ENV, raising=False)
    monkeypatch.delenv("CORRAL_CONTROL", raising=False)


@pytest.fixture(autouse=True)
def _young_gc(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full collection per chunk costs ~0.5 s in the test process's large heap: the
    other tests collect the youngest generation only; the memory test keeps the real one."""
    if request.node.name != "test_memory_is_freed_between_chunks":
        young = types.SimpleNamespace(collect=lambda *_: _REAL_COLLECT(0))
        monkeypatch.setattr("corral.sdk._chunks.gc", young)


def spans(chunks: list[sdk.Chunk]) -> list[tuple[int, int]]:
    return [(c.start, c.stop) for c in chunks]


def test_50000_examples_turn_chunking_on(capsys: pytest.CaptureFixture[str]) -> None:
    got = list(sdk.chunks(50_000))
    assert got == [sdk.Chunk(0, 1, 0, 50_000, chunked=True)]
    out = capsys.readouterr().out
    assert "chunking enabled: 1 chunks of 50,000 examples" in out
    assert "chunk 1/1 (100%) done" in out


def test_49999_examples_turn_it_off(capsys: pytest.CaptureFixture[str]) -> None:
    got = list(sdk.chunks(49_999))
    assert got == [sdk.Chunk(0, 1, 0, 49_999, chunked=False)]
    assert len(got[0]) == 49_999 and got[0].range == range(49_999)
    out = capsys.readouterr().out
    assert "below the chunking threshold (49,999 < 50,000 examples): chunking disabled" in out
    assert "chunk 1/1" not in out


@pytest.mark.parametrize("n", [0, -1, -50_000])
def test_no_examples_is_an_error(n: int) -> None:
    with pytest.raises(ValueError, match=f"n_examples must be a positive integer, got {n}"):
        list(sdk.chunks(n))


@pytest.mark.parametrize("size", [0, -5, 2.5, True])
def test_a_bad_chunk_size_is_an_error(size: object) -> None:
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        list(sdk.chunks(10, size))  # type: ignore[arg-type]


def test_ranges_cover_the_dataset_with_a_short_last_chunk(
    capsys: pytest.CaptureFixture[str],
) -> None:
    got = list(sdk.chunks(100_001))
    assert spans(got) == [(0, 50_000), (50_000, 100_000), (100_000, 100_001)]
    assert [(c.index, c.total) for c in got] == [(0, 3), (1, 3), (2, 3)]
    out = capsys.readouterr().out
    for line in ("chunk 1/3 (33%) done", "chunk 2/3 (67%) done", "chunk 3/3 (100%) done"):
        assert line in out
    assert spans(list(sdk.chunks(10, 4))) == [(0, 4), (4, 8), (8, 10)]


def test_progress_goes_only_to_rank_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert len(list(sdk.chunks(10, 5))) == 2
    assert capsys.readouterr().out == ""


def test_completion_is_recorded_and_a_finished_pass_yields_nothing(tmp_path: Path) -> None:
    assert len(list(sdk.chunks(10, 4, checkpoint_dir=tmp_path))) == 3
    state = json.loads((tmp_path / "chunks.json").read_text())
    assert state == {"n_examples": 10, "chunk_size": 4, "total": 3, "done": 3}
    assert list(sdk.chunks(10, 4, checkpoint_dir=tmp_path)) == []
    assert len(list(sdk.chunks(10, 4, checkpoint_dir=tmp_path, name="epoch-2"))) == 3
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_an_interrupted_chunk_is_done_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(CHECKPOINT_DIR_ENV, str(tmp_path))  # corral run --checkpoint-dir
    seen: list[int] = []
    with pytest.raises(RuntimeError, match="boom"):
        for chunk in sdk.chunks(10, 2):
            if chunk.index == 3:
                raise RuntimeError("boom")
            seen.append(chunk.index)
    assert seen == [0, 1, 2]
    assert json.loads((tmp_path / "chunks.json").read_text())["done"] == 3
    capsys.readouterr()
    assert [c.index for c in sdk.chunks(10, 2)] == [3, 4]
    assert "chunks 1-3 of 5 already done" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("done", "total", "percent"),
    [(1, 3, 33), (2, 3, 67), (3, 3, 100), (1, 8, 13), (199, 200, 99), (200, 200, 100)],
)
def test_progress_is_rounded_and_100_only_at_the_end(done: int, total: int, percent: int) -> None:
    assert _percent(done, total) == percent


def test_a_rerun_of_a_finished_pass_says_all_chunks_are_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    list(sdk.chunks(10, 4, checkpoint_dir=tmp_path))
    capsys.readouterr()
    assert list(sdk.chunks(10, 4, checkpoint_dir=tmp_path)) == []
    out = capsys.readouterr().out
    assert f"all 3 chunks already done ({tmp_path / 'chunks.json'}): nothing to do" in out
    assert "resuming at chunk" not in out and "chunk 4" not in out
    list(sdk.chunks(10, 4, checkpoint_dir=tmp_path, name="one"))
    (tmp_path / "one.json").write_text(
        json.dumps({"n_examples": 10, "chunk_size": 4, "total": 3, "done": 1})
    )
    capsys.readouterr()
    assert [c.index for c in sdk.chunks(10, 4, checkpoint_dir=tmp_path, name="one")] == [1, 2]
    assert "chunk 1 of 3 already done" in capsys.readouterr().out


def test_leaving_the_loop_early_does_not_mark_the_chunk_done(tmp_path: Path) -> None:
    for chunk in sdk.chunks(10, 5, checkpoint_dir=tmp_path):
        assert chunk.index == 0
        break
    assert not (tmp_path / "chunks.json").exists()


def test_a_state_file_of_another_dataset_is_refused(tmp_path: Path) -> None:
    list(sdk.chunks(10, 4, checkpoint_dir=tmp_path))
    with pytest.raises(ValueError, match=r"this run has .*'n_examples': 12.*pass another name="):
        list(sdk.chunks(12, 4, checkpoint_dir=tmp_path))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read chunk state"):
        list(sdk.chunks(12, 4, checkpoint_dir=tmp_path, name="broken"))
    with pytest.raises(ValueError, match="must be a plain file name"):
        list(sdk.chunks(12, 4, checkpoint_dir=tmp_path, name="../x"))


CRASHING = """
import os, sys
sys.path.insert(0, {src!r})
from corral import sdk
for chunk in sdk.chunks(7, 2, checkpoint_dir={ckpt!r}):
    print("train", chunk.index, chunk.start, chunk.stop, flush=True)
    if chunk.index == 2 and os.environ.get("CRASH"):
        os._exit(9)  # no cleanup, no exception handling: a killed process
"""


def test_a_crashed_process_resumes_at_the_first_unfinished_chunk(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(CRASHING.format(src=str(ROOT / "src"), ckpt=str(tmp_path / "ck")))
    )

    def run(**env: str) -> tuple[int, list[str], str]:
        """Exit code, the chunks trained and stdout of one run of the script."""
        proc = subprocess.run(
            [sys.executable, str(script)],
            env={"PATH": "/usr/bin:/bin", **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        trained = [ln for ln in proc.stdout.splitlines() if ln.startswith("train")]
        return proc.returncode, trained, proc.stdout + proc.stderr

    code, trained, out = run(CRASH="1")
    assert code == 9, out
    assert trained == ["train 0 0 2", "train 1 2 4", "train 2 4 6"]
    code, trained, out = run()
    assert code == 0, out
    assert trained == ["train 2 4 6", "train 3 6 7"]
    assert "resuming at chunk 3" in out


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cycle collector frees it


def test_memory_is_freed_between_chunks() -> None:
    refs: list[weakref.ref[_Node]] = []
    gc.disable()
    # what lived before the test is left out of the boundaries' full collections: in a
    # full run's worker each walked ~1M objects (~0.5 CPU-s); the cycle made here is new
    gc.freeze()
    try:
        for chunk in sdk.chunks(4, 2):
            if chunk.index == 0:
                refs.append(weakref.ref(_Node()))
                assert refs[0]() is not None  # kept alive by its cycle, no collector running
            else:
                assert refs[0]() is None  # collected at the chunk boundary
    finally:
        gc.unfreeze()
        gc.enable()


def _agreeing_rank(rank: int, tmp: str, port: int) -> None:
    """One rank of a 2-rank gloo group whose hosts recorded different progress."""
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    own = Path(tmp, f"host{rank}")  # host-local checkpoint directories
    result: dict[str, object] = {"first": [c.index for c in sdk.chunks(10, 2, checkpoint_dir=own)]}
    try:
        list(sdk.chunks(10, 2, checkpoint_dir=own, name="mismatch"))
    except ValueError as exc:
        result["error"] = str(exc)
    dist.destroy_process_group()
    Path(tmp, f"{rank}.json").write_text(json.dumps(result))


@pytest.mark.torch
def test_ranks_agree_on_the_lowest_unfinished_chunk(tmp_path: Path) -> None:
    torch_mp = require("torch.multiprocessing")
    state = {"n_examples": 10, "chunk_size": 2, "total": 5}
    for rank, done in ((0, 3), (1, 1)):  # the crash came between the two hosts' records
        (tmp_path / f"host{rank}").mkdir()
        (tmp_path / f"host{rank}" / "chunks.json").write_text(json.dumps({**state, "done": done}))
    other = {**state, "n_examples": 12, "done": 1}
    (tmp_path / "host1" / "mismatch.json").write_text(json.dumps(other))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # forked: the ranks start with the torch this process imported (spawned ones import it
    # again, ~1.5 CPU-s each); nothing of torch ran here before, no thread of its forks
    torch_mp.start_processes(
        _agreeing_rank, args=(str(tmp_path), port), nprocs=2, join=True, start_method="fork"
    )
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert [r["first"] for r in results] == [[1, 2, 3, 4], [1, 2, 3, 4]]
    for r in results:  # both ranks raise, naming the rank whose state file is wrong
        assert r["error"].startswith("rank 1: chunk state "), r
