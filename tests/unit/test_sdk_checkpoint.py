"""corral.sdk checkpoints: atomic writes, pruning, skipping damaged files, announcing
saves to the supervisor, write errors and resume()."""

from __future__ import annotations

import errno
import json
import os
import pickle
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import sdk
from corral.sdk import _checkpoint
from tests.conftest import require_torch

from .test_sdk_report import ControlServer, forget_earlier_reports

pytestmark = pytest.mark.torch

# What pickling a local lambda raises: AttributeError (Python 3.11 to 3.13; newer
# Pythons raise PicklingError), both saying "Can't pickle local object".
UNPICKLABLE = (AttributeError, pickle.PicklingError)


@pytest.fixture(autouse=True)
def rank0(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name in ("CORRAL_CONTROL", "CORRAL_CHECKPOINT_DIR", "CORRAL_HOST"):
        monkeypatch.delenv(name, raising=False)


def state(step: int) -> dict[str, object]:
    torch = require_torch()
    return {"step": step, "weights": torch.full((256,), float(step)), "note": f"s{step}"}


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_save_load_roundtrip(tmp_path: Path) -> None:
    torch = require_torch()
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    path = sdk.save_checkpoint(
        {"step": 7, "model": model.state_dict(), "optimizer": opt.state_dict()},
        tmp_path / "ck",
        7,
    )
    assert path == tmp_path / "ck" / "ckpt-00000007.pt"
    assert names(tmp_path / "ck") == ["ckpt-00000007.pt"]  # no temp left behind
    loaded = sdk.load_checkpoint(path)
    assert loaded["step"] == 7
    restored = torch.nn.Linear(3, 2)
    restored.load_state_dict(loaded["model"])
    assert torch.equal(restored.weight, model.weight)
    opt2 = torch.optim.SGD(restored.parameters(), lr=0.1, momentum=0.9)
    opt2.load_state_dict(loaded["optimizer"])
    assert sdk.latest_checkpoint(tmp_path / "ck") == path


def test_only_rank_zero_writes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert sdk.save_checkpoint(state(1), tmp_path, 1) is None
    assert names(tmp_path) == []


def test_all_ranks_files_carry_the_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        for step in (10, 20):
            sdk.save_checkpoint(state(step + rank), tmp_path, step, all_ranks=True)
    assert names(tmp_path) == [
        "ckpt-00000010-rank00000.pt",
        "ckpt-00000010-rank00001.pt",
        "ckpt-00000020-rank00000.pt",
        "ckpt-00000020-rank00001.pt",
    ]
    latest1 = sdk.latest_checkpoint(tmp_path, rank=1)
    assert latest1 is not None
    assert latest1.name == "ckpt-00000020-rank00001.pt"
    assert sdk.load_checkpoint(latest1)["step"] == 21
    assert sdk.latest_checkpoint(tmp_path) is None  # no rank-0-only checkpoints here


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for step in range(1, 7):
        sdk.save_checkpoint(state(step), tmp_path, step, keep=2)
    assert names(tmp_path) == ["ckpt-00000005.pt", "ckpt-00000006.pt"]
    for step in range(7, 10):
        sdk.save_checkpoint(state(step), tmp_path, step, keep=None)
    assert len(names(tmp_path)) == 5


def test_steps_sort_numerically(tmp_path: Path) -> None:
    for step in (9, 100_000_000, 10):  # the last has more than 8 digits
        sdk.save_checkpoint(state(step), tmp_path, step, keep=None)
    latest = sdk.latest_checkpoint(tmp_path)
    assert latest is not None
    assert latest.name == "ckpt-100000000.pt"


def test_prune_never_deletes_the_new_one_after_resuming_older(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        sdk.save_checkpoint(state(step), tmp_path, step)
    # Resumed from 10 (say 20 and 30 were judged bad elsewhere); saving 15 with keep=1
    # must keep 15 and leave the higher-step files to the user.
    sdk.save_checkpoint(state(15), tmp_path, 15, keep=1)
    assert names(tmp_path) == ["ckpt-00000015.pt", "ckpt-00000020.pt", "ckpt-00000030.pt"]


def test_leftover_temp_file_is_ignored_then_cleaned(tmp_path: Path) -> None:
    sdk.save_checkpoint(state(10), tmp_path, 10)
    good = tmp_path / "ckpt-00000010.pt"
    # A save of step 20 killed mid-write leaves its temp file (here: half of a real one).
    data = good.read_bytes()
    leftover = tmp_path / ".ckpt-00000020.pt.tmp-12345"
    leftover.write_bytes(data[: len(data) // 2])
    assert sdk.latest_checkpoint(tmp_path) == good
    sdk.save_checkpoint(state(30), tmp_path, 30)
    assert not leftover.exists()
    assert names(tmp_path) == ["ckpt-00000010.pt", "ckpt-00000030.pt"]


@pytest.mark.parametrize(
    "damage",
    ["truncate-tail", "truncate-half", "zero-tail", "empty", "garbage"],
)
def test_damaged_newest_checkpoint_falls_back(tmp_path: Path, damage: str) -> None:
    for step in (10, 20):
        sdk.save_checkpoint(state(step), tmp_path, step)
    newest = tmp_path / "ckpt-00000020.pt"
    data = newest.read_bytes()
    if damage == "truncate-tail":
        newest.write_bytes(data[:-1])
    elif damage == "truncate-half":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "zero-tail":  # right size, unwritten blocks (power loss without fsync)
        newest.write_bytes(data[:-4096] + bytes(4096))
    elif damage == "empty":
        newest.write_bytes(b"")
    else:
        newest.write_bytes(b"not a checkpoint" * 100)
    assert not sdk.is_complete_checkpoint(newest)
    latest = sdk.latest_checkpoint(tmp_path)
    assert latest == tmp_path / "ckpt-00000010.pt"
    assert sdk.load_checkpoint(latest)["step"] == 10


def test_latest_ignores_other_names_and_missing_dirs(tmp_path: Path) -> None:
    assert sdk.latest_checkpoint(tmp_path / "nope") is None
    assert sdk.latest_checkpoint(tmp_path) is None
    sdk.save_checkpoint(state(5), tmp_path, 5)
    for name in ("ckpt-00000099.pt.bak", "ckpt-latest.pt", "model-00000100.pt", "ckpt-9.pth"):
        (tmp_path / name).write_bytes((tmp_path / "ckpt-00000005.pt").read_bytes())
    (tmp_path / "ckpt-00000200.pt").mkdir()  # a directory with a checkpoint name
    assert sdk.latest_checkpoint(tmp_path) == tmp_path / "ckpt-00000005.pt"


def test_failed_save_leaves_previous_checkpoint_intact(tmp_path: Path) -> None:
    sdk.save_checkpoint(state(1), tmp_path, 1)
    with pytest.raises(UNPICKLABLE, match=r"Can't pickle local object"):
        sdk.save_checkpoint({"fn": lambda: 0}, tmp_path, 2)
    assert names(tmp_path) == ["ckpt-00000001.pt"]
    assert sdk.latest_checkpoint(tmp_path) == tmp_path / "ckpt-00000001.pt"


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="step"):
        sdk.save_checkpoint(state(0), tmp_path, -1)
    with pytest.raises(ValueError, match="keep"):
        sdk.save_checkpoint(state(0), tmp_path, 1, keep=0)


def test_load_rejects_non_dict(tmp_path: Path) -> None:
    path = tmp_path / "ckpt-00000001.pt"
    require_torch().save([1, 2, 3], path)
    with pytest.raises(TypeError, match="dict"):
        sdk.load_checkpoint(path)


def test_clear_error_without_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sdk.save_checkpoint(state(3), tmp_path, 3)
    four = state(4)
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(ImportError, match=r"pip install 'corral\[torch\]'"):
        sdk.save_checkpoint(four, tmp_path, 4)
    with pytest.raises(ImportError, match="corral"):
        sdk.load_checkpoint(tmp_path / "ckpt-00000003.pt")
    # Finding the latest checkpoint needs no torch (the coordinator can do it).
    assert sdk.latest_checkpoint(tmp_path) == tmp_path / "ckpt-00000003.pt"


# -- announcements to the supervisor ---------------------------------------------------


@pytest.fixture
def control(monkeypatch: pytest.MonkeyPatch) -> Iterator[ControlServer]:
    forget_earlier_reports(monkeypatch)  # an earlier test's unsent reports are not ours
    name = f"corral-test-{uuid.uuid4().hex}"
    server = ControlServer("\0" + name)
    monkeypatch.setenv("CORRAL_CONTROL", f"unix:@{name}")
    yield server
    forget_earlier_reports(monkeypatch)
    server.close()


def test_each_save_is_announced_on_the_control_socket(
    control: ControlServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    sdk.report(4, 10, loss=1.0)
    path = sdk.save_checkpoint(state(5), "ck", 5)
    sdk.report(5, 10)
    lines = control.wait_lines(4)
    assert len(control.connections) == 1  # the progress connection, shared
    assert lines[0] == "ctl 0\n"
    progress, announced, after = (json.loads(line) for line in lines[1:])
    # the report made before the save goes before its announcement
    assert progress["type"] == after["type"] == "reports"
    assert [r[0] for r in progress["reports"] + after["reports"]] == [4, 5]  # r[0]: step
    assert announced == {
        "type": "checkpoint",
        "step": 5,
        "path": str(tmp_path / "ck" / "ckpt-00000005.pt"),
        "rank": 0,
        "time": announced["time"],
    }
    assert path is not None and Path(announced["path"]) == path.resolve()


def test_only_rank_zero_saves_are_announced(
    control: ControlServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    sdk.save_checkpoint(state(1), tmp_path, 1)  # skipped on rank 1
    sdk.save_checkpoint(state(1), tmp_path, 1, all_ranks=True)  # a per-rank shard
    sdk.report(1)
    lines = control.wait_lines(2)
    assert [json.loads(line)["type"] for line in lines[1:]] == ["reports"]


def test_a_failed_save_is_not_announced(control: ControlServer, tmp_path: Path) -> None:
    with pytest.raises(UNPICKLABLE, match=r"Can't pickle local object"):
        sdk.save_checkpoint({"fn": lambda: 0}, tmp_path, 2)
    sdk.report(2)
    lines = control.wait_lines(2)
    assert [json.loads(line)["type"] for line in lines[1:]] == ["reports"]


# -- write errors ----------------------------------------------------------------------


def test_a_full_disk_raises_a_clear_error_and_keeps_the_previous(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CORRAL_HOST", "tb7")
    previous = sdk.save_checkpoint(state(10), tmp_path, 10)
    assert previous is not None
    before = previous.read_bytes()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_checkpoint.os, "fsync", full)
    with pytest.raises(sdk.CheckpointWriteError) as caught:
        sdk.save_checkpoint(state(20), tmp_path, 20)
    monkeypatch.undo()
    err = caught.value
    target = tmp_path / "ckpt-00000020.pt"
    assert str(err) == (
        f"cannot save checkpoint {target} on host tb7: no space left on device; "
        f"the previous checkpoint {previous} is intact"
    )
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert (err.host, err.path, err.cause) == ("tb7", str(target), "no space left on device")
    assert err.previous == str(previous)
    assert names(tmp_path) == ["ckpt-00000010.pt"]  # no temp file left
    assert previous.read_bytes() == before
    assert sdk.latest_checkpoint(tmp_path) == previous


def test_a_write_error_without_an_earlier_checkpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(sdk.CheckpointWriteError) as caught:
        sdk.save_checkpoint(state(1), blocker / "ck", 1)
    message = str(caught.value)
    assert f"cannot save checkpoint {blocker / 'ck' / 'ckpt-00000001.pt'} on host " in message
    assert f"no earlier checkpoint in {blocker / 'ck'}" in message


def test_the_write_error_pickles() -> None:
    import pickle

    err = sdk.CheckpointWriteError(
        "cannot save", host="h", path="/p", cause="no space left on device", code=errno.ENOSPC
    )
    copy = pickle.loads(pickle.dumps(err))
    assert (str(copy), copy.host, copy.path, copy.errno) == ("cannot save", "h", "/p", errno.ENOSPC)


# -- resume ----------------------------------------------------------------------------


def test_resume_loads_the_latest_complete_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sdk.resume(tmp_path) is None
    assert capsys.readouterr().out == ""
    for step in (10, 20, 30):
        sdk.save_checkpoint(state(step), tmp_path, step, keep=None)
    newest = tmp_path / "ckpt-00000030.pt"
    newest.write_bytes(newest.read_bytes()[:-10])  # damaged: 20 is the latest complete one
    loaded = sdk.resume(tmp_path)
    assert loaded is not None and loaded["step"] == 20
    torch = require_torch()
    assert torch.equal(loaded["weights"], torch.full((256,), 20.0))
    assert capsys.readouterr().out == (
        f"[corral] resuming from {tmp_path / 'ckpt-00000020.pt'} (step 20)\n"
    )


def test_resume_defaults_to_the_checkpoint_dir_of_the_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="--checkpoint-dir"):
        sdk.resume()
    sdk.save_checkpoint({"epoch": 3}, tmp_path, 3)
    monkeypatch.setenv("CORRAL_CHECKPOINT_DIR", str(tmp_path))
    assert sdk.resume() == {"epoch": 3}
    assert capsys.readouterr().out == ""  # no "step" key: nothing to say


def test_resume_prints_only_on_rank_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sdk.save_checkpoint(state(4), tmp_path, 4)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    loaded = sdk.resume(tmp_path)  # no process group: this rank reads its own directory
    assert loaded is not None and loaded["step"] == 4
    assert capsys.readouterr().out == ""


class FakeGroup:
    """A process group of ``len(others) + 1`` ranks: ``others`` are what the other
    ranks report to ``all_gather_object``; only that collective exists (no broadcast)."""

    def __init__(self, rank: int, others: dict[int, object]) -> None:
        self.rank = rank
        self.others = others
        self.gathered: list[object] = []

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return len(self.others) + 1

    def all_gather_object(self, out: list[object], obj: object) -> None:
        self.gathered.append(obj)
        for i in range(len(out)):
            out[i] = obj if i == self.rank else self.others[i]


def test_resume_in_a_group_loads_the_agreed_checkpoint_from_this_hosts_disk(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from corral.sdk import _resume

    for step in (20, 30):
        sdk.save_checkpoint(state(step), tmp_path, step, keep=None)
    group = FakeGroup(1, {0: (30, "h0", "/elsewhere/ck")})
    monkeypatch.setattr(_resume, "_group", lambda: group)
    monkeypatch.setenv("CORRAL_HOST", "h1")
    loaded = sdk.resume(tmp_path)
    assert loaded is not None and loaded["step"] == 30
    assert group.gathered == [(30, "h1", str(tmp_path))]  # only the small fact travels
    assert capsys.readouterr().out == ""  # rank 1 says nothing


def test_resume_in_a_group_fails_when_this_host_lacks_the_newest(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from corral.sdk import _resume

    sdk.save_checkpoint(state(30), tmp_path, 30)
    group = FakeGroup(1, {0: (40, "h0", "/elsewhere/ck"), 2: (40, "h2", "/x/ck")})
    monkeypatch.setattr(_resume, "_group", lambda: group)
    monkeypatch.setenv("CORRAL_HOST", "h1")
    with pytest.raises(FileNotFoundError) as caught:
        sdk.resume(tmp_path)
    assert str(caught.value).startswith(
        "cannot resume from step 40 (ckpt-00000040.pt, found on h0, h2): rank 1 on host h1 "
        f"has no complete {tmp_path / 'ckpt-00000040.pt'} (corral places"
    )
