"""Placement puts the newest complete checkpoint on every host of the next attempt,
so whichever host the rendezvous makes rank 0 resumes from it (no prediction).

LocalTransport with one directory per host poses as hosts with private disks."""

from __future__ import annotations

import asyncio
import io
import os
import zipfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from corral.cluster.model import Host
from corral.plan.spec import JobSpec, NodeCommand
from corral.recovery.checkpoints import (
    HOSTSIDE,
    CheckpointTransferError,
    place_latest,
)
from corral.recovery.keeper import CheckpointKeeper
from corral.transport.local import LocalTransport

T = TypeVar("T")
NAME = "ckpt-00000040.pt"


def checkpoint_bytes(payload: int, seed: int = 0) -> bytes:
    """Shaped like a ``torch.save`` file (a stored zip with ``data.pkl``); no torch needed."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", b"pickle" * 10)
        archive.writestr("archive/data/0", bytes([seed]) * payload)
    return buf.getvalue()


class CountingTransport(LocalTransport):
    """Counts the host-side programs started, by call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Any:
        self.calls += [a.rpartition(":")[2] for a in argv if a.startswith(f"{HOSTSIDE}:")]
        return await super().start(host, argv, env=env, cwd=cwd)


def arun(body: Callable[[CountingTransport], Awaitable[T]]) -> tuple[T, list[str]]:
    async def main() -> tuple[T, list[str]]:
        transport = CountingTransport()
        try:
            return await body(transport), transport.calls
        finally:
            await transport.close()

    return asyncio.run(main())


# torchrun's old guess for rank 0 was the smallest address *as a string*: "10.0.0.10"
# (c) sorts before "10.0.0.9" (b); the checkpoint is on a, the rendezvous may pick any.
A = Host("a", address="10.0.0.2", local=True)
B = Host("b", address="10.0.0.9", local=True)
C = Host("c", address="10.0.0.10", local=True)


def ck(root: Path, host: Host) -> Path:
    return root / host.name / "ck"


def put(root: Path, host: Host, step: int, data: bytes) -> Path:
    folder = ck(root, host)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"ckpt-{step:08d}.pt"
    path.write_bytes(data)
    return path


def names(root: Path, host: Host) -> list[str]:
    folder = ck(root, host)
    return sorted(os.listdir(folder)) if folder.exists() else []


def test_every_host_gets_the_newest_checkpoint_read_once(tmp_path: Path) -> None:
    data = checkpoint_bytes(3_000_000, 4)
    put(tmp_path, A, 20, checkpoint_bytes(1000))
    put(tmp_path, A, 40, data)
    put(tmp_path, C, 20, checkpoint_bytes(1000))

    placed, calls = arun(
        lambda t: place_latest(t, [C, B, A], "ck", lambda h: str(tmp_path / h.name))
    )
    assert (placed.action, placed.step, placed.name) == ("copied", 40, NAME)
    for host in (A, B, C):
        assert (ck(tmp_path, host) / NAME).read_bytes() == data, host.name
    assert names(tmp_path, B) == [NAME]  # no temp file left
    assert [(p.target, p.action, p.source) for p in placed.hosts] == [
        ("c", "copied", "a"),
        ("b", "copied", "a"),
        ("a", "present", "a"),
    ]
    assert calls.count("send") == 1 and calls.count("receive") == 2  # read once, two targets
    assert placed.describe() == (
        f"checkpoint {NAME} (step 40): already on a; copied from a to c, b "
        f"({len(data) / 1e6:.1f} MB, {placed.on('c').seconds:.1f} s)"
    )

    again, calls = arun(
        lambda t: place_latest(t, [A, B, C], "ck", lambda h: str(tmp_path / h.name))
    )
    assert again.action == "present" and "receive" not in calls
    assert again.describe() == f"checkpoint {NAME} (step 40): already on a, b, c"


def test_hosts_sharing_a_directory_find_it_there(tmp_path: Path) -> None:
    put(tmp_path, A, 40, checkpoint_bytes(10_000))

    def cwd_of(host: Host) -> str:  # a and b share a filesystem, c does not
        return str(tmp_path / ("c" if host.name == "c" else "a"))

    placed, calls = arun(lambda t: place_latest(t, [B, C, A], "ck", cwd_of))
    assert [(p.target, p.action) for p in placed.hosts] == [
        ("b", "present"),
        ("c", "copied"),
        ("a", "present"),
    ]
    assert calls.count("receive") == 1
    assert names(tmp_path, C) == [NAME]


