"""Run every ``benchmarks/bench_*.py`` and summarise the results (``make bench``).

Each benchmark runs as its own process (``python benchmarks/bench_X.py``) with a
timeout; it writes ``results/<X>.json`` (schema in ``benchlib.py``). Afterwards
this script writes ``results/summary.json`` and ``results/summary.md`` (a
Markdown table for the README: benchmark, metric, value, baseline, ratio,
target, met?) and prints the table.

A benchmark counts as *skipped* (not failed) when it exits with code 77 or says
why it cannot run (``skipped``, ``missing tools``, ``needs root``...): the
reason is recorded. A benchmark whose result file says ``failed`` (a measured run
failed: ``benchlib.finish``) is failed whatever its output says, and its failing
runs (command, problems, last output lines) are carried into the summary. A
result file older than this run is never reported as a fresh result.

    python benchmarks/run_all.py [--only logs,launch] [--skip fanout] [--timeout 300]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from benchlib import (
    BENCH_DIR,
    PYTHON,
    RESULTS_DIR,
    SKIP_EXIT,
    bench_env,
    machine_info,
    now_iso,
    rounded,
)

_SKIP_HINTS = re.compile(
    r"skipp|missing tools?|needs? root|requires? root|not root|permission denied|not installed",
    re.IGNORECASE,
)
#: seconds per benchmark unless --timeout says otherwise
DEFAULT_TIMEOUTS = {
    "logs": 240.0,
    "teardown": 300.0,
    "launch": 240.0,
    "fanout": 420.0,
    "ssh": 400.0,
    "check": 420.0,
    "links": 300.0,
    "sync": 420.0,
    "faults": 1200.0,
    "replica": 400.0,
    "serve": 240.0,
    "queue": 420.0,
    "scale": 1800.0,
    "web": 180.0,
    "actors": 400.0,
    "hetero": 900.0,
    "cli_start": 120.0,
    "diagnose": 400.0,
    "inplace": 900.0,
    "diloco": 600.0,
    "sdk": 300.0,
}


def discover(only: set[str], skip: set[str]) -> list[tuple[str, Path]]:
    """(name, path) of every bench_*.py, filtered by --only / --skip."""
    found = []
    for path in sorted(BENCH_DIR.glob("bench_*.py")):
        name = path.stem[len("bench_") :]
        if (only and name not in only) or name in skip:
            continue
        found.append((name, path))
    return found


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it (results may live in
    ``$CORRAL_BENCH_RESULTS``, anywhere)."""
    return (
        str(path.relative_to(BENCH_DIR.parent))
        if path.is_relative_to(BENCH_DIR.parent)
        else str(path)
    )


def _tail(text: str, lines: int = 8) -> list[str]:
    return [line for line in text.strip().splitlines() if line.strip()][-lines:]


def _forward(stream: IO[str], log: IO[str], output: list[str]) -> None:
    """Copy a benchmark's output to its log, our stderr and ``output``."""
    for line in stream:
        output.append(line)
        log.write(line)
        log.flush()
        sys.stderr.write(f"   {line}")
        sys.stderr.flush()


