"""Host-local checkpoints on the netns testbed: each host's /srv/corral is private, so a
checkpoint directory under it exists on one host only (real sshd, real SshTransport)."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from corral.cluster import Host, load_cluster
from corral.recovery.checkpoints import (
    REPLICA_SOURCE,
    CheckpointTransferError,
    Replica,
    ensure_latest_on,
    place_latest,
)
from corral.sdk import is_complete_checkpoint
from corral.testbed import Testbed
from corral.transport.options import SshOptions
from corral.transport.ssh import SshTransport
from tests.conftest import require_torch

pytestmark = [pytest.mark.netns, pytest.mark.torch]

T = TypeVar("T")
HOSTS = ("tb1", "tb2", "tb3")


def with_transport(tb: Testbed, body: Callable[[SshTransport], Awaitable[T]]) -> T:
    """Run ``body`` with a fresh SshTransport (new connections: a stopped sshd is noticed)."""

    async def main() -> T:
        transport = SshTransport(SshOptions(config=str(tb.ssh_config)))
        try:
            return await body(transport)
        finally:
            await transport.close()

    return asyncio.run(main())


def hosts(tb: Testbed) -> dict[str, Host]:
    return {h.name: h for h in load_cluster(str(tb.hostfile)).hosts}


class HostDirs:
    """``/srv/corral/ckpt-XXXX/ck`` on every host, seen from here through each host's
    private ``/srv`` (``Testbed.host_path``)."""

    def __init__(self, tb: Testbed) -> None:
        self.tb = tb
        self.base = f"/srv/corral/ckpt-{uuid.uuid4().hex[:8]}"
        self.directory = f"{self.base}/ck"

    def local(self, host: str) -> Path:
        """Where ``host``'s checkpoint directory is on this machine."""
        return self.tb.host_path(host, self.directory)

    def names(self, host: str) -> list[str]:
        folder = self.local(host)
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []

    def save(self, host: str, step: int) -> Path:
        folder = self.local(host)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"ckpt-{step:08d}.pt"
        torch = require_torch()
        torch.save({"step": step, "w": torch.full((300_000,), float(step))}, path)
        return path

    def cleanup(self) -> None:
        for host in HOSTS:
            self.tb.run_on(host, ["sh", "-c", f"umount {self.directory} 2>/dev/null; true"])
            self.tb.run_on(host, ["rm", "-rf", self.base])


@pytest.fixture
def dirs(testbed: Testbed) -> Iterator[HostDirs]:
    made = HostDirs(testbed)
    yield made
    made.cleanup()


def cwd_of(host: Host) -> str:
    return "/"  # the checkpoint directory is absolute here


def test_the_latest_complete_checkpoint_reaches_every_host_of_the_next_attempt(
    testbed: Testbed, dirs: HostDirs
) -> None:
    """tb2 wrote it; the rendezvous may make any host rank 0: all of them get it."""
    good = dirs.save("tb2", 40).read_bytes()
    dirs.save("tb3", 20)
    cluster = hosts(testbed)
    world = [cluster["tb3"], cluster["tb1"], cluster["tb2"]]
    placed = with_transport(testbed, lambda t: place_latest(t, world, dirs.directory, cwd_of))
    assert (placed.action, placed.step) == ("copied", 40)
    assert [(p.target, p.action, p.source) for p in placed.hosts] == [
        ("tb3", "copied", "tb2"),
        ("tb1", "copied", "tb2"),
        ("tb2", "present", "tb2"),
    ]
    for host in HOSTS:
        copied = dirs.local(host) / "ckpt-00000040.pt"
        assert copied.read_bytes() == good and is_complete_checkpoint(copied), host
    assert dirs.names("tb1") == ["ckpt-00000040.pt"]  # no temp file left
    assert placed.describe().startswith(
        "checkpoint ckpt-00000040.pt (step 40): already on tb2; copied from tb2 to tb3, tb1"
    )