def test_nothing_anywhere_starts_from_scratch(tmp_path: Path) -> None:
    placed, _ = arun(lambda t: place_latest(t, [A, B], "ck", lambda h: str(tmp_path / h.name)))
    assert (placed.action, placed.step, placed.unreachable) == ("none", None, ())
    assert [p.action for p in placed.hosts] == ["none", "none"]
    assert "starting from scratch" in placed.describe()


def test_a_host_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    put(tmp_path, A, 40, checkpoint_bytes(10_000))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "ck").write_text("a file where the directory should be")
    with pytest.raises(CheckpointTransferError) as caught:
        arun(lambda t: place_latest(t, [A, B, C], "ck", lambda h: str(tmp_path / h.name)))
    err = caught.value
    assert err.host == "b"
    assert str(err).startswith(f"b: could not copy checkpoint {NAME} (step 40) to b: a: ")
    assert (ck(tmp_path, C) / NAME).exists()  # the other host got it all the same


def test_a_host_that_cannot_be_listed_is_named(tmp_path: Path) -> None:
    put(tmp_path, A, 40, checkpoint_bytes(10_000))
    gone = Host("gone", local=True, python="/nonexistent/python3")
    with pytest.raises(CheckpointTransferError) as caught:
        arun(lambda t: place_latest(t, [A, gone], "ck", lambda h: str(tmp_path / h.name)))
    assert caught.value.host == "gone"
    assert "no python interpreter found" in str(caught.value)


def _commands(spec: JobSpec, hosts: Sequence[Host]) -> list[NodeCommand]:
    return [
        NodeCommand(host=h, node_rank=i, argv=("true",), env={}, cwd="/", nproc=1)
        for i, h in enumerate(hosts)
    ]


@pytest.mark.parametrize("launcher", ["torchrun", "python"])
def test_the_keeper_places_on_every_host_whatever_the_launcher(
    tmp_path: Path, launcher: Any
) -> None:
    spec = JobSpec(
        script="train.py",
        launcher=launcher,
        job_id="j1",
        run_dir=str(tmp_path),
        checkpoint_dir="ck",
    )
    work = {h.name: tmp_path / "j1" / "nodes" / h.name / "work" for h in (A, B, C)}
    data = checkpoint_bytes(50_000, 7)
    (work["b"] / "ck").mkdir(parents=True)
    (work["b"] / "ck" / NAME).write_bytes(data)  # written by b: neither node 0 nor "min address"
    said: list[tuple[str, str]] = []  # (text, level)

    async def body(transport: CountingTransport) -> str | None:
        keeper = CheckpointKeeper.create(
            transport,
            directory="ck",
            replicate=False,
            is_local=False,
            python=None,
            run_dir=str(tmp_path),
            job_id="j1",
            say=lambda text, level: said.append((text, level)),
        )
        try:
            return await keeper.place(spec, _commands(spec, [A, C, B]))
        finally:
            await keeper.close()

    text, _ = arun(body)
    for name, folder in work.items():
        assert (folder / "ck" / NAME).read_bytes() == data, name
    assert text is not None and text.startswith(
        f"checkpoint {NAME} (step 40): already on b; copied from b to a, c"
    )
    assert said == [(text, "info")]


def test_an_inactive_keeper_places_nothing(tmp_path: Path) -> None:
    spec = JobSpec(script="train.py", job_id="j1", run_dir=str(tmp_path), checkpoint_dir="ck")

    async def body(transport: CountingTransport) -> str | None:
        keeper = CheckpointKeeper.create(
            transport,
            directory="ck",
            replicate=True,
            is_local=True,
            python=None,
            run_dir=str(tmp_path),
            job_id="j1",
            say=lambda text, level: None,
        )
        assert keeper.replica is None
        return await keeper.place(spec, _commands(spec, [A]))

    text, calls = arun(body)
    assert text is None and calls == []
