"""Host-local checkpoints over LocalTransport: two directories pose as two hosts.

Surveys, copies between hosts (and from / into the coordinator replica), the
replica's pulls (keep 2, coalescing, failed pulls leave nothing), a real full
disk (a tiny tmpfs, as root) and ``sdk.resume`` across two gloo ranks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import os
import signal
import socket
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from corral.cluster.model import Host
from corral.recovery.checkpoints import (
    HOSTSIDE,
    REPLICA_SOURCE,
    CheckpointTransferError,
    PullResult,
    Replica,
    copy_checkpoint,
    ensure_latest_on,
    survey,
)
from corral.sdk import is_complete_checkpoint
from corral.transport.base import NodeProcess
from corral.transport.local import LocalTransport
from tests.conftest import missing_dependency, require_torch

T = TypeVar("T")

N1 = Host("n1", local=True)
N2 = Host("n2", local=True)
N3 = Host("n3", local=True)
NO_PYTHON = Host("gone", local=True, python="/nonexistent/python3")


def arun(body: Callable[[LocalTransport], Awaitable[T]]) -> T:
    async def main() -> T:
        transport = LocalTransport()
        try:
            return await body(transport)
        finally:
            await transport.close()

    return asyncio.run(main())


def checkpoint_bytes(payload: int, seed: int = 0) -> bytes:
    """Shaped like a ``torch.save`` file (a stored zip with ``data.pkl``); no torch needed."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", b"pickle" * 10)
        archive.writestr("archive/data/0", os.urandom(64) * (payload // 64) + bytes([seed]))
    return buf.getvalue()


class Layout:
    """One working directory per host under ``root``; the checkpoint dir is ``ck`` in it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def cwd_of(self, host: Host) -> str:
        return str(self.root / host.name)

    def ck(self, host: Host) -> Path:
        return self.root / host.name / "ck"

    def put(self, host: Host, step: int, data: bytes) -> Path:
        folder = self.ck(host)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"ckpt-{step:08d}.pt"
        path.write_bytes(data)
        return path

    def names(self, host: Host) -> list[str]:
        folder = self.ck(host)
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path / "hosts")


def test_survey_lists_each_host_and_reports_unreachable_ones(layout: Layout) -> None:
    good = checkpoint_bytes(10_000)
    layout.put(N1, 20, good)
    layout.put(N1, 40, good)
    layout.put(N1, 60, good[:-500])  # truncated
    (layout.ck(N1) / ".ckpt-00000080.pt.tmp-123").write_bytes(good[:100])
    listed = arun(lambda t: survey(t, [N1, N2, NO_PYTHON], "ck", layout.cwd_of))
    assert list(listed) == ["n1", "n2", "gone"]
    n1 = listed["n1"]
    assert n1.ok and n1.exists and n1.directory == str(layout.ck(N1))
    assert [(f.name, f.complete) for f in n1.files] == [
        ("ckpt-00000020.pt", True),
        ("ckpt-00000040.pt", True),
        ("ckpt-00000060.pt", False),
    ]
    assert n1.latest is not None and n1.latest.step == 40
    assert listed["n2"].ok and not listed["n2"].exists and listed["n2"].latest is None
    assert listed["n2"].free is not None and listed["n2"].free > 0
    gone = listed["gone"]
    assert not gone.ok and gone.error is not None and "no python interpreter" in gone.error


def test_the_newest_complete_checkpoint_is_copied_to_the_new_rank0_host(layout: Layout) -> None:
    data20, data40 = checkpoint_bytes(50_000, 1), checkpoint_bytes(3_000_000, 2)
    layout.put(N1, 20, data20)
    layout.put(N1, 40, data40)
    layout.put(N1, 60, data40[: len(data40) // 2])  # being written when the failure hit
    (layout.ck(N1) / ".ckpt-00000070.pt.tmp-99").write_bytes(data40)
    layout.put(N3, 20, data20)

    placement = arun(lambda t: ensure_latest_on(t, N2, [N1, N3], "ck", layout.cwd_of))
    assert placement.action == "copied"
    assert (placement.step, placement.name, placement.source, placement.target) == (
        40,
        "ckpt-00000040.pt",
        "n1",
        "n2",
    )
    copied = layout.ck(N2) / "ckpt-00000040.pt"
    assert placement.path == str(copied) and placement.bytes == len(data40)
    assert copied.read_bytes() == data40 and is_complete_checkpoint(copied)
    assert layout.names(N2) == ["ckpt-00000040.pt"]  # nothing else, no temp file
    assert "copied checkpoint ckpt-00000040.pt (step 40" in placement.describe()
    assert placement.to_dict()["source"] == "n1"

    again = arun(lambda t: ensure_latest_on(t, N2, [N1, N3], "ck", layout.cwd_of))
    assert (again.action, again.step, again.source) == ("present", 40, "n2")
    assert "already on n2" in again.describe()


def test_nothing_anywhere_means_start_from_scratch(layout: Layout, tmp_path: Path) -> None:
    replica = Replica(tmp_path / "replica")
    placement = arun(
        lambda t: ensure_latest_on(t, N2, [N1, NO_PYTHON], "ck", layout.cwd_of, replica)
    )
    assert placement.action == "none" and placement.step is None
    assert [u.split(":")[0] for u in placement.unreachable] == ["gone"]
    assert "starting from scratch" in placement.describe()


def test_hosts_sharing_a_directory_already_have_it(layout: Layout) -> None:
    layout.put(N1, 40, checkpoint_bytes(10_000))
    placement = arun(lambda t: ensure_latest_on(t, N2, [N1], "ck", lambda host: layout.cwd_of(N1)))
    assert placement.action == "present" and placement.step == 40
    assert placement.path == str(layout.ck(N1) / "ckpt-00000040.pt")


def test_an_unreachable_target_is_an_error(layout: Layout) -> None:
    layout.put(N1, 40, checkpoint_bytes(10_000))
    with pytest.raises(CheckpointTransferError) as caught:
        arun(lambda t: ensure_latest_on(t, NO_PYTHON, [N1], "ck", layout.cwd_of))
    assert caught.value.host == "gone"


def test_a_copy_is_teed_into_the_replica_and_the_replica_is_a_source(
    layout: Layout, tmp_path: Path
) -> None:
    data = checkpoint_bytes(2_500_000, 3)
    layout.put(N1, 40, data)
    replica = Replica(tmp_path / "replica")
    result = arun(
        lambda t: copy_checkpoint(
            t,
            N1,
            N2,
            directory="ck",
            target_cwd=layout.cwd_of(N2),
            source_path=str(layout.ck(N1) / "ckpt-00000040.pt"),
            replica=replica,
        )
    )
    assert (result.step, result.size, result.source, result.target) == (40, len(data), "n1", "n2")
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    assert result.replicated == replica.directory / "ckpt-00000040.pt"
    assert replica.latest() == result.replicated and result.replicated.read_bytes() == data

    # n1 is lost (the only other host is unreachable too); n3 becomes rank 0:
    # the replica is the only source left
    placement = arun(
        lambda t: ensure_latest_on(
            t,
            N3,
            [N2.__class__("n2-lost", local=True, python="/nonexistent/python3")],
            "ck",
            layout.cwd_of,
            replica,
        )
    )
    assert (placement.action, placement.source, placement.step) == ("copied", REPLICA_SOURCE, 40)
    assert (layout.ck(N3) / "ckpt-00000040.pt").read_bytes() == data


def test_a_newer_checkpoint_in_the_replica_wins(layout: Layout, tmp_path: Path) -> None:
    layout.put(N1, 20, checkpoint_bytes(10_000))
    replica = Replica(tmp_path / "replica")
    newer = checkpoint_bytes(20_000, 9)
    replica.directory.mkdir()
    (replica.directory / "ckpt-00000040.pt").write_bytes(newer)
    placement = arun(lambda t: ensure_latest_on(t, N1, [N1, N2], "ck", layout.cwd_of, replica))
    assert (placement.action, placement.source, placement.step) == ("copied", REPLICA_SOURCE, 40)
    assert layout.names(N1) == ["ckpt-00000020.pt", "ckpt-00000040.pt"]


def _pull_all(
    replica: Replica, steps: Sequence[int], layout: Layout
) -> Callable[[LocalTransport], Awaitable[list[PullResult]]]:
    async def body(transport: LocalTransport) -> list[PullResult]:
        return [
            await replica.pull(transport, N1, str(layout.ck(N1) / f"ckpt-{s:08d}.pt"))
            for s in steps
        ]

    return body


def test_replica_keeps_the_newest_two(layout: Layout, tmp_path: Path) -> None:
    for step in (10, 20, 30):
        layout.put(N1, step, checkpoint_bytes(10_000, step))
    seen: list[PullResult] = []
    replica = Replica.for_job(tmp_path / "runs", "job1", on_result=seen.append)
    assert replica.directory == tmp_path / "runs" / "job1" / "checkpoints"
    results = arun(_pull_all(replica, [10, 20, 30, 20], layout))
    assert [r.status for r in results] == ["pulled", "pulled", "pulled", "skipped"]
    assert [r.status for r in seen] == ["pulled", "pulled", "pulled"]
    assert [p.name for p in replica.checkpoints()] == ["ckpt-00000020.pt", "ckpt-00000030.pt"]
    assert sorted(p.name for p in replica.directory.iterdir()) == [
        "ckpt-00000020.pt",
        "ckpt-00000030.pt",
    ]
    assert (replica.directory / "ckpt-00000030.pt").read_bytes() == (
        layout.ck(N1) / "ckpt-00000030.pt"
    ).read_bytes()


class CountingTransport(LocalTransport):
    """Remembers every sender (``hostside.serve``) it started."""

    def __init__(self) -> None:
        super().__init__()
        self.senders: list[NodeProcess] = []

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Any:
        proc = await super().start(host, argv, env=env, cwd=cwd)
        if f"{HOSTSIDE}:serve" in argv:
            self.senders.append(proc)
        return proc


def test_one_sender_per_host_serves_every_pull_and_a_dead_one_is_replaced(
    layout: Layout, tmp_path: Path
) -> None:
    for step in (10, 20, 30, 40):
        layout.put(N1, step, checkpoint_bytes(200_000, step))
    replica = Replica(tmp_path / "replica")

    async def body() -> tuple[list[str], list[str], int, list[int]]:
        transport = CountingTransport()
        try:
            replica.warm(transport, N1)  # started before the first save is announced
            replica.warm(transport, N1)  # once
            first = [
                (await replica.pull(transport, N1, str(layout.ck(N1) / n))).status
                for n in ("ckpt-00000010.pt", "ckpt-00000020.pt")
            ]
            missing = await replica.pull(transport, N1, str(layout.ck(N1) / "ckpt-00000025.pt"))
            assert missing.status == "failed" and "cannot read" in (missing.error or "")
            started = len(transport.senders)
            transport.senders[0].signal(signal.SIGKILL)  # e.g. its connection was reset
            await transport.senders[0].wait()
            later = [
                (await replica.pull(transport, N1, str(layout.ck(N1) / n))).status
                for n in ("ckpt-00000030.pt", "ckpt-00000040.pt")
            ]
            codes = []
            await replica.close()
            for proc in transport.senders:
                codes.append(await asyncio.wait_for(proc.wait(), 10))
            return first, later, started, codes
        finally:
            await transport.close()

    first, later, started, codes = asyncio.run(body())
    assert first == ["pulled", "pulled"] and later == ["pulled", "pulled"]
    assert started == 1  # both pulls and the unreadable file: one sender
    assert codes == [-signal.SIGKILL, 0]  # replaced once; the second ended at close
    assert [p.name for p in replica.checkpoints()] == ["ckpt-00000030.pt", "ckpt-00000040.pt"]
    assert (replica.directory / "ckpt-00000040.pt").read_bytes() == (
        layout.ck(N1) / "ckpt-00000040.pt"
    ).read_bytes()


def test_concurrent_announcements_coalesce_to_the_newest(layout: Layout, tmp_path: Path) -> None:
    for step in (10, 20, 30):
        layout.put(N1, step, checkpoint_bytes(2_000_000, step))
    seen: list[PullResult] = []
    replica = Replica(tmp_path / "replica", on_result=seen.append)

    def path(step: int) -> str:
        return str(layout.ck(N1) / f"ckpt-{step:08d}.pt")

    async def body(transport: LocalTransport) -> list[PullResult]:
        first = asyncio.create_task(replica.pull(transport, N1, path(10)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not replica.busy:  # until the first pull has started
            assert not first.done(), f"the first pull ended before it was seen busy: {first}"
            assert loop.time() < deadline, "the first pull did not start within 30 s"
            await asyncio.sleep(0)
        queued = [
            await replica.pull(transport, N1, path(20)),
            await replica.pull(transport, N1, path(30)),
            await replica.pull(transport, N1, path(30)),  # already on its way
            await replica.pull(transport, N1, path(10)),  # being pulled
        ]
        last = await first
        await replica.wait_idle()
        return [*queued, last]

    results = arun(body)
    assert [r.status for r in results] == ["queued", "queued", "skipped", "skipped", "pulled"]
    assert results[-1].step == 30  # the first call went on with the newest queued one
    assert [(r.status, r.step) for r in seen] == [("pulled", 10), ("pulled", 30)]  # never 20
    assert [p.name for p in replica.checkpoints()] == ["ckpt-00000010.pt", "ckpt-00000030.pt"]


class CutSendTransport(LocalTransport):
    """A LocalTransport whose ``send`` streams break after ``limit`` bytes, as when the
    host is lost mid-copy (the process is killed and its output ends)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.cut = 0
        self._relays: list[asyncio.Task[None]] = []

    async def start(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> Any:
        proc = await super().start(host, argv, env=env, cwd=cwd)
        if f"{HOSTSIDE}:send" in argv or f"{HOSTSIDE}:serve" in argv:  # a source, a sender
            original, proc.stdout = proc.stdout, asyncio.StreamReader()
            self._relays.append(asyncio.ensure_future(self._relay(proc, original, proc.stdout)))
        return proc

    async def _relay(
        self, proc: NodeProcess, original: asyncio.StreamReader, cut: asyncio.StreamReader
    ) -> None:
        passed = 0
        while chunk := await original.read(65536):
            piece = chunk[: self.limit - passed]
            cut.feed_data(piece)
            passed += len(piece)
            if passed >= self.limit:
                proc.signal(signal.SIGKILL)
                self.cut += 1
                break
        cut.feed_eof()


def test_a_host_lost_mid_copy_leaves_no_partial_file(layout: Layout, tmp_path: Path) -> None:
    data = checkpoint_bytes(4_000_000, 4)
    source = layout.put(N1, 40, data)
    seen: list[PullResult] = []
    replica = Replica(tmp_path / "replica", on_result=seen.append)

    async def body() -> tuple[PullResult, CheckpointTransferError | None, int]:
        transport = CutSendTransport(limit=1_500_000)
        try:
            pulled = await replica.pull(transport, N1, str(source))
            try:
                await copy_checkpoint(
                    transport,
                    N1,
                    N2,
                    directory="ck",
                    target_cwd=layout.cwd_of(N2),
                    source_path=str(source),
                    replica=replica,
                )
            except CheckpointTransferError as exc:
                return pulled, exc, transport.cut
            return pulled, None, transport.cut
        finally:
            await transport.close()

    pulled, error, cut = asyncio.run(body())
    assert cut == 2
    assert pulled.status == "failed" and pulled.error is not None and "n1" in pulled.error
    assert seen == [pulled]
    assert list(replica.directory.iterdir()) == []  # no partial file, no temp
    assert error is not None and error.host == "n1"
    assert "broke after" in str(error)
    assert layout.names(N2) == []  # the target removed its temp file
    assert layout.names(N1) == ["ckpt-00000040.pt"]
    # the checkpoint is announced again later (or the next one is): the pull now works
    again = arun(lambda t: replica.pull(t, N1, str(source)))
    assert again.status == "pulled" and replica.latest() == replica.directory / source.name


def test_a_failed_host_copy_falls_back_to_the_replica(layout: Layout, tmp_path: Path) -> None:
    data = checkpoint_bytes(4_000_000, 5)
    source = layout.put(N1, 40, data)
    replica = Replica(tmp_path / "replica")
    assert arun(lambda t: replica.pull(t, N1, str(source))).status == "pulled"

    async def body() -> Any:
        transport = CutSendTransport(limit=1_000_000)
        try:
            return await ensure_latest_on(transport, N2, [N1], "ck", layout.cwd_of, replica)
        finally:
            await transport.close()

    placement = asyncio.run(body())
    assert (placement.action, placement.source) == ("copied", REPLICA_SOURCE)
    assert len(placement.failed) == 1 and placement.failed[0].startswith("n1: ")
    assert (layout.ck(N2) / "ckpt-00000040.pt").read_bytes() == data


# -- a real full disk ------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (needs root)."""
    if os.geteuid() != 0:
        missing_dependency("mounting a tmpfs needs root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.torch
def test_a_save_on_a_full_disk_names_host_and_path_and_keeps_the_previous(
    tiny_disk: Path,
) -> None:
    require_torch()
    script = textwrap.dedent(
        """
        import sys, torch
        from corral import sdk
        folder = sys.argv[1]
        sdk.save_checkpoint({"step": 1, "w": torch.zeros(50_000)}, folder, 1)  # 200 kB: fits
        try:
            sdk.save_checkpoint({"step": 2, "w": torch.zeros(500_000)}, folder, 2)  # 2 MB
        except sdk.CheckpointWriteError as exc:
            print(exc)
            sys.exit(3)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "RANK"))}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tiny_disk / "ck")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 3, proc.stderr
    previous = tiny_disk / "ck" / "ckpt-00000001.pt"
    assert proc.stdout.strip() == (
        f"cannot save checkpoint {tiny_disk / 'ck' / 'ckpt-00000002.pt'} on host "
        f"{socket.gethostname()}: no space left on device; "
        f"the previous checkpoint {previous} is intact"
    )
    assert sorted(p.name for p in (tiny_disk / "ck").iterdir()) == ["ckpt-00000001.pt"]
    assert is_complete_checkpoint(previous)


def test_copying_to_a_full_disk_names_host_and_path(layout: Layout, tiny_disk: Path) -> None:
    layout.put(N1, 40, checkpoint_bytes(3_000_000))
    (tiny_disk / "ck").mkdir()
    kept = tiny_disk / "ck" / "ckpt-00000020.pt"
    kept.write_bytes(checkpoint_bytes(100_000))

    def cwd_of(host: Host) -> str:
        return str(tiny_disk) if host.name == "n2" else layout.cwd_of(host)

    with pytest.raises(CheckpointTransferError) as caught:
        arun(lambda t: ensure_latest_on(t, N2, [N1], "ck", cwd_of))
    err = caught.value
    assert err.host == "n2" and err.errno_name == "ENOSPC"
    assert f"cannot write {tiny_disk / 'ck' / 'ckpt-00000040.pt'}: no space left" in str(err)
    with pytest.raises(CheckpointTransferError) as direct:  # no pre-check: the host finds out
        arun(
            lambda t: copy_checkpoint(
                t,
                N1,
                N2,
                directory="ck",
                target_cwd=str(tiny_disk),
                source_path=str(layout.ck(N1) / "ckpt-00000040.pt"),
            )
        )
    assert direct.value.host == "n2" and direct.value.errno_name == "ENOSPC"
    assert "no space left on device" in str(direct.value)
    assert sorted(p.name for p in (tiny_disk / "ck").iterdir()) == ["ckpt-00000020.pt"]


# -- resume across ranks ---------------------------------------------------------------


def _two_ranks(tmp_path: Path, script: str) -> list[subprocess.CompletedProcess[str]]:
    """Run ``script`` as ranks 0 and 1 of a gloo group; rank R's argv[1] is ``tmp_path/rR``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        env.update(
            RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            GLOO_SOCKET_IFNAME="lo",
            CORRAL_HOST=f"host{rank}",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", script, str(tmp_path / f"r{rank}")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    done = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


RESUME = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist
    from corral import sdk
    dist.init_process_group("gloo", init_method="env://")
    try:
        state = sdk.resume(sys.argv[1])
    except FileNotFoundError as exc:
        print("error", exc, flush=True)
        # leave like corral's rank wrapper does: torch's C++ static destructors may
        # abort a plain exit while a gloo group was alive
        os._exit(3)
    print("got", dist.get_rank(), state["step"], state["w"].tolist(), flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.torch
def test_resume_loads_the_same_checkpoint_on_every_rank_from_its_own_disk(
    tmp_path: Path,
) -> None:
    torch = require_torch()
    (tmp_path / "r0").mkdir()
    (tmp_path / "r1").mkdir()
    torch.save({"step": 40, "w": torch.arange(5.0)}, tmp_path / "r0" / "ckpt-00000040.pt")
    torch.save({"step": 20, "w": torch.zeros(2)}, tmp_path / "r1" / "ckpt-00000020.pt")
    # rank 1's own copy of step 40 (marked, to show it is read from rank 1's disk)
    torch.save({"step": 40, "w": torch.arange(5.0) + 1}, tmp_path / "r1" / "ckpt-00000040.pt")
    ranks = _two_ranks(tmp_path, RESUME)
    assert [r.returncode for r in ranks] == [0, 0], [r.stderr for r in ranks]
    assert ranks[0].stdout.splitlines() == [
        f"[corral] resuming from {tmp_path / 'r0' / 'ckpt-00000040.pt'} (step 40)",
        "got 0 40 [0.0, 1.0, 2.0, 3.0, 4.0]",
    ]
    assert ranks[1].stdout.splitlines() == ["got 1 40 [1.0, 2.0, 3.0, 4.0, 5.0]"]


@pytest.mark.torch
def test_resume_fails_on_every_rank_naming_the_host_that_lacks_the_newest(
    tmp_path: Path,
) -> None:
    """Rank 0's host lacks the newest checkpoint that rank 1's host has: no rank
    silently starts from an older step (nor from scratch)."""
    torch = require_torch()
    (tmp_path / "r0").mkdir()
    (tmp_path / "r1").mkdir()
    torch.save({"step": 20, "w": torch.zeros(2)}, tmp_path / "r0" / "ckpt-00000020.pt")
    torch.save({"step": 40, "w": torch.zeros(2)}, tmp_path / "r1" / "ckpt-00000040.pt")
    ranks = _two_ranks(tmp_path, RESUME)
    assert [r.returncode for r in ranks] == [3, 3], [r.stderr for r in ranks]
    expected = (
        "error cannot resume from step 40 (ckpt-00000040.pt, found on host1): rank 0 on "
        f"host host0 has no complete {tmp_path / 'r0' / 'ckpt-00000040.pt'} (corral places"
    )
    assert ranks[0].stdout.startswith(expected)
    assert ranks[0].stdout == ranks[1].stdout
