"""The web page: how soon a rank's log line is on the job page, and what the page weighs.

Against a real ``corral serve`` subprocess (``tests/serverlib.py``) with one
registered ``local`` machine, driven by Playwright in Debian's headless
``chromium`` (no browser download):

* **log line latency**: a one-rank job (python launcher, no pre-flight) waits
  until the job page is open, then prints ``--warmup`` + ``--lines`` lines, one
  every ``--interval`` s, each carrying its own ``time.time()``. In the page, a
  ``MutationObserver`` on ``#logs`` (installed before the page's own scripts)
  records ``performance.timeOrigin + performance.now()`` when each line's element
  is added; latency = that - the printed time (same machine, same wall clock).
  Median and p90 over the measured lines (the warm-up lines are left out). The
  baseline, read in the same run: an SSE client (httpx, bearer token) following
  ``/api/jobs/{id}/events`` records when each line arrives, so ``ratio`` is what
  the browser (EventSource, parsing, batching per animation frame, DOM) adds on
  top of the server's own pipeline. Target: median <= 1 s.
* **page weight**: the job page opened in a fresh browser context (nothing
  cached): the bytes of the response bodies of the document and of every script
  and stylesheet it loads (API data and the event stream not counted). Target:
  <= 300 KB (300,000 bytes).

    python benchmarks/bench_web.py [--lines 50] [--warmup 5] [--interval 0.1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchlib import ROOT, exit_on_sigterm, finish, log, median, metric, ratio

sys.path.insert(0, str(ROOT))
from tests.serverlib import LiveServer, live_server
from tests.webkit import chromium_path, login

NAME = "web"
SKIP_EXIT = 77
LATENCY_TARGET_S = 1.0
WEIGHT_TARGET_BYTES = 300_000
MARK = "webstamp"
#: The rank: waits for the go file, then prints numbered lines with its wall clock.
RANK_SCRIPT = """\
import os, sys, time
go, count, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
while not os.path.exists(go):
    time.sleep(0.01)
for i in range(count):
    print(f"{mark} {{i}} {{time.time():.6f}}", flush=True)
    time.sleep(pause)
"""
#: Installed before the page's scripts: when a log line's element appears in #logs.
OBSERVER = """
window.__seen = [];
document.addEventListener("DOMContentLoaded", () => {
  const box = document.getElementById("logs");
  if (!box) return;
  new MutationObserver((records) => {
    const now = performance.timeOrigin + performance.now();
    for (const r of records) {
      for (const node of r.addedNodes) {
        const m = /MARK (\\d+) ([\\d.]+)/.exec(node.textContent || "");
        if (m) window.__seen.push([Number(m[1]), Number(m[2]), now / 1000]);
      }
    }
  }).observe(box, { childList: true, subtree: true });
  window.__observing = true;
});
""".replace("MARK", MARK)
WEIGHED = ("document", "script", "stylesheet")
FINAL = ("succeeded", "failed", "timed_out", "cancelled", "lost")


def _stamps(text: str, arrived: float) -> list[tuple[int, float, float]]:
    """(line number, printed at, arrived) of every stamped line in ``text``."""
    found = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == MARK:
            found.append((int(parts[1]), float(parts[2]), arrived))
    return found


class SseReader(threading.Thread):
    """The baseline: when each stamped line arrives on the job's event stream."""

    def __init__(self, server: LiveServer, job_id: str) -> None:
        super().__init__(daemon=True)
        self.server, self.job_id = server, job_id
        self.seen: list[tuple[int, float, float]] = []
        self.error = ""

    def run(self) -> None:
        kind = ""
        try:
            with (
                self.server.client(timeout=120) as client,
                client.stream("GET", f"/api/jobs/{self.job_id}/events") as resp,
            ):
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        kind = line.partition(":")[2].strip()
                    elif line.startswith("data:") and kind == "log":
                        data = json.loads(line.partition(":")[2])
                        self.seen += _stamps(str(data.get("text", "")), time.time())
                    elif line.startswith("data:") and kind in ("finished", "error", "lost"):
                        return
        except Exception as exc:  # reported in the result
            self.error = repr(exc)


