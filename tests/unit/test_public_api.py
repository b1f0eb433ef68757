"""The public API is pinned: adding or removing a name is a deliberate change."""

from __future__ import annotations

import corral
from corral import errors

PINNED = {
    "CheckFailed",
    "Cluster",
    "CommandTimeout",
    "ConfigError",
    "ConnectError",
    "ConnectionLost",
    "CorralError",
    "Host",
    "JobFailed",
    "JobSpec",
    "JobState",
    "LaunchError",
    "NodeCommand",
    "NodeState",
    "RankProcess",
    "TransportError",
    "__version__",
    "load_cluster",
    "plan_job",
}


def test_all_is_pinned() -> None:
    assert set(corral.__all__) == PINNED
    for name in corral.__all__:
        assert hasattr(corral, name), name


def test_error_tree_matches_design() -> None:
    assert issubclass(errors.ConfigError, errors.CorralError)
    for cls in (errors.ConnectError, errors.CommandTimeout, errors.ConnectionLost):
        assert issubclass(cls, errors.TransportError)
    assert issubclass(errors.TransportError, errors.CorralError)
    for cls in (errors.CheckFailed, errors.LaunchError, errors.JobFailed):
        assert issubclass(cls, errors.CorralError)


def test_errors_carry_where() -> None:
    err = errors.ConfigError("slots must be > 0", source="hosts.txt", line=3)
    assert str(err) == "hosts.txt:3: slots must be > 0"
    err = errors.ConnectError("cannot connect", host="tb2", command="true", cause="auth failed")
    assert str(err) == "tb2: cannot connect (auth failed)" and err.host == "tb2"
    assert err.details() == ["command: true"]


def test_coordinator_does_not_need_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, corral, corral.cli.main, corral.job.engine, corral.sdk; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
