"""Check 3, software: python, torch, CUDA, NCCL (and mlx for the mlx launcher)
and every installed package agree across hosts; the launcher is there."""

from __future__ import annotations

from collections import Counter
from typing import Any

from corral.checks.context import CheckContext
from corral.checks.result import CheckResult, HostCheck, Status

NAME = "software"
CORE = ("python", "torch", "cuda", "nccl", "corral")
IGNORED_PACKAGES = frozenset({"pip", "setuptools", "wheel", "distribute"})
MISSING = "-"


def _majority(values: list[str]) -> str:
    """The most common value; ties go to the first host's (the master's side)."""
    counts = Counter(values)
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)


def check(ctx: CheckContext) -> CheckResult:
    """Fail when a version differs on some hosts (those are named, with the table of
    versions), when corral or torch (for torchrun) is missing; warn when the
    launcher's own binary is missing."""
    answered = ctx.answered()
    launcher = ctx.options.launcher
    keys = list(CORE) + (["mlx"] if launcher == "mlx" else [])
    table: dict[str, dict[str, str]] = {}
    for f in answered:
        sw = f.facts.get("software", {})
        row = {k: str(sw.get(k) or MISSING) for k in keys}
        row["python"] = str(sw.get("python") or MISSING)
        table[f.host.name] = row
    packages: dict[str, dict[str, str]] = {
        f.host.name: {
            k: v for k, v in f.facts.get("packages", {}).items() if k not in IGNORED_PACKAGES
        }
        for f in answered
    }
    names = sorted({p for pk in packages.values() for p in pk} - set(keys))
    mismatched: dict[str, dict[str, str]] = {}  # key -> host -> value (differing keys only)
    expected: dict[str, str] = {}
    for key in keys:
        values = [table[h][key] for h in table]
        if len(set(values)) > 1:
            mismatched[key] = {h: table[h][key] for h in table}
            expected[key] = _majority(values)
    for name in names:
        per_host = {h: packages[h].get(name, MISSING) for h in packages}
        if len(set(per_host.values())) > 1:
            mismatched[name] = per_host
            expected[name] = _majority(list(per_host.values()))

    hosts: dict[str, HostCheck] = {}
    fixes: list[str] = []
    for host in ctx.cluster.hosts:
        f = ctx.facts[host.name]
        if not f.ok:
            hosts[host.name] = HostCheck(Status.SKIP, "host did not answer")
            continue
        sw = f.facts.get("software", {})
        problems: list[str] = []
        status = Status.PASS
        exe = sw.get("python_executable", "python")
        if not sw.get("corral_importable"):
            status = Status.FAIL
            problems.append(f"corral is not installed for {exe}")
            fixes.append(f"{exe} -m pip install corral  (on {host.name})")
        if launcher == "torchrun" and table[host.name]["torch"] == MISSING:
            status = Status.FAIL
            problems.append(f"torch is not installed for {exe} (torchrun needs it)")
        differing = [
            f"{k} {v[host.name]} (others {expected[k]})"
            for k, v in mismatched.items()
            if v.get(host.name) != expected[k]
        ]
        if differing:
            status = Status.FAIL
            problems.append("differs: " + ", ".join(differing[:6]))
            if len(differing) > 6:
                problems[-1] += f" and {len(differing) - 6} more"
            pins = [
                f"{k}=={expected[k]}"
                for k in mismatched
                if k not in ("python", "cuda", "nccl")
                and mismatched[k].get(host.name) != expected[k]
                and expected[k] != MISSING
            ]
            if pins:
                fixes.append(f"{exe} -m pip install {' '.join(pins)}  (on {host.name})")
        missing_bins = [b for b, path in (sw.get("binaries") or {}).items() if not path]
        if missing_bins and status is Status.PASS:
            status = Status.WARN
            problems.append(f"{', '.join(missing_bins)} not found next to {exe} or on PATH")
        if problems:
            hosts[host.name] = HostCheck(status, "; ".join(problems))
        else:
            row = table[host.name]
            torch = row["torch"] if row["torch"] != MISSING else "no torch"
            hosts[host.name] = HostCheck(Status.PASS, f"python {row['python']}, torch {torch}")
    data: dict[str, Any] = {"versions": table, "mismatched": mismatched}
    same = (
        ", ".join(f"{k} {table[next(iter(table))][k]}" for k in keys if k not in mismatched)
        if table
        else ""
    )
    summary = f"{len(mismatched)} version(s) differ" if mismatched else f"same everywhere: {same}"
    return CheckResult.from_hosts(
        NAME,
        hosts,
        summary=summary,
        fix_command="; ".join(fixes) or None,
        data=data,
    )
