"""corral.sdk.init_distributed: master wait, timeouts, the calls it makes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from corral import sdk
from tests.conftest import require_torch


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ):
        monkeypatch.delenv(name, raising=False)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def test_single_process_is_a_noop() -> None:
    assert sdk.init_distributed() is False
    sdk.barrier()  # no group: no-ops
    sdk.cleanup()
    sdk.destroy()


def test_wait_for_ready_master_logs(listener: int, capsys: pytest.CaptureFixture[str]) -> None:
    sdk.wait_for_master("127.0.0.1", listener, timeout=5)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"Waiting for master 127.0.0.1:{listener}...",
        f"Master node 127.0.0.1:{listener} is ready for connections",
    ]


class FakeTime:
    """Stands in for the ``time`` module in ``corral.sdk._dist``: ``sleep`` advances
    ``monotonic`` instead of waiting, so deadlines are exact and nothing waits."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    from corral.sdk import _dist

    clock = FakeTime()
    monkeypatch.setattr(_dist, "time", clock)
    return clock


def test_wait_until_master_comes_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The master starts listening only after a first attempt was refused: the wait retries."""
    from corral.sdk import _dist

    port = closed_port()
    server = socket.socket()
    real_connect = socket.create_connection
    refused: list[OSError] = []
    first_refusal = threading.Event()

    def connect(address: tuple[str, int], timeout: float | None = None) -> socket.socket:
        try:
            return real_connect(address, timeout=timeout)
        except OSError as exc:
            refused.append(exc)
            first_refusal.set()
            raise

    monkeypatch.setattr(_dist.socket, "create_connection", connect)

    def start_after_a_refusal() -> None:
        if first_refusal.wait(timeout=30):
            server.bind(("127.0.0.1", port))
            server.listen(1)

    t = threading.Thread(target=start_after_a_refusal)
    t.start()
    try:
        sdk.wait_for_master("127.0.0.1", port, timeout=timedelta(seconds=60))
    finally:
        first_refusal.set()
        t.join()
        server.close()
    assert refused, "the master was up before the first attempt"
    assert all(isinstance(exc, ConnectionRefusedError) for exc in refused)
    assert capsys.readouterr().err.splitlines() == [
        f"Waiting for master 127.0.0.1:{port}...",
        f"Master node 127.0.0.1:{port} is ready for connections",
    ]


def test_wait_times_out_with_host_and_port(
    fake_time: FakeTime, capsys: pytest.CaptureFixture[str]
) -> None:
    port = closed_port()
    start = fake_time.now
    with pytest.raises(sdk.MasterNotReadyError) as info:
        sdk.wait_for_master("127.0.0.1", port, timeout=75)
    # It retried with a growing backoff (capped at 1 s) and gave up exactly at the deadline.
    assert fake_time.now - start == pytest.approx(75)
    assert fake_time.sleeps[:5] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8])
    assert max(fake_time.sleeps) == 1.0
    assert isinstance(info.value, TimeoutError)
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "within 75s" in str(info.value)
    assert "ConnectionRefused" in str(info.value)
    assert (info.value.host, info.value.port, info.value.timeout) == ("127.0.0.1", port, 75)
    # A reminder every 30 s of waiting, with the last error.
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"Waiting for master 127.0.0.1:{port}..."
    reminders = err[1:]
    assert len(reminders) == 2
    assert all(
        line.startswith(f"Still waiting for master 127.0.0.1:{port} (ConnectionRefusedError")
        for line in reminders
    )


def test_unresolvable_host_is_retried_until_the_deadline(fake_time: FakeTime) -> None:
    with pytest.raises(sdk.MasterNotReadyError, match=r"no-such-host\.invalid:29500") as info:
        sdk.wait_for_master("no-such-host.invalid", 29500, timeout=3)
    assert len(fake_time.sleeps) > 1  # retried, not given up at the first failure
    assert info.value.last_error is not None and "gaierror" in info.value.last_error


@pytest.mark.parametrize("bad", [0, -1.0, timedelta(0)])
def test_nonpositive_timeouts_rejected(bad: float | timedelta) -> None:
    with pytest.raises(ValueError, match="positive"):
        sdk.wait_for_master("127.0.0.1", 1, timeout=bad)


def dist_env(monkeypatch: pytest.MonkeyPatch, rank: int, port: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))


@pytest.fixture
def fake_init(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record init_process_group calls instead of making them."""
    require_torch()
    import torch.distributed as dist

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    return calls


