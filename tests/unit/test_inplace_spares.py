"""Issue 33 item 3, the pure parts: a spare host is judged by the same per-host checks
as the hosts that train (one that fails is named and not used), and a Lighthouse that
dies is restarted unless the groups could not reconnect to it (then the fallback says
why)."""

from __future__ import annotations

import dataclasses
from typing import Any

from corral.checks import spares
from corral.checks.context import CheckContext
from corral.checks.result import ChecklistReport, Status
from corral.checks.runner import ChecklistOutcome
from corral.cluster import load_cluster
from corral.cluster.model import Host
from corral.contract import FT_QUORUM_RETRIES_DEFAULT, FT_QUORUM_RETRIES_ENV
from corral.job.preflight import usable_spares, with_spares
from corral.plan.inplace import plan_inplace
from corral.plan.spec import JobSpec
from corral.recovery.inplace import MAX_LIGHTHOUSE_RESTARTS, lighthouse_fallback
from tests.unit.test_checks import _ctx

FT = {"software": {"modules": {"torchft": True}}}


def _training_ctx(per_host: dict[str, dict[str, Any]]) -> tuple[CheckContext, tuple[Host, ...]]:
    """A checklist context of n1, n2 (training) whose facts hold spare n3's too."""
    ctx = _ctx(per_host, torchft=True)
    everyone = ctx.cluster
    training = dataclasses.replace(everyone, hosts=everyone.hosts[:2])
    return dataclasses.replace(ctx, cluster=training), everyone.hosts[2:]


def test_a_spare_without_torchft_is_named_with_the_reason_and_not_used() -> None:
    ctx, spare = _training_ctx(
        {"n1": FT, "n2": FT, "n3": {"software": {"modules": {"torchft": False}}}}
    )
    result = spares.check(ctx, spare)
    assert result.status is Status.WARN  # a reserve lost, not a refused launch
    row = result.hosts["n3"]
    assert row.status is Status.WARN
    assert row.detail.startswith("not used: software: torchft cannot be imported by")
    assert result.warning is not None and result.warning.startswith("spare n3 not used: ")
    assert "(0 spare(s) left)" in result.warning
    assert result.fix_command is not None and "torchft-nightly" in result.fix_command
    assert "(on n3)" in result.fix_command
    assert result.data["usable"] == [] and set(result.data["unusable"]) == {"n3"}


def test_a_spare_whose_versions_or_code_differ_is_not_used_either() -> None:
    ctx, spare = _training_ctx(
        {
            "n1": FT,
            "n2": FT,
            "n3": {**FT, "packages": {"numpy": "1.26.4"}},
        }
    )
    result = spares.check(ctx, spare)
    assert "software: differs: numpy 1.26.4 (others 2.1.0)" in result.hosts["n3"].detail
    unreachable, spare = _training_ctx({"n1": FT, "n2": FT})
    gone = dict(unreachable.facts)
    gone["n3"] = dataclasses.replace(gone["n3"], facts={}, error="n3: connection refused")
    result = spares.check(dataclasses.replace(unreachable, facts=gone), spare)
    assert result.hosts["n3"].detail.startswith("not used: connectivity: n3: connection refused")


def test_a_spare_that_passes_is_ready_and_kept() -> None:
    ctx, spare = _training_ctx({"n1": FT, "n2": FT, "n3": FT})
    result = spares.check(ctx, spare)
    assert result.status is Status.PASS and result.hosts["n3"].detail.startswith("ready")
    assert result.data["usable"] == ["n3"]
    hosts = load_cluster("n1,n2,n3").hosts
    report = ChecklistReport(checks=[result], hosts=["n1", "n2"])
    outcome = ChecklistOutcome(report=report, cluster=load_cluster("n1,n2"))
    assert usable_spares(outcome, hosts[2:]) == hosts[2:]
    failed, _ = _training_ctx({"n1": FT, "n2": FT})  # no torchft anywhere but n1, n2
    dropped = spares.check(failed, spare)
    outcome.report = ChecklistReport(checks=[dropped], hosts=["n1", "n2"])
    assert usable_spares(outcome, hosts[2:]) == ()
    # --sync pushes the code to the spares too
    assert [h.name for h in with_spares(load_cluster("n1,n2"), hosts[2:]).hosts] == [
        "n1",
        "n2",
        "n3",
    ]


def test_every_group_retries_its_quorum_so_it_reconnects_to_a_restarted_lighthouse() -> None:
    spec = JobSpec(script="train.py", launcher="python")
    commands, _ = plan_inplace(spec, load_cluster("local:2"))
    assert {c.env[FT_QUORUM_RETRIES_ENV] for c in commands} == {str(FT_QUORUM_RETRIES_DEFAULT)}
    mine = dataclasses.replace(spec, env={FT_QUORUM_RETRIES_ENV: "0"})
    commands, _ = plan_inplace(mine, load_cluster("local:2"))
    assert {c.env[FT_QUORUM_RETRIES_ENV] for c in commands} == {"0"}  # the job's own wins


def test_a_dead_lighthouse_is_restarted_unless_the_groups_cannot_reconnect() -> None:
    assert lighthouse_fallback(-9, 0, "20") is None
    assert lighthouse_fallback(-9, 0, None) is None
    why = lighthouse_fallback(-9, 0, "0")
    assert why is not None and why.startswith("torchft's Lighthouse exited (code -9) and ")
    assert "TORCHFT_QUORUM_RETRIES=0" in why
    again = lighthouse_fallback(1, MAX_LIGHTHOUSE_RESTARTS, "20")
    assert again == (
        f"torchft's Lighthouse exited (code 1) again after {MAX_LIGHTHOUSE_RESTARTS} "
        "restart(s) in this attempt"
    )