def test_the_latest_complete_checkpoint_reaches_the_new_rank0_host(
    testbed: Testbed, dirs: HostDirs
) -> None:
    dirs.save("tb1", 20)
    good = dirs.save("tb1", 40).read_bytes()
    # a save killed mid-write, and a file damaged some other way: never chosen
    (dirs.local("tb1") / ".ckpt-00000080.pt.tmp-123").write_bytes(good[: len(good) // 2])
    (dirs.local("tb1") / "ckpt-00000060.pt").write_bytes(good[:-4096])
    cluster = hosts(testbed)
    assert dirs.names("tb2") == []

    placement = with_transport(
        testbed,
        lambda t: ensure_latest_on(
            t, cluster["tb2"], [cluster["tb1"], cluster["tb3"]], dirs.directory, cwd_of
        ),
    )
    assert (placement.action, placement.step, placement.source) == ("copied", 40, "tb1")
    assert placement.path == f"{dirs.directory}/ckpt-00000040.pt"
    copied = dirs.local("tb2") / "ckpt-00000040.pt"
    assert dirs.names("tb2") == ["ckpt-00000040.pt"]
    assert copied.read_bytes() == good and is_complete_checkpoint(copied)
    assert require_torch().load(copied)["step"] == 40
    assert dirs.names("tb3") == []  # only the target gets a copy

    again = with_transport(
        testbed,
        lambda t: ensure_latest_on(t, cluster["tb2"], [cluster["tb1"]], dirs.directory, cwd_of),
    )
    assert (again.action, again.step) == ("present", 40)


def test_with_the_writer_lost_the_replica_provides_the_checkpoint(
    healthy_testbed: Testbed, dirs: HostDirs, tmp_path: Path
) -> None:
    tb = healthy_testbed
    cluster = hosts(tb)
    dirs.save("tb1", 20)
    good = dirs.save("tb1", 40).read_bytes()
    replica = Replica(tmp_path / "runs" / "job" / "checkpoints")
    pulled = with_transport(
        tb,
        lambda t: replica.pull(t, cluster["tb1"], f"{dirs.directory}/ckpt-00000040.pt"),
    )
    assert pulled.status == "pulled", pulled.error
    assert replica.latest() == replica.directory / "ckpt-00000040.pt"

    tb.kill_sshd("tb1")  # tb1 is lost: nothing can be fetched from it any more
    placement = with_transport(
        tb,
        lambda t: ensure_latest_on(
            t, cluster["tb3"], [cluster["tb1"], cluster["tb2"]], dirs.directory, cwd_of, replica
        ),
    )
    assert (placement.action, placement.step, placement.source) == ("copied", 40, REPLICA_SOURCE)
    assert [u.split(":")[0] for u in placement.unreachable] == ["tb1"]
    copied = dirs.local("tb3") / "ckpt-00000040.pt"
    assert copied.read_bytes() == good and is_complete_checkpoint(copied)


def test_a_full_checkpoint_disk_is_named_and_the_previous_checkpoint_kept(
    testbed: Testbed, dirs: HostDirs
) -> None:
    cluster = hosts(testbed)
    dirs.save("tb1", 40)
    mount = testbed.run_on(
        "tb2",
        [
            "sh",
            "-c",
            f"mkdir -p {dirs.directory} && mount -t tmpfs -o size=1m tmpfs {dirs.directory}",
        ],
    )
    assert mount.returncode == 0, mount.stderr

    # the SDK on tb2 (hostname tb2): a save bigger than the disk fails clearly; the
    # previous checkpoint, read back from the disk, is whole (one process: each one
    # imports torch, ~1.5 CPU-s)
    script = textwrap.dedent(
        """
        import sys, torch
        from corral import sdk
        folder = sys.argv[1]
        sdk.save_checkpoint({"step": 10, "w": torch.zeros(50_000)}, folder, 10)
        try:
            sdk.save_checkpoint({"step": 20, "w": torch.zeros(500_000)}, folder, 20)
        except sdk.CheckpointWriteError as exc:
            print(exc)
            print(torch.load(f"{folder}/ckpt-00000010.pt")["step"])
            sys.exit(3)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "RANK"))}
    saved = testbed.run_on(
        "tb2", [sys.executable, "-c", script, dirs.directory], env=env, timeout=120
    )
    assert saved.returncode == 3, saved.stderr
    previous = f"{dirs.directory}/ckpt-00000010.pt"
    assert saved.stdout.splitlines() == [
        f"cannot save checkpoint {dirs.directory}/ckpt-00000020.pt on host tb2: "
        f"no space left on device; the previous checkpoint {previous} is intact",
        "10",
    ], saved.stderr
    listed = testbed.run_on("tb2", ["ls", "-A", dirs.directory])
    assert listed.stdout.split() == ["ckpt-00000010.pt"]

    # corral copying tb1's checkpoint 40 there: the same clear error
    with pytest.raises(CheckpointTransferError) as caught:
        with_transport(
            testbed,
            lambda t: ensure_latest_on(t, cluster["tb2"], [cluster["tb1"]], dirs.directory, cwd_of),
        )
    err = caught.value
    assert err.host == "tb2" and err.errno_name == "ENOSPC"
    assert str(err).startswith(
        f"tb2: cannot write {dirs.directory}/ckpt-00000040.pt: no space left on device"
    )
    listed = testbed.run_on("tb2", ["ls", "-A", dirs.directory])
    assert listed.stdout.split() == ["ckpt-00000010.pt"]


def test_the_helpers_leave_no_process_behind(testbed: Testbed, dirs: HostDirs) -> None:
    cluster = hosts(testbed)
    dirs.save("tb1", 40)
    with_transport(
        testbed,
        lambda t: ensure_latest_on(t, cluster["tb3"], [cluster["tb1"]], dirs.directory, cwd_of),
    )
    for host in ("tb1", "tb3"):
        left = []
        for pid in testbed.pids_on(host):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            if b"checkpoints.hostside" in args:
                left.append(pid)
        assert left == [], f"helper processes left on {host}: {left}"