@pytest.mark.torch
def test_rank0_initialises_without_waiting(
    monkeypatch: pytest.MonkeyPatch,
    fake_init: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    dist_env(monkeypatch, 0, closed_port())  # nothing listens: rank 0 must not wait
    assert sdk.init_distributed(timeout=12.5) is True
    assert fake_init == [
        {
            "backend": "gloo",
            "init_method": "env://",
            "timeout": timedelta(seconds=12.5),
            "rank": 0,
            "world_size": 2,
        }
    ]
    err = capsys.readouterr().err
    assert "Waiting for master" not in err
    assert (
        "Initializing distributed process group: rank=0, world_size=2, timeout=0:00:12.500000"
        in err
    )


@pytest.mark.torch
def test_auto_takes_the_backend_the_job_declares(
    monkeypatch: pytest.MonkeyPatch, fake_init: list[dict[str, Any]]
) -> None:
    """``--env CORRAL_BACKEND=gloo`` keeps a CPU job on gloo where CUDA is available
    (what the pre-flight judged it by); an explicit argument still wins."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("CORRAL_BACKEND", "gloo")
    dist_env(monkeypatch, 0, closed_port())
    assert sdk.init_distributed(timeout=5) is True
    assert fake_init[-1]["backend"] == "gloo"
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    assert sdk.init_distributed("nccl", timeout=5) is True
    assert fake_init[-1]["backend"] == "nccl"


@pytest.mark.torch
def test_other_ranks_wait_then_initialise(
    monkeypatch: pytest.MonkeyPatch,
    fake_init: list[dict[str, Any]],
    listener: int,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dist_env(monkeypatch, 1, listener)
    assert sdk.init_distributed(backend="gloo", timeout=timedelta(minutes=30)) is True
    assert fake_init[0]["timeout"] == timedelta(minutes=30)
    assert fake_init[0]["rank"] == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"Waiting for master 127.0.0.1:{listener}...",
        f"Master node 127.0.0.1:{listener} is ready for connections",
        "Initializing distributed process group: rank=1, world_size=2, timeout=0:30:00",
    ]


@pytest.mark.torch
def test_master_timeout_raises_before_init(
    monkeypatch: pytest.MonkeyPatch, fake_init: list[dict[str, Any]]
) -> None:
    port = closed_port()
    dist_env(monkeypatch, 1, port)
    with pytest.raises(sdk.MasterNotReadyError, match=f"127.0.0.1:{port}"):
        sdk.init_distributed(timeout=300, master_timeout=0.3)
    assert fake_init == []


@pytest.mark.torch
def test_timeouts_default_to_the_rendered_env(
    monkeypatch: pytest.MonkeyPatch, fake_init: list[dict[str, Any]]
) -> None:
    """k8s/Slurm renders export CORRAL_DIST_TIMEOUT and CORRAL_RDZV_TIMEOUT; the SDK uses them."""
    port = closed_port()
    dist_env(monkeypatch, 1, port)
    monkeypatch.setenv("CORRAL_DIST_TIMEOUT", "1800")
    monkeypatch.setenv("CORRAL_RDZV_TIMEOUT", "0.3")
    with pytest.raises(sdk.MasterNotReadyError, match=r"0\.3"):
        sdk.init_distributed()  # the master wait used CORRAL_RDZV_TIMEOUT, not 1800 s
    dist_env(monkeypatch, 0, port)
    assert sdk.init_distributed() is True
    assert fake_init[-1]["timeout"] == timedelta(seconds=1800)
    monkeypatch.setenv("CORRAL_DIST_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="CORRAL_DIST_TIMEOUT='soon'"):
        sdk.init_distributed()


@pytest.mark.torch
def test_missing_master_env_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, fake_init: list[dict[str, Any]]
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        sdk.init_distributed()
    assert fake_init == []


def test_sdk_imports_without_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from corral import sdk\n"
        "assert sdk.init_distributed() is False\n"
        "sdk.barrier(); sdk.cleanup()\n"
        "print(sdk.info().world_size, sdk.scale_config(batch_size=4, lr=1.0)['lr'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1.0"]


def test_importing_the_sdk_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys\nfrom corral import sdk\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_public_api_is_pinned() -> None:
    assert sorted(sdk.__all__) == sorted(
        [
            "CheckpointWriteError", "DistInfo", "MasterNotReadyError", "barrier", "cleanup",
            "destroy", "enable_stack_dumps", "error_file_path", "resume",
            "info", "init_distributed", "is_complete_checkpoint", "is_distributed", "job_config",
            "is_main_process", "latest_checkpoint", "load_checkpoint", "output_dir",
            "print_distributed_info", "read_error_file", "record", "report", "save_checkpoint",
            "scale_config", "should_save_outputs", "wait_for_master", "write_error_file",
            # heterogeneous clusters, accelerate
            "Chunk", "WeightedDistributedSampler", "calibrating", "chunks", "get_accelerator",
            "krum_hook", "local_batch_size", "loss_scale", "set_qos", "workload_weights",
            # "checkpoint now" (before a Slurm time limit)
            "checkpoint_requested", "request_checkpoint",
            # in-place recovery (torchft)
            "FaultTolerant", "fault_tolerant", "RNGState", "StateMismatch",
            # stragglers: named sections and the DDP arrival hook
            "section", "straggler_hook",
            # a split that knows memory: the micro-batch a rank fits, accumulation
            "memory_split", "micro_batch_fits", "probe_fit",
            # a split that knows each rank's fixed step cost: steps at two batch sizes
            "calibration_batch",
        ]
    )  # fmt: skip
    for name in sdk.__all__:
        assert getattr(sdk, name) is not None
