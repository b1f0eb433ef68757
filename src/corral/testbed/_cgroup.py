"""A CPU quota for a testbed host: a cgroup (v2, or v1's ``cpu`` controller) that
caps its processes at a fraction of one CPU. Put a host's sshd in it
(:meth:`corral.testbed.Testbed.sshd_pid`) and everything started on that host over
SSH, ranks included, inherits the cap: a slow host on a machine of equal CPUs."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import TracebackType

from corral.errors import ConfigError

__all__ = ["PERIOD_US", "CpuQuota"]

#: The default scheduling period the quota is a share of (microseconds).
PERIOD_US = 100_000
_V2_ROOT = Path("/sys/fs/cgroup")
_V1_CPU = Path("/sys/fs/cgroup/cpu")
_V2_MAX_WEIGHT = "10000"
_V1_MAX_SHARES = "262144"


class CpuQuota:
    """A new cgroup ``name`` limited to ``quota`` of one CPU (None: no limit), with the
    largest CPU weight, so that other work on this machine does not slow its
    processes (cgroup v2 ``cpu.max``/``cpu.weight``, or v1's CFS quota and shares
    where the cpu controller is only mounted as v1). The cap applies per
    ``period_us``: a shorter period spreads the throttling over short steps.

    ConfigError for a bad ``name`` or ``quota``; OSError when there is no cgroup cpu
    controller or the group cannot be made (not root, a read-only cgroupfs).
    :meth:`close` (or leaving the ``with`` block) moves its processes back to the
    parent group and removes it.
    """

    def __init__(self, name: str, quota: float | None, *, period_us: int = PERIOD_US) -> None:
        if "/" in name or name in ("", ".", ".."):
            raise ConfigError(f"must be one path component (got {name!r})", option="name")
        if quota is not None and not 0.0 < quota <= 64.0:
            raise ConfigError(f"must be a positive number of CPUs (got {quota:g})", option="quota")
        if not 1000 <= period_us <= 1_000_000:
            raise ConfigError(
                f"must be 1,000 to 1,000,000 microseconds (got {period_us})", option="period_us"
            )
        limit = None if quota is None else max(1000, int(quota * period_us))
        self.quota = quota
        if "cpu" in _read(_V2_ROOT / "cgroup.controllers").split():
            if "cpu" not in _read(_V2_ROOT / "cgroup.subtree_control").split():
                (_V2_ROOT / "cgroup.subtree_control").write_text("+cpu")
            self.parent = _V2_ROOT
            self.path = _V2_ROOT / name
            self.path.mkdir()
            (self.path / "cpu.weight").write_text(_V2_MAX_WEIGHT)
            if limit is not None:
                (self.path / "cpu.max").write_text(f"{limit} {period_us}")
        elif (_V1_CPU / "cpu.cfs_quota_us").exists():
            self.parent = _V1_CPU
            self.path = _V1_CPU / name
            self.path.mkdir()
            (self.path / "cpu.shares").write_text(_V1_MAX_SHARES)
            if limit is not None:
                (self.path / "cpu.cfs_period_us").write_text(str(period_us))
                (self.path / "cpu.cfs_quota_us").write_text(str(limit))
        else:
            raise OSError("no cgroup cpu controller (v2 cgroup.controllers or v1 cpu)")

    def __repr__(self) -> str:
        return f"CpuQuota({str(self.path)!r}, quota={self.quota})"

    def add(self, pid: int) -> None:
        """Move process ``pid`` into the group (processes it starts later inherit it)."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        """The processes in the group now."""
        return [int(p) for p in _read(self.path / "cgroup.procs").split()]

    def close(self) -> None:
        """Move every process back to the parent group and remove this one (no-op once
        removed)."""
        if not self.path.exists():
            return
        for pid in self.pids():
            with contextlib.suppress(OSError):
                (self.parent / "cgroup.procs").write_text(str(pid))
        self.path.rmdir()

    def __enter__(self) -> CpuQuota:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
