"""A split that knows memory (issue 33 item 5): probing the largest micro-batch, the
split with declared caps, and what the sampler and the calibration make of it."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.cluster import load_cluster
from corral.contract import MEM_CAP_ENV, MICRO_BATCH_FITS_ENV, REPLICA_GROUP_ENV
from corral.job.build import weigh
from corral.job.describe import JobDescription, JobOptions
from corral.plan.spec import JobSpec
from corral.sdk import WeightedDistributedSampler, memory_split, micro_batch_fits, probe_fit
from corral.sdk._memory import MemoryCapExceeded, micro_sizes
from corral.throughput.resolve import resolve_fits
from corral.throughput.weights import MeasuredRank, Rate, build_calibration


def test_a_share_above_its_fit_runs_as_accumulated_micro_batches() -> None:
    # throughput-proportional shares are kept; the capped rank accumulates
    split = memory_split(96, [2.0, 1.0], [None, 8])
    assert [(s.batch, s.micro, s.accumulation) for s in split] == [(64, 64, 1), (32, 8, 4)]
    assert split[1].sizes == (8, 8, 8, 8)
    uneven = memory_split(100, [0.5, 0.5], [0, 16])[1]  # 0: no limit, as in the env
    assert (uneven.batch, uneven.micro, uneven.accumulation) == (50, 13, 4)
    assert uneven.sizes == (13, 13, 12, 12) and max(uneven.sizes) <= 16
    assert memory_split(10, [1.0, 1.0], [5, 5])[0].accumulation == 1  # a share that fits


def test_without_accumulation_the_excess_moves_to_ranks_with_room() -> None:
    split = memory_split(100, [0.5, 0.25, 0.25], [None, 10, None], accumulate=False)
    assert [s.batch for s in split] == [60, 10, 30]  # 90 left, split 2:1
    assert all(s.accumulation == 1 for s in split)
    chained = memory_split(100, [1.0, 1.0, 1.0], [40, 20, None], accumulate=False)
    assert [s.batch for s in chained] == [40, 20, 40]
    with pytest.raises(ValueError, match="ranks fit 30 examples per step together"):
        memory_split(64, [1.0, 1.0], [10, 20], accumulate=False)


def test_bad_fits_are_named() -> None:
    with pytest.raises(ValueError, match="1 fits for 2 ranks"):
        memory_split(8, [1.0, 1.0], [4])
    with pytest.raises(ValueError, match=MICRO_BATCH_FITS_ENV):
        micro_batch_fits({MICRO_BATCH_FITS_ENV: "4,x", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="2 entries for a world size of 3"):
        micro_batch_fits({MICRO_BATCH_FITS_ENV: "4,0", "WORLD_SIZE": "3"})
    assert micro_batch_fits({MICRO_BATCH_FITS_ENV: "0,12", "WORLD_SIZE": "2"}) == (None, 12)
    assert micro_batch_fits({"WORLD_SIZE": "2"}) is None
    in_place = {MICRO_BATCH_FITS_ENV: "0,12,8", "WORLD_SIZE": "1", REPLICA_GROUP_ENV: "1"}
    assert micro_batch_fits(in_place) is None  # a torchft group: split per group
    assert micro_sizes(7, 3) == (3, 2, 2) and micro_sizes(7, None) == (7,)


@pytest.fixture
def small_heap() -> Iterator[None]:
    """The heap of a training rank, not of a test worker that has loaded the whole suite:
    probe_fit collects the garbage of every step that ran out of memory, and a full
    collection walks every live object (~1 CPU-s each in a full run's worker, issue 30).
    Freezing what lives before the test leaves the collections the objects its steps made."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.usefixtures("small_heap")
def test_probing_doubles_then_bisects_under_a_declared_cap() -> None:
    tried: list[int] = []

    def step(batch: int) -> int:
        tried.append(batch)
        return len(bytearray(batch * 10_000))  # 10 kB per example, seen by tracemalloc

    fit = probe_fit(step, start=1, limit=4096, cap_mb=1.0)
    assert fit.batch == 104 and fit.limited  # 1 MiB / 10 kB
    assert tried[:8] == [1, 2, 4, 8, 16, 32, 64, 128]  # doubling to the first failure
    assert all(64 < b < 128 for b in tried[8:]) and len(tried) <= 8 + 7  # then bisecting


@pytest.mark.usefixtures("small_heap")
def test_probing_catches_out_of_memory_and_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MEM_CAP_ENV, raising=False)

    def card(batch: int) -> None:  # as torch.cuda.OutOfMemoryError would
        if batch > 37:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    assert probe_fit(card, start=4, limit=1024).batch == 37

    def host(batch: int) -> None:  # torch's CPU allocator
        if batch > 300:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to ...")

    assert probe_fit(host, start=64, limit=4096).batch == 300
    roomy = probe_fit(lambda b: None, start=4, limit=100)
    assert (roomy.batch, roomy.limited) == (100, False)

    def broken(batch: int) -> None:
        raise ValueError("shapes do not match")

    with pytest.raises(ValueError, match="shapes"):
        probe_fit(broken)
    with pytest.raises(MemoryError, match="not even a micro-batch of 1"):
        probe_fit(lambda b: len(bytearray(b * 10_000)), cap_mb=0.001)
    monkeypatch.setenv(MEM_CAP_ENV, "1")
    assert probe_fit(lambda b: len(bytearray(b * 10_000)), limit=4096).batch == 104
    assert issubclass(MemoryCapExceeded, MemoryError)


