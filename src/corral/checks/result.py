"""What a pre-flight check returns: a status per host, one overall status, a fix.

Statuses order: ``skip`` (not applicable here) < ``pass`` < ``warn`` (never
blocks a launch) < ``fail`` (blocks it). A check's status is the worst of its
hosts' unless the check says otherwise, so a check skipped on some hosts and
passed on the others passes, and a report of passes and skips passes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class Status(str, enum.Enum):
    """Outcome of a check on one host, or of the whole check."""

    PASS = "pass"
    SKIP = "skip"
    WARN = "warn"
    FAIL = "fail"

    @property
    def rank(self) -> int:
        """Badness: skip 0, pass 1, warn 2, fail 3."""
        return _RANK[self]


_RANK = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.FAIL: 3}


def worst(statuses: Iterable[Status]) -> Status:
    """The worst status (``pass`` for none; ``skip`` only when all are skips)."""
    return max(statuses, key=lambda s: s.rank, default=Status.PASS)


@dataclass(frozen=True)
class HostCheck:
    """One check's outcome on one host, with the reason in a few words."""

    status: Status
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        """``{"status", "detail"}``."""
        return {"status": self.status.value, "detail": self.detail}


@dataclass
class CheckResult:
    """The outcome of one check across the cluster.

    ``error`` (for fail) / ``warning`` (for warn) say what is wrong in one
    sentence naming the hosts; ``fix_command`` is a command the user can run;
    ``data`` holds machine-readable extras (versions table, interfaces,
    bandwidth, divergent files).
    """

    name: str
    status: Status
    hosts: dict[str, HostCheck] = field(default_factory=dict)
    summary: str = ""
    error: str | None = None
    warning: str | None = None
    fix_command: str | None = None
    duration_s: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_hosts(
        cls,
        name: str,
        hosts: Mapping[str, HostCheck],
        *,
        summary: str = "",
        error: str | None = None,
        warning: str | None = None,
        fix_command: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> CheckResult:
        """A result whose status is the worst of ``hosts``'; the error / warning
        default to naming the failing / warning hosts with their details."""
        status = worst(h.status for h in hosts.values())
        if status is Status.FAIL and error is None:
            error = _naming(hosts, Status.FAIL)
        if status is Status.WARN and warning is None:
            warning = _naming(hosts, Status.WARN)
        return cls(
            name=name,
            status=status,
            hosts=dict(hosts),
            summary=summary,
            error=error if status is Status.FAIL else None,
            warning=warning if status is Status.WARN else None,
            fix_command=fix_command if status in (Status.FAIL, Status.WARN) else None,
            data=data or {},
        )

    def hosts_with(self, status: Status) -> list[str]:
        """Names of the hosts with ``status``."""
        return [h for h, c in self.hosts.items() if c.status is status]

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` form of one check."""
        return {
            "name": self.name,
            "status": self.status.value,
            "summary": self.summary,
            "hosts": {h: c.to_json() for h, c in self.hosts.items()},
            "error": self.error,
            "warning": self.warning,
            "fix_command": self.fix_command,
            "duration_s": round(self.duration_s, 4),
            "data": self.data,
        }


def _naming(hosts: Mapping[str, HostCheck], status: Status) -> str:
    bad = [(h, c.detail) for h, c in hosts.items() if c.status is status]
    return "; ".join(f"{h}: {d}" if d else h for h, d in bad)


@dataclass
class ChecklistReport:
    """Every check's result; ``overall_status`` is the worst of them."""

    checks: list[CheckResult]
    hosts: list[str]
    duration_s: float = 0.0
    block_on_failure: bool = True

    @property
    def overall_status(self) -> Status:
        """The worst check status; ``pass`` when every check passed or was skipped."""
        status = worst(c.status for c in self.checks)
        return Status.PASS if status is Status.SKIP else status

    @property
    def failed(self) -> list[CheckResult]:
        """The checks that failed (they block a launch)."""
        return [c for c in self.checks if c.status is Status.FAIL]

    def check(self, name: str) -> CheckResult:
        """The result of the check called ``name`` (KeyError if it did not run)."""
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """``{"checks": [...], "overall_status", "block_on_failure", ...}``."""
        return {
            "checks": [c.to_json() for c in self.checks],
            "overall_status": self.overall_status.value,
            "block_on_failure": self.block_on_failure,
            "hosts": list(self.hosts),
            "duration_s": round(self.duration_s, 4),
        }