def _latencies(seen: list[Any], warmup: int) -> list[float]:
    """Seconds from print to arrival of each measured line (first arrival of each)."""
    first: dict[int, float] = {}
    for number, printed, arrived in seen:
        if int(number) >= warmup and int(number) not in first:
            first[int(number)] = float(arrived) - float(printed)
    return [first[n] for n in sorted(first)]


def _p90(values: list[float]) -> float | None:
    return statistics.quantiles(values, n=10)[-1] if len(values) >= 2 else None


def _start_job(server: LiveServer, work: Path, count: int, interval: float) -> tuple[str, Path]:
    """Plan and dispatch the stamping rank on the local machine; (job id, go file)."""
    script = work / "stamps.py"
    script.write_text(RANK_SCRIPT.format(mark=MARK))
    go = work / "go"
    request = {
        "script": str(script),
        "args": [str(go), str(count), str(interval)],
        "launcher": "python",
        "nproc_per_node": 1,
        "preflight": False,
    }
    with server.client() as client:
        made = client.post("/api/network/machines", json={"name": "local1", "local": True})
        made.raise_for_status()
        client.post("/api/network/health-check").raise_for_status()
        planned = client.post("/api/network/distributed/plan", json=request)
        planned.raise_for_status()
        job_id = str(planned.json()["job_id"])
        sent = client.post("/api/network/distributed/dispatch", json={"job_id": job_id})
        sent.raise_for_status()
    return job_id, go


