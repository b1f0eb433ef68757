"""The pre-flight's timeouts check for ``--recovery in-place`` (issue 33 item 2): the
order that turns a lost node into a heal, the fix it names, and the defaults."""

from __future__ import annotations

from typing import Any

from corral.checks.context import CheckContext
from corral.checks.result import Status
from corral.checks.timeouts import Timeouts, check, problems, timeouts_of
from corral.cluster import Cluster, Host
from corral.job.options import CheckPolicy, SupervisionPolicy
from corral.job.preflight import checklist_options
from corral.plan.spec import JobSpec
from corral.transport.options import SshOptions

from .test_checks import _ctx as checks_ctx


def _ctx(**options: Any) -> CheckContext:
    return checks_ctx(torchft=True, **options)


def test_the_defaults_are_in_order() -> None:
    # sdk.fault_tolerant's, the Lighthouse's as corral starts it, corral's options'
    assert problems(Timeouts()) == []
    assert problems(timeouts_of({}, hang_timeout=None, host_timeout=20.0)) == []
    result = check(_ctx())
    assert result.status is Status.PASS and result.fix_command is None
    assert result.summary.startswith("in order: process group 30 s + Lighthouse 0.5+10 s")
    assert "assumed sdk.fault_tolerant's defaults: TORCHFT_TIMEOUT_SEC" in result.summary


def test_a_hang_timeout_below_the_survivors_stall_names_the_value_needed() -> None:
    result = check(_ctx(hang_timeout=60.0))
    assert result.status is Status.WARN
    assert result.warning is not None
    assert "--hang-timeout (60 s) is not above the process-group timeout (30 s)" in result.warning
    assert result.fix_command == "raise --hang-timeout to >= 91"


def test_the_jobs_torchft_overrides_are_read_from_its_env() -> None:
    env = {"TORCHFT_TIMEOUT_SEC": "200", "TORCHFT_QUORUM_TIMEOUT_SEC": "150"}
    result = check(_ctx(env=env))
    assert result.status is Status.WARN and "assumed" not in result.summary
    assert result.fix_command is not None
    fixes = result.fix_command.split("; ")
    # the quorum must outlast a collective blocked on the lost host, then the Lighthouse
    # (its heartbeat timeout, 0.5 s, and its join timeout, 10 s)
    assert fixes[0] == "raise TORCHFT_QUORUM_TIMEOUT_SEC (--env) to >= 211.5, or lower " + (
        "TORCHFT_TIMEOUT_SEC"
    )
    assert fixes[1] == "raise --hang-timeout to >= 351"  # 200 + 150 is not below 300
    assert result.data["process_group_s"] == 200.0 and result.data["quorum_s"] == 150.0


def test_a_host_timeout_above_the_hang_timeout_is_named() -> None:
    found = problems(Timeouts(hang=200.0, host=250.0))
    assert len(found) == 1
    what, fix = found[0]
    assert "--hang-timeout (200 s) is not above --host-timeout (250 s)" in what
    assert fix == "raise --hang-timeout to >= 251 (or lower --host-timeout)"


def test_a_launch_checks_the_timeouts_it_planned() -> None:
    spec = JobSpec(script="t.py", env={"TORCHFT_QUORUM_TIMEOUT_SEC": "45"})
    cluster = Cluster((Host("h0"), Host("h1")))
    options = checklist_options(
        CheckPolicy(),
        spec,
        cluster,
        SshOptions(),
        None,
        None,
        in_place=True,
        supervision=SupervisionPolicy(hang_timeout=50.0, host_timeout=7.0),
    )
    assert options.torchft and options.hang_timeout == 50.0 and options.host_timeout == 7.0
    assert options.env["TORCHFT_QUORUM_TIMEOUT_SEC"] == "45"


def test_a_torchft_timeout_torchft_cannot_read_is_named() -> None:
    # torchft's Manager reads int(value) and sdk.fault_tolerant refuses it: every rank
    # would fail at its start
    env = {"TORCHFT_TIMEOUT_SEC": "2.5", "TORCHFT_QUORUM_TIMEOUT_SEC": "90"}
    result = check(_ctx(env=env))
    assert result.status is Status.WARN and result.warning is not None
    assert "TORCHFT_TIMEOUT_SEC='2.5' is not a whole number of seconds" in result.warning
    assert result.fix_command == "set TORCHFT_TIMEOUT_SEC (--env) to a whole number of seconds"
    assert (
        timeouts_of({"TORCHFT_TIMEOUT_SEC": "45"}, hang_timeout=None, host_timeout=20).unusable
        == ()
    )