@pytest.mark.usefixtures("small_heap")
def test_probing_a_torch_step_counts_what_autograd_keeps() -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def step(batch: int) -> None:
        model.zero_grad(set_to_none=True)
        model(torch.randn(batch, 64)).sum().backward()

    params = list(model.parameters())
    small = probe_fit(step, limit=4096, cap_mb=0.25, params=params)
    large = probe_fit(step, limit=4096, cap_mb=1.0, params=params)
    assert small.limited and large.limited
    assert 0 < small.batch < large.batch < 4096  # activations grow with the batch


def test_the_sampler_tells_a_capped_rank_its_micro_batches() -> None:
    sampler = WeightedDistributedSampler(
        range(40), num_replicas=2, rank=1, weights=[0.5, 0.5], shuffle=False,
        global_batch=20, fits=[None, 4],
    )  # fmt: skip
    assert (sampler.batch_size, sampler.micro_batch, sampler.accumulation) == (10, 4, 3)
    assert sampler.micro_sizes(0) == (4, 3, 3)
    micro = list(sampler.micro_batches())
    assert micro[:3] == [[10, 11, 12, 13], [14, 15, 16], [17, 18, 19]]
    assert [i for m in micro for i in m] == [i for b in sampler.batches() for i in b]
    assert len(sampler.batch_sampler(micro=True)) == 6
    # the micro-batches' loss factors add up to the whole step's
    assert sum(sampler.loss_scale(0, j) for j in range(3)) == pytest.approx(sampler.loss_scale(0))
    assert "in 3 micro-batches" in repr(sampler)
    capped = WeightedDistributedSampler(
        range(40), num_replicas=2, rank=1, weights=[0.5, 0.5], shuffle=False,
        global_batch=20, fits=[None, 4], accumulate=False,
    )  # fmt: skip
    assert (capped.batch_size, capped.accumulation, capped.step_sizes(0)) == (4, 1, (16, 4))


def _measured(fits: list[int | None]) -> list[MeasuredRank]:
    rate = Rate(examples_per_s=100.0, examples=1000.0, seconds=10.0, reports=40)
    return [
        MeasuredRank(host=f"local-{i}", rank=i, local_rank=0, rate=rate, fits=f)
        for i, f in enumerate(fits)
    ]


def test_the_calibration_records_fits_and_the_run_exports_them() -> None:
    cal = build_calibration(
        _measured([None, 104]), hosts=["local-0", "local-1"], job_id="c", seconds=5,
        script=None, workload="reference",
    )  # fmt: skip
    assert [r.fits for r in cal.ranks] == [None, 104] and cal.fits() == {"local-1": 104}
    assert "Memory caps the micro-batch of local-1:1 at 104" in cal.calibration_notes
    cluster = load_cluster("local:2")
    assert resolve_fits(cal, cluster, None) == (None, 104)
    options = JobOptions(command=("t.py",), launcher="python", job_id="j", env={"A": "1"})
    weighed = weigh(JobDescription(options, cluster), cal)
    assert weighed.description.options.env == {"A": "1", MICRO_BATCH_FITS_ENV: "0,104"}
    assert weighed.fits == (None, 104)
    plain = build_calibration(
        _measured([None, None]), hosts=["local-0", "local-1"], job_id="c", seconds=5,
        script=None, workload="reference",
    )  # fmt: skip
    assert MICRO_BATCH_FITS_ENV not in weigh(weighed.description, plain).description.options.env