def _final_state(server: LiveServer, job_id: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    with server.client() as client:
        while time.monotonic() < deadline:
            state = client.get(f"/api/network/distributed/status/{job_id}").json()["status"]
            if state in FINAL:
                break
            time.sleep(0.2)
    return state


def measure_latency(browser: Any, server: LiveServer, args: argparse.Namespace) -> dict[str, Any]:
    """Page and SSE arrival of every stamped line of one job."""
    total = args.warmup + args.lines
    job_id, go = _start_job(server, server.root, total, args.interval)
    sse = SseReader(server, job_id)
    sse.start()
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        context.add_init_script(OBSERVER)
        page = context.new_page()
        login(page, server, next_path=f"/jobs/{job_id}")
        page.wait_for_function("window.__observing === true")
        page.locator("#job-status", has_text="running").wait_for(timeout=60_000)
        page.wait_for_timeout(500)  # the page's event stream is connected and caught up
        go.write_text("go\n")
        wait_ms = int((total * args.interval + 30) * 1000)
        page.wait_for_function(f"window.__seen.length >= {total}", timeout=wait_ms)
        page_seen = page.evaluate("window.__seen")
    finally:
        context.close()
    state = _final_state(server, job_id)
    sse.join(30)
    return {
        "job_id": job_id,
        "state": state,
        "page": _latencies(page_seen, args.warmup),
        "sse": _latencies(sse.seen, args.warmup),
        "sse_error": sse.error,
    }


def measure_weight(browser: Any, server: LiveServer, job_id: str) -> dict[str, Any]:
    """Bytes of the job page's document, scripts and stylesheets, nothing cached: the
    session is made in one context and its cookie handed to a fresh one."""
    first = browser.new_context()
    try:
        page = first.new_page()
        login(page, server)
        cookies = first.cookies()
    finally:
        first.close()
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    responses: list[Any] = []
    try:
        context.add_cookies(cookies)
        page = context.new_page()
        page.on("response", lambda resp: responses.append(resp))
        page.goto(f"{server.url}/jobs/{job_id}")
        page.wait_for_load_state("load")
        page.wait_for_timeout(1000)
        files = []
        for resp in responses:
            kind = resp.request.resource_type
            if kind in WEIGHED and not 300 <= resp.status < 400:
                sizes = resp.request.sizes()
                files.append(
                    {
                        "url": resp.url.removeprefix(server.url),
                        "type": kind,
                        "status": resp.status,
                        "body_bytes": len(resp.body()),
                        "transferred_body_bytes": sizes.get("responseBodySize"),
                        "header_bytes": sizes.get("responseHeadersSize"),
                    }
                )
    finally:
        context.close()
    return {"files": files, "total_bytes": sum(f["body_bytes"] for f in files)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50, help="measured lines")
    parser.add_argument("--warmup", type=int, default=5, help="lines printed first, not counted")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between lines")
    args = parser.parse_args(argv)
    exit_on_sigterm()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        print(f"skipped: the playwright package is not installed ({exc})")
        return SKIP_EXIT
    chromium = chromium_path()
    if chromium is None:
        print("skipped: Debian's chromium is not installed (apt-get install chromium)")
        return SKIP_EXIT

    with (
        tempfile.TemporaryDirectory(prefix="corral-bench-web-") as tmp,
        live_server(Path(tmp) / "srv") as server,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=chromium, headless=True)
        try:
            log(f"latency: {args.warmup} + {args.lines} lines every {args.interval} s")
            latency = measure_latency(browser, server, args)
            log("page weight of the job page")
            weight = measure_weight(browser, server, latency["job_id"])
        finally:
            browser.close()

    page_median = median(latency["page"])
    sse_median = median(latency["sse"])
    page_p90 = _p90(latency["page"])
    total = weight["total_bytes"]
    complete = len(latency["page"]) == args.lines and latency["state"] == "succeeded"
    latency_met = page_median is not None and page_median <= LATENCY_TARGET_S and complete
    weight_met = 0 < total <= WEIGHT_TARGET_BYTES
    metrics = [
        metric(
            f"log line printed -> visible in the job page, median of {args.lines}",
            page_median,
            "s",
            f"<= {LATENCY_TARGET_S:g} s",
            latency_met,
            baseline=sse_median,
            baseline_desc="the same lines' arrival at an SSE client (httpx) in the same run",
            ratio_value=ratio(page_median, sse_median),
        ),
        metric(
            "log line printed -> visible in the job page, p90 (info)",
            page_p90,
            "s",
            "-",
            None,
            baseline=_p90(latency["sse"]),
            baseline_desc="SSE client p90",
        ),
        metric(
            "job page weight (HTML + JS + CSS bodies, nothing cached)",
            total / 1000,
            "KB",
            f"<= {WEIGHT_TARGET_BYTES / 1000:g} KB",
            weight_met,
        ),
    ]
    problems = []
    if not complete:
        problems.append(
            f"job {latency['job_id']} {latency['state']}, "
            f"{len(latency['page'])}/{args.lines} lines seen in the page"
        )
    if latency["sse_error"]:
        problems.append(f"SSE baseline: {latency['sse_error']}")
    status_code = finish(
        NAME,
        {
            "title": "Web page: live log latency and page weight",
            "status": "failed" if problems else "ok",
            "reason": "; ".join(problems),
            "config": {
                "lines": args.lines,
                "warmup": args.warmup,
                "interval_s": args.interval,
                "browser": f"{chromium} (headless, Playwright)",
                "server": "corral serve, SQLite, one local machine",
            },
            "samples": {
                "page_latency_s": latency["page"],
                "sse_latency_s": latency["sse"],
                "weight": weight,
                "job_id": latency["job_id"],
            },
            "medians": {
                "page_latency_s": page_median,
                "sse_latency_s": sse_median,
                "page_latency_p90_s": page_p90,
                "page_weight_bytes": total,
            },
            "metrics": metrics,
            "ratio": ratio(page_median, sse_median),
            "target": f"median <= {LATENCY_TARGET_S:g} s; page <= "
            f"{WEIGHT_TARGET_BYTES / 1000:g} KB",
            "met": latency_met and weight_met,
        },
    )
    print(
        f"web: log line -> page median {page_median or 0:.3f} s (p90 {page_p90 or 0:.3f} s; "
        f"SSE client {sse_median or 0:.3f} s); job page {total:,} bytes "
        f"({', '.join(f['url'] for f in weight['files'])})"
    )
    return status_code or (0 if not problems else 1)


if __name__ == "__main__":
    sys.exit(main())
