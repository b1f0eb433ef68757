"""The typed policies a job is built with (besides its JobSpec and Cluster).

Each policy validates itself on construction and names the option at fault
(the CLI's flag; the API uses the same names), so the CLI, the server and a
program driving :class:`~corral.job.engine.Job` get the same errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.checks.context import DEFAULT_LINKS_MIN_RATIO, DEFAULT_MIN_FREE_GB, validate_links
from corral.defaults import DEFAULT_GRACE
from corral.errors import ConfigError
from corral.recovery.health import DEFAULT_HOST_TIMEOUT
from corral.recovery.inplace import RecoveryPolicy
from corral.recovery.restart import RestartPolicy

__all__ = [
    "CheckPolicy",
    "CheckpointPolicy",
    "RecoveryPolicy",
    "RestartPolicy",
    "SupervisionPolicy",
    "SyncPolicy",
]


@dataclass(frozen=True)
class CheckPolicy:
    """The pre-flight checklist before launch (``--no-preflight`` disables it)."""

    enabled: bool = True
    smoke_test: bool = False  # the collective smoke test (a torch import per rank)
    min_free_gb: float = DEFAULT_MIN_FREE_GB
    consistency_threshold: float = 1.0
    exclude_divergent: bool = False
    code_dir: str | None = None  # the code tree here the hosts must match
    links: bool = False  # the link matrix (--check-links)
    links_min_ratio: float = DEFAULT_LINKS_MIN_RATIO
    links_min_gbs: float = 0.0
    links_fail: bool = True  # a host behind slow links blocks the launch

    def __post_init__(self) -> None:
        validate_links(self.links_min_ratio, self.links_min_gbs)
        if not 0.0 < self.consistency_threshold <= 1.0:
            raise ConfigError(
                f"must be in (0, 1] (got {self.consistency_threshold:g})",
                option="--consistency-threshold",
            )
        if self.min_free_gb < 0:
            raise ConfigError(
                f"must be 0 or more (got {self.min_free_gb:g})", option="--min-free-gb"
            )


@dataclass(frozen=True)
class SyncPolicy:
    """Bringing the hosts' code in line before the checklist (SSH clusters only)."""

    push: bool = False  # push the code tree (``corral sync``) to the hosts' workdir
    script: str | None = None  # a user sync script, run before the checklist
    source: str | None = None  # the tree to push (default: the current directory)

    @property
    def enabled(self) -> bool:
        """Whether anything is synced."""
        return self.push or self.script is not None


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where rank 0's checkpoints live and whether the coordinator keeps a replica."""

    directory: str | None = None  # ``--checkpoint-dir`` (on the hosts)
    replicate: bool = False  # copy each new checkpoint here before the save returns

    def __post_init__(self) -> None:
        if self.replicate and not self.directory:
            raise ConfigError(
                "needs --checkpoint-dir (the directory whose checkpoints are copied)",
                option="--replicate-checkpoints",
            )


@dataclass(frozen=True)
class SupervisionPolicy:
    """How an attempt is watched and torn down."""

    grace: float = DEFAULT_GRACE  # seconds between SIGTERM and SIGKILL in a teardown
    host_timeout: float = DEFAULT_HOST_TIMEOUT  # silence after which a host is lost
    hang_timeout: float | None = None  # no progress for this long is a hang (None: auto)

    def __post_init__(self) -> None:
        if not self.grace >= 0:
            raise ConfigError(f"must be 0 or more seconds (got {self.grace:g})", option="--grace")
        if not self.host_timeout > 0:
            raise ConfigError(
                f"must be more than 0 s (got {self.host_timeout:g})", option="--host-timeout"
            )
        if self.hang_timeout is not None and not self.hang_timeout > 0:
            raise ConfigError(
                f"must be more than 0 s (got {self.hang_timeout:g})", option="--hang-timeout"
            )
