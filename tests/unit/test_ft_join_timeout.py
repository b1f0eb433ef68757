"""``--ft-join-timeout``: the Lighthouse's join timeout is the job's option, declared once
in the schema, and reaches the Lighthouse corral starts, the plan, the pre-flight's
timeouts check and the server's planner; a bad value is refused naming the option."""

from __future__ import annotations

import asyncio
import json
import types
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from corral.checks.result import Status
from corral.checks.timeouts import check
from corral.cli.main import _register, app
from corral.cluster import Cluster, Host
from corral.defaults import DEFAULT_FT_JOIN_TIMEOUT
from corral.errors import ConfigError, Invalid
from corral.job.build import build_job
from corral.job.describe import JobOptions
from corral.job.options import CheckPolicy, SupervisionPolicy
from corral.job.preflight import checklist_options
from corral.plan.spec import JobSpec
from corral.recovery.inplace import RecoveryPolicy
from corral.recovery.lighthouse import Lighthouse, child_argv
from corral.transport.options import SshOptions

from .test_checks import _ctx as checks_ctx

_register()


def _plan(tmp_path: Path, *flags: str) -> Any:
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    argv = ["plan", "--hosts", "local:2", "--launcher", "python", *flags]
    return CliRunner().invoke(app, [*argv, "--", str(script)])


def test_the_plan_shows_the_join_timeout(tmp_path: Path) -> None:
    result = _plan(tmp_path, "--recovery", "in-place", "--ft-join-timeout", "45", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["recovery"]["join_timeout_s"] == 45.0
    default = _plan(tmp_path, "--recovery", "in-place", "--json")
    assert json.loads(default.stdout)["recovery"]["join_timeout_s"] == DEFAULT_FT_JOIN_TIMEOUT
    text = _plan(tmp_path, "--recovery", "in-place", "--ft-join-timeout", "45")
    assert text.exit_code == 0, text.output
    assert "join timeout 45 s: --ft-join-timeout" in " ".join(text.stdout.split())


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--recovery", "in-place", "--ft-join-timeout", "0"), "must be more than 0"),
        (("--recovery", "in-place", "--ft-join-timeout", "-3"), "must be more than 0"),
        (("--ft-join-timeout", "30"), "runs only for --recovery in-place"),
    ],
)
def test_a_bad_join_timeout_is_refused_naming_the_option(
    tmp_path: Path, flags: tuple[str, ...], words: str
) -> None:
    result = _plan(tmp_path, *flags)
    assert isinstance(result.exception, ConfigError), result.output
    assert result.exception.option == "--ft-join-timeout"
    assert words in str(result.exception)


def test_the_policy_refuses_what_the_lighthouse_cannot_take() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(ConfigError, match="must be more than 0") as info:
            RecoveryPolicy("in-place", join_timeout=bad)
        assert info.value.option == "--ft-join-timeout"
    assert RecoveryPolicy("in-place").join_seconds == DEFAULT_FT_JOIN_TIMEOUT
    assert RecoveryPolicy("in-place", join_timeout=90).join_seconds == 90.0


def test_the_option_reaches_the_lighthouses_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    from corral.job import inplace as ip
    from corral.job.engine import dry_run

    options = JobOptions(command=("t.py",), recovery="in-place", ft_join_timeout=75.0)
    spec, made = build_job(options)
    assert made.recovery.join_seconds == 75.0
    started: dict[str, Any] = {}

    async def start(*args: Any, **kwargs: Any) -> Any:
        started.update(kwargs)
        return types.SimpleNamespace(url="http://127.0.0.1:1")

    monkeypatch.setattr(Lighthouse, "start", start)
    monkeypatch.setattr(ip, "reachable_address", lambda peer: "10.0.0.100")  # no route needed
    cluster = Cluster((Host("h0", address="10.0.0.1"), Host("h1", address="10.0.0.2")))
    asyncio.run(ip.setup(dry_run(spec, cluster), [], None, join_timeout=made.recovery.join_seconds))
    assert started["join_timeout"] == 75.0
    # and the child's command line (what torchft's LighthouseServer is built from)
    argv = child_argv("python3", "127.0.0.1", 1, 0, started["join_timeout"])
    assert argv[argv.index("--join-timeout-ms") + 1] == "75000"
    argv = child_argv("python3", "127.0.0.1", 1, 0, 0.0004)  # never 0 ms: torchft's minimum
    assert argv[argv.index("--join-timeout-ms") + 1] == "1"


def test_the_timeouts_check_uses_the_jobs_join_timeout() -> None:
    options = checklist_options(
        CheckPolicy(),
        JobSpec(script="t.py"),
        Cluster((Host("h0"), Host("h1"))),
        SshOptions(),
        None,
        None,
        in_place=True,
        supervision=SupervisionPolicy(),
        join_timeout=45.0,
    )
    assert options.ft_join_timeout == 45.0
    # 30 s process group + 0.5 s heartbeat + 45 s join is not below the 60 s quorum
    result = check(checks_ctx(torchft=True, ft_join_timeout=45.0))
    assert result.status is Status.WARN and result.warning is not None
    assert "(0.5 s + 45 s, --ft-join-timeout)" in result.warning
    assert result.fix_command is not None
    assert result.fix_command.startswith("raise TORCHFT_QUORUM_TIMEOUT_SEC (--env) to >= 76.5")
    assert result.data["lighthouse_join_s"] == 45.0
    assert check(checks_ctx(torchft=True)).status is Status.PASS


def test_the_server_refuses_it_naming_the_field() -> None:
    from corral.service.planner import _check_recovery

    with pytest.raises(Invalid, match="ft_join_timeout: torchft's Lighthouse runs only for"):
        _check_recovery(JobOptions(command=("t.py",), ft_join_timeout=20.0), 2)
    _check_recovery(JobOptions(command=("t.py",), recovery="in-place", ft_join_timeout=20.0), 2)