def test_a_server_job_weighed_by_a_calibration_gets_its_fits(tmp_path: Path) -> None:
    from corral.throughput.model import save_calibration
    from tests.unit.test_service_planner import _weighted_plan, machine

    cal = build_calibration(
        _measured([None, 104]), hosts=["sim1", "sim2"], job_id="c", seconds=5,
        script=None, workload="reference",
    )  # fmt: skip
    renamed = cal.model_copy(
        update={"ranks": [r.model_copy(update={"host": f"sim{r.rank + 1}"}) for r in cal.ranks]}
    )
    path = save_calibration(renamed, tmp_path / "cal.json")
    machines = [machine("sim1", local=True, slots=1), machine("sim2", local=True, slots=1)]
    plan = _weighted_plan(tmp_path, machines, calibration=str(path))
    assert [(w["host"], w["fits"]) for w in plan["workload_weights"]] == [
        ("sim1", None),
        ("sim2", 104),
    ]
    for node in plan["nodes"]:
        assert node["env"][MICRO_BATCH_FITS_ENV] == "0,104"


def test_a_restart_on_fewer_hosts_keeps_the_fits_of_the_ranks_that_remain() -> None:
    from corral.cluster.model import Cluster
    from corral.job.drift import DriftMonitor

    cluster = load_cluster("local:3")
    monitor = DriftMonitor((0.5, 0.25, 0.25), cluster, None, emit=lambda event: None)
    spec = JobSpec(
        script="t.py", launcher="python", job_id="j", workload_weights=(0.5, 0.25, 0.25),
        env={MICRO_BATCH_FITS_ENV: "0,16,8"},
    )  # fmt: skip
    fewer = Cluster((cluster.hosts[0], cluster.hosts[2]))
    respec = monitor.respec(spec, fewer)
    assert respec.env[MICRO_BATCH_FITS_ENV] == "0,8"
    assert respec.workload_weights == pytest.approx((2 / 3, 1 / 3), abs=1e-6)


def test_the_job_status_shows_each_ranks_fit_beside_its_weight() -> None:
    from corral.service.queries import _current_weights
    from corral.store.models import Attempt, Job

    rows = [
        {"host": "sim1", "node_rank": 0, "local_rank": 0, "weight": 0.5, "fits": None},
        {"host": "sim2", "node_rank": 1, "local_rank": 0, "weight": 0.5, "fits": 104},
    ]
    job = Job(plan={"workload_weights": rows})
    planned = _current_weights(job, [])
    assert planned is not None and [w.fits for w in planned] == [None, 104]
    rebalanced = Attempt(number=1, hosts=["sim1", "sim2"], workload_weights=[0.6, 0.4])
    current = _current_weights(job, [rebalanced])
    assert current is not None
    assert [(w.weight, w.fits) for w in current] == [(0.6, None), (0.4, 104)]


def test_corral_job_status_prints_the_fits_under_the_weights() -> None:
    from corral.cli.jobview import weights_text

    rows = [
        {"host": "gpu1", "node_rank": 0, "local_rank": 0, "weight": 0.6, "fits": None},
        {"host": "gpu2", "node_rank": 1, "local_rank": 0, "weight": 0.4, "fits": 104},
    ]
    text = weights_text({"workload_weights": rows})
    assert text.splitlines() == [
        "workload weights (host:local rank): gpu1:0 0.600, gpu2:0 0.400",
        "micro-batch fits (host:local rank): gpu2:0 104; a larger share runs as gradient "
        "accumulation (sdk.WeightedDistributedSampler)",
    ]
    plain = [{k: v for k, v in row.items() if k != "fits"} for row in rows]
    assert "micro-batch" not in weights_text({"workload_weights": plain})


def test_accumulated_micro_batches_give_the_whole_batchs_gradient() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    x, y = torch.randn(10, 8), torch.randint(0, 3, (10,))
    sampler = WeightedDistributedSampler(
        range(20), num_replicas=2, rank=1, weights=[0.5, 0.5], shuffle=False,
        global_batch=20, fits=[None, 4],
    )  # fmt: skip
    loss_fn = torch.nn.CrossEntropyLoss()
    (loss_fn(model(x), y) * sampler.loss_scale(0)).backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    parts = list(sampler.micro_sizes(0))
    for j, (xm, ym) in enumerate(zip(x.split(parts), y.split(parts), strict=True)):
        (loss_fn(model(xm), ym) * sampler.loss_scale(0, j)).backward()
    for a, p in zip(whole, model.parameters(), strict=True):
        assert torch.allclose(a, p.grad, atol=1e-6)