def run_one(name: str, path: Path, timeout: float) -> dict[str, Any]:
    """Run one benchmark; return its record (status, output tail, duration)."""
    started = time.time()
    log_path = RESULTS_DIR / f"{name}.log"
    print(f"== {name} (timeout {timeout:g} s)", file=sys.stderr, flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [PYTHON, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=bench_env(),
            cwd=BENCH_DIR.parent,
            start_new_session=True,
        )
        assert proc.stdout is not None
        output: list[str] = []
        pump = threading.Thread(target=_forward, args=(proc.stdout, log, output), daemon=True)
        pump.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # anything the benchmark left in its session (it should leave nothing)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        pump.join(10)
        proc.stdout.close()
    text = "".join(output)
    record: dict[str, Any] = {
        "name": name,
        "script": _shown(path),
        "exit_code": proc.returncode,
        "duration_s": time.time() - started,
        "log": _shown(log_path),
        "output_tail": _tail(text),
    }
    result_path = RESULTS_DIR / f"{name}.json"
    fresh = result_path.exists() and result_path.stat().st_mtime >= started
    doc: dict[str, Any] = {}
    if fresh:
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(result_path.read_text())
    if timed_out:
        record.update(status="timeout", reason=f"did not finish within {timeout:g} s")
    elif doc.get("status") == "failed":
        # its measured runs failed: never a skip, whatever words their stderr holds
        record.update(status="failed", reason=str(doc.get("reason") or "failed"))
        record["failed_runs"] = doc.get("failed_runs") or []
    elif proc.returncode == SKIP_EXIT or (proc.returncode != 0 and _SKIP_HINTS.search(text)):
        reason = next(
            (line for line in reversed(_tail(text, 20)) if _SKIP_HINTS.search(line)),
            f"exit code {proc.returncode}",
        )
        record.update(status="skipped", reason=reason.strip())
    elif proc.returncode != 0:
        record.update(status="failed", reason=f"exit code {proc.returncode}")
    elif not fresh:
        record.update(status="failed", reason=f"{result_path.name} was not written")
    else:
        record["status"] = "ok"
    if doc:
        record["result_file"] = _shown(result_path)
        record["metrics"] = extract_metrics(doc)
        if record["status"] == "ok" and doc.get("status") == "skipped":
            record.update(status="skipped", reason=doc.get("reason", ""))
    elif result_path.exists() and not fresh:
        record["stale_result"] = f"{result_path.name} is from an earlier run; not reported"
    return record


def collect_one(name: str, path: Path) -> dict[str, Any]:
    """The record of a benchmark run on its own earlier (``python benchmarks/bench_X.py``),
    from the result file it wrote; nothing is run."""
    result_path = RESULTS_DIR / f"{name}.json"
    record: dict[str, Any] = {"name": name, "script": _shown(path)}
    try:
        doc = json.loads(result_path.read_text())
    except (OSError, ValueError) as exc:
        record.update(status="failed", reason=f"cannot read {result_path.name}: {exc}")
        return record
    record.update(
        status=doc.get("status") or "ok",
        reason=doc.get("reason", ""),
        result_file=_shown(result_path),
        metrics=extract_metrics(doc),
        collected=doc.get("date") or "an earlier run",
    )
    if doc.get("failed_runs"):
        record["failed_runs"] = doc["failed_runs"]
    return record


def extract_metrics(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Table rows of a result file: its ``metrics`` list (benchlib schema), else
    rows built from ``targets`` / ``ratios`` / ``median_s`` (ratio-style files)."""
    rows = doc.get("metrics")
    if isinstance(rows, list):
        return [r for r in rows if isinstance(r, dict)]
    medians = doc.get("median_s") or doc.get("medians") or {}
    ratios = doc.get("ratios") or {}
    targets = doc.get("targets") or {}
    built = []
    for key, target in targets.items():
        value_ratio = ratios.get(key)
        num, _, den = key.partition("/")
        met = (
            value_ratio <= target
            if isinstance(value_ratio, int | float) and isinstance(target, int | float)
            else None
        )
        built.append(
            {
                "metric": key,
                "value": medians.get(num),
                "unit": "s",
                "baseline": medians.get(den),
                "baseline_desc": den,
                "ratio": value_ratio,
                "target": f"<= {target}x" if isinstance(target, int | float) else str(target),
                "met": met,
            }
        )
    return built


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float | int):
        if unit == "lines/s":
            return f"{value:,.0f} lines/s"
        if unit in ("lines", "processes", "runs", "steps"):
            return f"{value:g}"
        text = f"{value:.3f}" if abs(value) < 100 else f"{value:,.0f}"
        return f"{text} {unit}".strip()
    return str(value)


def _met(value: Any) -> str:
    return "yes" if value is True else "**no**" if value is False else "-"


def markdown(records: list[dict[str, Any]], machine: dict[str, Any], date: str) -> str:
    """The summary as a Markdown table plus notes."""
    lines = [
        "| benchmark | metric | value | baseline | ratio | target | met? | conditions | date |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    load = machine.get("loadavg_at_start")
    where = f"{machine.get('cpu_count')}-core CPU" + (f", load {load[0]:.1f}" if load else "")
    notes = []
    for record in records:
        name = record["name"]
        bench = f"`{Path(str(record.get('script') or name)).name}`"
        when = str(record.get("collected") or date)[:10]
        conditions = ", ".join(x for x in (where, str(record.get("conditions") or "")) if x)
        if record.get("earlier_run"):
            notes.append(f"- **{name}**: not run this time; figures from an earlier run")
            name = f"{name} (earlier run)"
        elif record.get("collected"):
            notes.append(
                f"- **{name}**: run on its own ({record['script']}) at {record['collected']}"
            )
        rows = record.get("metrics") or []
        if record["status"] != "ok":
            notes.append(f"- **{name}**: {record['status']}: {record.get('reason', '')}")
            for run in (record.get("failed_runs") or [])[:3]:
                last = (run.get("tail") or ["(no output)"])[-1]
                notes.append(
                    f"  - run {run.get('label')}: {'; '.join(run.get('problems') or [])}; "
                    f"`{shlex.join(run.get('argv') or [])}`; last line: `{last}`"
                )
        if not rows:
            status = record["status"]
            lines.append(
                f"| {bench} ({name}) | - | {status} | - | - | - "
                f"| {status} | {conditions} | {when} |"
            )
            continue
        for row in rows:
            unit = str(row.get("unit") or "")
            ratio_text = (
                f"{row['ratio']:.2f}x" if isinstance(row.get("ratio"), int | float) else "-"
            )
            lines.append(
                "| "
                + " | ".join(
                    [
                        bench
                        if name == Path(bench.strip("`")).stem.removeprefix("bench_")
                        else f"{bench} ({name})",
                        str(row.get("metric", "")),
                        _fmt(row.get("value"), unit),
                        _fmt(row.get("baseline"), unit),
                        ratio_text,
                        str(row.get("target", "-")),
                        _met(row.get("met")),
                        conditions,
                        when,
                    ]
                )
                + " |"
            )
    header = (
        f"Measured {date} on {machine.get('cpu_count')} CPUs, Python {machine.get('python')}, "
        f"torch {machine.get('torch')}"
        + (f", load average {load[0]:.1f} at start" if load else "")
        + ". Ratios are against a baseline measured in the same run; "
        "raw samples in `benchmarks/results/<name>.json`."
    )
    text = header + "\n\n" + "\n".join(lines) + "\n"
    if notes:
        text += "\n" + "\n".join(notes) + "\n"
    return text


def merge_earlier(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """With --only/--skip: keep the previous summary's records of the benchmarks
    not run this time (marked ``earlier_run``), so the summary stays complete."""
    ran = {r["name"] for r in records}
    previous: dict[str, dict[str, Any]] = {}
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        old = json.loads((RESULTS_DIR / "summary.json").read_text())
        for record in old["benchmarks"]:
            previous[record["name"]] = record
    merged = list(records)
    for name, _ in discover(set(), set()):
        if name in ran or name not in previous:
            continue
        record = dict(previous[name])
        record.setdefault("earlier_run", True)
        merged.append(record)
    return sorted(merged, key=lambda r: str(r["name"]))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks, write the summary; exit 0 unless a benchmark failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated names (e.g. logs,launch)")
    parser.add_argument("--skip", default="", help="comma-separated names to leave out")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per benchmark")
    parser.add_argument(
        "--collect",
        default="",
        help="comma-separated names not to run but to take from the result file a run "
        "of that benchmark on its own wrote",
    )
    args = parser.parse_args(argv)
    collect = {n for n in args.collect.split(",") if n}
    only = {n for n in args.only.split(",") if n} | collect
    skip = {n for n in args.skip.split(",") if n}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    date = now_iso()
    records = []
    for name, path in discover(only, skip):
        if name in collect:
            records.append(collect_one(name, path))
            continue
        timeout = args.timeout or DEFAULT_TIMEOUTS.get(name, 300.0)
        records.append(run_one(name, path, timeout))
    ran_ok = all(r["status"] in ("ok", "skipped") for r in records)
    if only or skip:
        records = merge_earlier(records)
    machine = machine_info()
    rows_met = [
        row.get("met") for r in records for row in r.get("metrics", []) if r["status"] == "ok"
    ]
    summary = {
        "date": date,
        "machine": machine,
        "benchmarks": records,
        "all_ok": all(r["status"] in ("ok", "skipped") for r in records),
        "all_targets_met": all(m is not False for m in rows_met),
    }
    (RESULTS_DIR / "summary.json").write_text(json.dumps(rounded(summary), indent=2) + "\n")
    table = markdown(records, machine, date)
    (RESULTS_DIR / "summary.md").write_text(table)
    print(table)
    return 0 if ran_ok else 1


if __name__ == "__main__":
    sys.exit(main())
