// The job page: status, topology, per-node progress and utilisation, charts of a
// metric and of throughput per node (own inline SVG), merged logs with filters and
// search, attempts, root cause, the hang report, stragglers (on their rank chips),
// files, "Stop all". Everything comes from the API: the job's status (polled while it
// runs) and its event stream, which replays from the start, so a finished job's page
// is rebuilt the same way.
"use strict";

(() => {
  const { api, live, el, badge, flash, when, duration, pct } = corral;
  const page = document.getElementById("job");
  if (!page) return;

  const JOB = page.dataset.jobId;
  const FINAL = new Set(["succeeded", "failed", "timed_out", "cancelled", "lost"]);
  const MAX_LINES = 20000;         // log lines kept in the DOM
  const FRAME_BUDGET_MS = 10;      // log lines built per frame: about this long
  const CHUNK_LINES = 200;         // log lines per chunk (the unit the browser skips)
  const STATUS_EVERY_MS = 2000;    // status poll while the job is not final
  const LOAD_EVERY_MS = 5000;      // machines' load while the job runs
  const FILES_EVERY_MS = 10000;    // file list while the job runs
  const CHART_EVERY_MS = 500;      // charts redraw at most twice a second
  const RATE_WINDOW_S = 3;         // throughput: steps over the last seconds
  const MAX_POINTS = 4000;         // per series, then every other point is dropped
  const COLORS = ["#1f6fd1", "#c62828", "#1a7f37", "#8250df", "#bc4c00", "#0a7a8a",
    "#7d4e24", "#bf3989"];
  const DASHES = ["", "7 4", "2 3"];
  const DASH_CSS = ["solid", "dashed", "dotted"];
  const SIGNALS = { 1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 6: "SIGABRT", 9: "SIGKILL",
    11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM" };
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;

  // -- the page's model ---------------------------------------------------------------
  const job = {
    status: null,          // the last DistributedJobStatus
    state: null,           // the job's state word shown
    final: false,          // the job has ended (from its status or its final event)
    streamDone: false,     // the event stream delivered finished / error / lost
    stopping: false,
    t0: null,              // time origin of the charts
    attempt: 0,            // the attempt the ranks' progress belongs to
    breaks: [],            // start times of later attempts: the chart lines break there
    stragglers: new Map(), // "host:rank" -> the stragglers named there (status, events)
    odd: new Map(),        // "host:rank" -> the hang report's odd one out there
  };
  const nodes = new Map();  // host -> node model (see nodeOf)
  const metricNames = [];   // numeric metrics seen, in order
  let chartMetric = "";     // the metric drawn ("" until one is seen)
  let chartMetricChosen = false;
  let chartX = "step";      // the charts' x axis: "step" (when known) or "time"

  function hostIndex(host) {
    return nodeOf(host).index;
  }

  function nodeOf(host) {
    let node = nodes.get(host);
    if (node) return node;
    node = {
      host, index: nodes.size, nodeRank: null, machineId: null, ranks: [], status: "pending",
      detail: "", master: false, step: null, total: null, liveRate: null,
      metrics: {}, rankInfo: new Map(), samples: [], series: new Map(), throughput: [],
      rateBucket: -Infinity, load: null, loadChecked: null, dom: null,
    };
    nodes.set(host, node);
    node.dom = nodeCard(node);
    $("nodes").append(node.dom.card);
    addOption($("log-host"), host, host);
    markNodes();
    return node;
  }

  // a new attempt: its ranks start again (from step 0 or a checkpoint); the chart lines
  // go on in time
  function newAttempt(number, time) {
    if (number <= job.attempt) return;
    job.attempt = number;
    if (time) job.breaks.push(time);
    for (const node of nodes.values()) {
      node.rankInfo.clear();
      node.step = null;
      node.samples = [];
      node.liveRate = null;
      node.rateBucket = -Infinity;
    }
    markNodes();
  }

  function rankOf(node, rank) {
    let info = node.rankInfo.get(rank);
    if (!info) {
      info = { step: null, total: null, code: null, metrics: {} };
      node.rankInfo.set(rank, info);
    }
    return info;
  }

  // the rank whose metrics stand for its node in the chart: its lowest
  function refRank(node) {
    if (node.ranks.length) return Math.min(...node.ranks);
    let low = null;
    for (const r of node.rankInfo.keys()) if (low === null || r < low) low = r;
    return low;
  }

  // -- small helpers --------------------------------------------------------------------
  function addOption(select, value, text) {
    for (const opt of select.options) if (opt.value === String(value)) return;
    const opt = el("option", { value: String(value) }, text);
    const after = [...select.options].slice(1).find((o) => compareValues(o.value, String(value)) > 0);
    select.insertBefore(opt, after || null);
  }

  function compareValues(a, b) {
    const na = Number(a); const nb = Number(b);
    if (a !== "" && b !== "" && !Number.isNaN(na) && !Number.isNaN(nb)) return na - nb;
    return a < b ? -1 : a > b ? 1 : 0;
  }

  function fmtNumber(v) {
    if (v === null || v === undefined || Number.isNaN(Number(v))) return "–";
    const n = Number(v);
    if (Number.isInteger(n)) return String(n);
    const a = Math.abs(n);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return n.toExponential(2);
    const text = a >= 100 ? n.toFixed(1) : n.toPrecision(4);
    return text.includes(".") ? text.replace(/\.?0+$/, "") : text;
  }

  // a rank's end: its exit code, or the signal that killed it (a negative code, or the
  // signal's name when the server gives it)
  function exitText(code, signal) {
    const number = typeof code === "number" && code < 0 ? -code : null;
    if (signal || number) {
      const name = signal || SIGNALS[number] || "a signal";
      return `killed by ${name}${number ? ` (signal ${number})` : ""}`;
    }
    if (code === null || code === undefined) return "–";
    return `exit code ${code}`;
  }

  function lines(value) {
    if (value === null || value === undefined) return [];
    if (Array.isArray(value)) return value.map(String);
    return String(value).replace(/\n$/, "").split("\n");
  }

  // -- frame scheduling: logs and node cards render at most once per frame ----------------
  let frameQueued = false;
  let nodesDirty = false;
  function queueFrame() {
    if (frameQueued) return;
    frameQueued = true;
    requestAnimationFrame(() => {
      frameQueued = false;
      flushLogs();
      if (nodesDirty) {
        nodesDirty = false;
        for (const node of nodes.values()) renderNode(node);
      }
    });
  }
  function markNodes() { nodesDirty = true; queueFrame(); }

  // -- status -----------------------------------------------------------------------------
  function setState(state, reason) {
    if (!state) return;
    job.state = state;
    $("job-status").replaceChildren(badge(state));
    // a success needs no reason (the last one may be an earlier attempt's)
    if (state === "succeeded") $("job-reason").textContent = "";
    else if (reason !== undefined) $("job-reason").textContent = reason ? `— ${reason}` : "";
    if (FINAL.has(state)) {
      job.final = true;
      job.stopping = false;
    }
    renderStop();
  }

  function applyStatus(st) {
    job.status = st;
    // a job's output (its log lines and files) is its owner's and the admins' only
    const body = document.body.dataset;
    if (body.role !== "admin" && st.owner !== body.user) {
      $("logs-empty").textContent = `The output of this job is shown to its owner (${st.owner || "nobody"}) and admins only.`;
    }
    // a final state known from the event stream is kept over a status the store has
    // not caught up with yet
    if (!(job.final && !FINAL.has(st.status))) {
      if (job.stopping && !FINAL.has(st.status)) setState("stopping", "stopping…");
      else setState(st.status, st.reason);
    }
    if (job.t0 === null && st.started) job.t0 = st.started;
    renderFacts(st);
    for (const n of st.nodes || []) {
      const node = nodeOf(n.host);
      node.nodeRank = n.node_rank;
      node.machineId = n.machine_id;
      node.ranks = n.ranks || [];
      node.status = n.status || node.status;
      node.detail = n.detail || "";
      node.master = n.host === st.master;
      node.start = n.start_time;
      node.end = n.end_time;
      for (const r of node.ranks) addOption($("log-rank"), r, `${r} · ${n.host}`);
      const p = n.progress || {};
      if (p.step !== undefined && p.step !== null && (node.step === null || p.step >= node.step)) {
        node.step = p.step;
        if (p.total) node.total = p.total;
        if (p.metrics && Object.keys(p.metrics).length) node.metrics = p.metrics;
      }
      for (const [r, info] of Object.entries(p.ranks || {})) {
        const mine = rankOf(node, Number(r));
        if (info.step !== undefined && (mine.step === null || info.step >= mine.step)) mine.step = info.step;
        if (info.total) mine.total = info.total;
        if (info.code !== undefined && info.code !== null) mine.code = info.code;
        if (info.metrics && info.metrics.gpu) mine.gpu = info.metrics.gpu;
      }
    }
    renderTopology(st);
    renderAttempts(st.attempts || []);
    renderGroups(st.groups || []);
    job.stragglers.clear();
    for (const s of st.stragglers || []) noteStraggler(s);
    renderHang(st.hang || null);
    renderRootCause(st);
    renderWeights(st.workload_weights || []);
    renderPreflight(st.preflight || []);
    markNodes();
  }

  // the ranks' workload weights (a calibrated job), rebuilt only when they change
  let weightsShown = "";
  function renderWeights(rows) {
    const key = JSON.stringify(rows);
    if (key === weightsShown) return;
    weightsShown = key;
    $("weights").hidden = !rows.length;
    $("weights-body").replaceChildren(...(rows.length ? [corral.weightsTable(rows, "job-weights")] : []));
  }

  // the pre-flight's findings (warnings did not block the launch), as corral job status
  // and corral run show them
  let preflightShown = "";
  function renderPreflight(findings) {
    const key = JSON.stringify(findings);
    if (key === preflightShown) return;
    preflightShown = key;
    $("preflight").hidden = !findings.length;
    $("preflight").replaceChildren(...findings.map((f) => el("li", { class: f.status },
      `pre-flight ${f.name}: ${f.message}${f.fix_command ? ` (fix: ${f.fix_command})` : ""}`)));
  }

  function renderFacts(st) {
    const started = st.started || null;
    const ended = st.ended || null;
    let took = null;
    if (started) took = (ended || Date.now() / 1000) - started;
    const facts = [
      ["Name", st.name || "–"],
      ["Owner", st.owner || "–"],
      ["Priority", String(st.priority ?? 0)],
      ...((st.after || []).length ? [["After", `${st.after.join(", ")} succeed`]] : []),
      ["Kind", st.kind],
      ["World size", String(st.world_size)],
      ["Machines", (st.machines || []).join(", ") || "–"],
      ["Attempt", `${st.attempt}${st.restarts ? ` (${st.restarts} restart${st.restarts > 1 ? "s" : ""})` : ""}`],
      ["Created", when(st.created)],
      ["Started", when(started)],
      [ended ? "Ended" : "Running for", ended ? `${when(ended)} (${duration(took)})` : duration(took)],
      ["Exit code", st.exit_code === null || st.exit_code === undefined ? "–" : String(st.exit_code)],
    ];
    $("job-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k),
      el("dd", { "data-fact": k.toLowerCase().replace(/ /g, "-") }, v)]));
  }

  function renderTopology(st) {
    const list = st.nodes || [];
    const ranks = list.reduce((a, n) => a + (n.ranks || []).length, 0);
    $("topology").replaceChildren(
      "Master ", el("strong", {}, st.master || "–"),
      ` · ${list.length} node${list.length === 1 ? "" : "s"} · ${ranks || st.world_size} rank${(ranks || st.world_size) === 1 ? "" : "s"}`,
    );
  }

  // -- node cards ------------------------------------------------------------------------------
  function nodeCard(node) {
    const color = COLORS[node.index % COLORS.length];
    const swatch = el("span", { class: "swatch", "aria-hidden": "true" });
    swatch.style.borderTopColor = color;
    swatch.style.borderTopStyle = DASH_CSS[node.index % DASH_CSS.length];
    const title = el("strong", {}, node.host);
    const role = el("span", { class: "muted" });
    const state = el("span", { class: "node-state" });
    const labelId = `node-progress-${node.index}`;
    const bar = el("progress", { max: "1", value: "0", "aria-label": `Progress of ${node.host}`, "aria-describedby": labelId });
    const label = el("div", { class: "prog-label mono", id: labelId }, "no progress reported yet");
    const ranks = el("div", { class: "rank-chips" });
    const metrics = el("div", { class: "node-metrics mono" });
    const load = el("div", { class: "node-load" });
    const card = el("article", { class: "node", "data-node": node.host },
      el("header", { class: "row" }, swatch, title, role, state),
      ranks, bar, label, metrics, load);
    return { card, swatch, role, state, bar, label, ranks, metrics, load };
  }

  // a rank's GPU sample (NVML, sent with its progress): "GPU 0 87% 31.2 GiB 71°C"
  function gpuText(g) {
    const bits = [`GPU ${g.index}`];
    if (g.util !== null && g.util !== undefined) bits.push(`${g.util}%`);
    if (g.mem_used_mib !== null && g.mem_used_mib !== undefined) bits.push(`${(g.mem_used_mib / 1024).toFixed(1)} GiB`);
    if (g.temp_c !== null && g.temp_c !== undefined) bits.push(`${g.temp_c}°C`);
    return bits.join(" ");
  }

  // the node's steps/s: the throughput chart's own last point (one source: a card never
  // shows a rate the chart has no line for, e.g. a job that ended after a burst of reports)
  function rateOf(node) {
    return node.throughput.length ? node.liveRate : null;
  }

  function renderNode(node) {
    const d = node.dom;
    const parts = [];
    if (node.nodeRank !== null) parts.push(`node ${node.nodeRank}`);
    if (node.master) parts.push("master");
    if (node.ranks.length) parts.push(`ranks ${node.ranks.join(", ")}`);
    d.role.textContent = parts.join(" · ");
    if (d.state.dataset.state !== node.status) {
      d.state.dataset.state = node.status;
      d.state.replaceChildren(badge(node.status));
    }
    d.state.title = node.detail || "";
    // progress bar and its label
    if (node.step !== null && node.total) {
      d.bar.max = node.total;
      d.bar.value = Math.min(node.step, node.total);
    } else if (node.step !== null) {
      d.bar.removeAttribute("value");  // no total: indeterminate
    }
    if (node.step !== null) {
      const bits = [`step ${node.step}${node.total ? ` / ${node.total}` : ""}`];
      if (node.total) bits.push(`${((100 * node.step) / node.total).toFixed(0)}%`);
      const rate = rateOf(node);
      if (rate) bits.push(`${fmtNumber(rate)} steps/s`);
      const ended = job.final || FINAL.has(node.status) || ["exited", "failed", "terminated"].includes(node.status);
      if (!ended && rate && node.total && node.step < node.total) {
        bits.push(`ETA ${duration((node.total - node.step) / rate)}`);
      }
      d.label.textContent = bits.join(" · ");
    }
    const metricText = Object.entries(node.metrics || {})
      .filter(([k, v]) => v !== null && v !== undefined && k !== "gpu")
      .map(([k, v]) => `${k} ${typeof v === "number" ? fmtNumber(v) : String(v)}`);
    d.metrics.textContent = metricText.length ? metricText.join(" · ") : "";
    // ranks
    const chips = [];
    const all = new Set([...node.ranks, ...node.rankInfo.keys()]);
    for (const r of [...all].sort((a, b) => a - b)) {
      const info = node.rankInfo.get(r);
      let text = `rank ${r}`;
      let cls = "chip";
      if (info && info.step !== null) text += `: step ${info.step}`;
      if (info && info.gpu) text += ` · ${gpuText(info.gpu)}`;
      // diagnosis: a straggler named on this rank, the hang report's odd one out
      const slow = job.stragglers.get(`${node.host}:${r}`) || [];
      for (const s of slow) text += ` · straggler: ${s.section} ${Number(s.ratio).toFixed(1)}x`;
      if (slow.length) cls += " slow";
      const odd = job.odd.get(`${node.host}:${r}`);
      if (odd) { text += " · odd one out"; cls += " bad"; }
      if (info && info.code !== null && info.code !== undefined) {
        text += info.code === 0 ? " ✓ exited 0" : ` ✕ ${exitText(info.code)}`;
        cls += info.code === 0 ? " ok" : " bad";
      }
      const title = [...slow.map((s) => s.text), odd ? `hang: at ${odd.where}` : ""].filter(Boolean).join("\n");
      chips.push(el("span", { class: cls, "data-rank": String(r), title: title || null }, text));
    }
    d.ranks.replaceChildren(...chips);
    // machine load
    if (node.load && !job.final) {
      const l = node.load;
      const bits = [`CPU ${pct(l.cpu_percent)}`, `memory ${pct(l.memory_percent)}`];
      for (const g of l.gpus || []) {
        const mem = g.memory_used_mib === null || g.memory_used_mib === undefined ? ""
          : ` (${(g.memory_used_mib / 1024).toFixed(1)} GiB)`;
        bits.push(`GPU ${g.index} ${pct(g.utilization_percent)}${mem}`);
      }
      d.load.replaceChildren(el("span", {}, bits.join(" · ")),
        el("span", { class: "muted" }, ` — checked ${corral.ago(node.loadChecked)}`));
    } else if (job.final) {
      d.load.replaceChildren();
    }
  }

  // -- progress events: bars, chart series -------------------------------------------------
  function onProgress(ev) {
    if (ev.host === undefined || ev.host === null) return;
    const node = nodeOf(ev.host);
    const rank = ev.rank ?? -1;
    const info = rankOf(node, rank);
    if (ev.step !== undefined && ev.step !== null) info.step = ev.step;
    if (ev.total) info.total = ev.total;
    info.metrics = ev.metrics || {};
    if (ev.gpu) info.gpu = ev.gpu;
    if (rank >= 0) addOption($("log-rank"), rank, `${rank} · ${ev.host}`);
    // the node's step: its slowest rank
    let step = null; let total = null;
    for (const r of node.rankInfo.values()) {
      if (r.step === null) continue;
      step = step === null ? r.step : Math.min(step, r.step);
      if (r.total) total = Math.max(total || 0, r.total);
    }
    const t = ev.time || Date.now() / 1000;
    if (job.t0 === null) job.t0 = t;
    if (step !== null) {
      node.step = step;
      if (total) node.total = total;
      throughputSample(node, t, step);
    }
    if (rank === refRank(node)) {
      node.metrics = ev.metrics || {};
      for (const [name, value] of Object.entries(ev.metrics || {})) {
        if (typeof value !== "number" || !Number.isFinite(value)) continue;
        if (!metricNames.includes(name)) addMetric(name);
        let pts = node.series.get(name);
        if (!pts) { pts = []; node.series.set(name, pts); }
        pushPoint(pts, t, value, ev.step ?? null);
      }
    }
    markNodes();
    markChart();
  }

  function throughputSample(node, t, step) {
    const s = node.samples;
    if (s.length && step <= s[s.length - 1][1]) return;
    s.push([t, step]);
    // keep one sample older than the window as the base
    while (s.length > 2 && s[1][0] <= t - RATE_WINDOW_S) s.shift();
    const base = s[0];
    const dt = t - base[0];
    if (s.length < 2 || dt < 0.05) return;
    const rate = (step - base[1]) / dt;
    node.liveRate = rate;
    const pts = node.throughput;
    // one point per quarter second at most: a newer rate replaces the point of its bucket
    if (pts.length && t - node.rateBucket < 0.25) {
      pts[pts.length - 1] = [t, rate, step];
    } else {
      node.rateBucket = t;
      pushPoint(pts, t, rate, step);
    }
  }

  // a point: [time, value, step (null when unknown)]
  function pushPoint(pts, t, v, step) {
    pts.push([t, v, step]);
    if (pts.length > MAX_POINTS) {
      const kept = pts.filter((_, i) => i % 2 === 0 || i === pts.length - 1);
      pts.splice(0, pts.length, ...kept);
    }
  }

  function addMetric(name) {
    metricNames.push(name);
    const select = $("chart-metric");
    if (metricNames.length === 1) select.replaceChildren();
    select.append(el("option", { value: name }, name));
    if (!chartMetricChosen && (chartMetric === "" || (name === "loss" && chartMetric !== "loss"))) {
      chartMetric = name;
      select.value = name;
    }
  }

  // -- charts: inline SVG, redrawn at most every CHART_EVERY_MS ------------------------------
  let chartTimer = null;
  let lastDraw = 0;
  function markChart() {
    if (chartTimer !== null) return;
    const wait = Math.max(0, lastDraw + CHART_EVERY_MS - Date.now());
    chartTimer = setTimeout(() => {
      chartTimer = null;
      lastDraw = Date.now();
      drawCharts();
    }, wait);
  }

  function drawCharts() {
    const metricSeries = [];
    const rateSeries = [];
    for (const node of nodes.values()) {
      const pts = node.series.get(chartMetric);
      if (pts && pts.length) metricSeries.push({ node, pts });
      if (node.throughput.length) rateSeries.push({ node, pts: node.throughput });
    }
    // over steps when every point knows its step (a short job's loss is a line, not a
    // vertical stroke), else over time
    const all = [...metricSeries, ...rateSeries];
    const byStep = chartX === "step" && all.length > 0 &&
      all.every(({ pts }) => pts.every((p) => p[2] !== null && p[2] !== undefined));
    const none = job.final ? "no progress reported" : "waiting for progress…";
    drawChart($("chart"), metricSeries, chartMetric || "metric",
      job.final ? "no metrics reported" : "waiting for reported metrics…", false, byStep);
    drawChart($("throughput-chart"), rateSeries, "steps/s", none, true, byStep);
  }

  function svgEl(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // about `count` round tick values covering [lo, hi]
  function ticks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / Math.max(1, count);
    const mag = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) {
      out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    }
    return out;
  }

  function drawChart(box, series, yTitle, emptyText, fromZero, byStep) {
    const width = Math.max(260, box.clientWidth || 600);
    const height = width < 500 ? 170 : 200;
    const m = { l: 54, r: 12, t: 10, b: 36 };
    const w = width - m.l - m.r;
    const h = height - m.t - m.b;
    const svg = svgEl("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "plot",
      role: "img", "aria-label": `${yTitle} per node over ${byStep ? "steps" : "time"}`,
      "data-x": byStep ? "step" : "time" });
    const t0 = job.t0 ?? 0;
    const X = (p) => (byStep ? p[2] : p[0] - t0);
    let xmin = Infinity; let xmax = -Infinity; let ymin = Infinity; let ymax = -Infinity;
    for (const { pts } of series) {
      for (const p of pts) {
        const x = X(p);
        const v = p[1];
        if (x < xmin) xmin = x;
        if (x > xmax) xmax = x;
        if (v < ymin) ymin = v;
        if (v > ymax) ymax = v;
      }
    }
    if (!series.length) { xmin = 0; xmax = 60; ymin = 0; ymax = 1; }
    if (!byStep) xmin = Math.min(0, xmin);
    if (xmax - xmin < 1e-9) xmax = xmin + 1;
    if (ymax - ymin < 1e-12) { const pad = Math.abs(ymax) * 0.1 || 1; ymin -= pad; ymax += pad; }
    else { const pad = (ymax - ymin) * 0.05; ymin -= pad; ymax += pad; }
    const nonNegative = series.every(({ pts }) => pts.every(([, v]) => v >= 0));
    if (nonNegative && (fromZero || ymin < 0)) ymin = 0;
    const minutes = !byStep && xmax - xmin > 300;
    const xs = (x) => m.l + ((x - xmin) / (xmax - xmin)) * w;
    const ys = (y) => m.t + h - ((y - ymin) / (ymax - ymin)) * h;

    const axes = svgEl("g", { class: "axes" });
    for (const v of ticks(ymin, ymax, 4)) {
      const y = ys(v).toFixed(1);
      axes.append(svgEl("line", { x1: m.l, x2: m.l + w, y1: y, y2: y, class: "grid" }));
      axes.append(svgEl("text", { x: m.l - 6, y, class: "tick", "text-anchor": "end", "dominant-baseline": "middle" }, fmtNumber(v)));
    }
    const unit = minutes ? 60 : 1;
    for (const v of ticks(xmin / unit, xmax / unit, Math.max(2, Math.floor(w / 80)))) {
      const x = xs(v * unit).toFixed(1);
      axes.append(svgEl("line", { x1: x, x2: x, y1: m.t + h, y2: m.t + h + 4, class: "axis" }));
      axes.append(svgEl("text", { x, y: m.t + h + 16, class: "tick", "text-anchor": "middle" }, fmtNumber(v)));
    }
    axes.append(svgEl("line", { x1: m.l, x2: m.l + w, y1: m.t + h, y2: m.t + h, class: "axis" }));
    axes.append(svgEl("line", { x1: m.l, x2: m.l, y1: m.t, y2: m.t + h, class: "axis" }));
    axes.append(svgEl("text", { x: m.l + w / 2, y: height - 4, class: "title", "text-anchor": "middle" },
      byStep ? "step" : minutes ? "time since start (min)" : "time since start (s)"));
    axes.append(svgEl("text", { x: 12, y: m.t + h / 2, class: "title", "text-anchor": "middle",
      transform: `rotate(-90 12 ${m.t + h / 2})` }, yTitle));
    job.breaks.forEach((b, i) => {  // where each restart began (on the time axis)
      if (byStep) return;
      const x = b - t0;
      if (x < xmin || x > xmax) return;
      const px = xs(x).toFixed(1);
      axes.append(svgEl("line", { x1: px, x2: px, y1: m.t, y2: m.t + h, class: "restart" }));
      axes.append(svgEl("text", { x: Number(px) + 3, y: m.t + 10, class: "tick" }, `↻ attempt ${i + 1}`));
    });
    svg.append(axes);

    if (!series.length) {
      svg.append(svgEl("text", { x: m.l + w / 2, y: m.t + h / 2, class: "empty", "text-anchor": "middle" }, emptyText));
    }
    for (const { node, pts } of series) {
      let d = "";
      for (let i = 0; i < pts.length; i += 1) {
        const gap = i === 0 || job.breaks.some((b) => pts[i - 1][0] < b && b <= pts[i][0]);
        d += `${gap ? "M" : "L"}${xs(X(pts[i])).toFixed(1)} ${ys(pts[i][1]).toFixed(1)}`;
      }
      const path = svgEl("path", {
        d, "data-node": node.host, fill: "none", stroke: COLORS[node.index % COLORS.length],
        "stroke-width": 2, "stroke-linejoin": "round", "vector-effect": "non-scaling-stroke",
      });
      const dash = DASHES[node.index % DASHES.length];
      if (dash) path.setAttribute("stroke-dasharray", dash);
      path.append(svgEl("title", {}, `${node.host}: ${fmtNumber(pts[pts.length - 1][1])} ${yTitle}`));
      svg.append(path);
      if (pts.length === 1) {  // a lone point still shows
        svg.append(svgEl("circle", { cx: xs(X(pts[0])), cy: ys(pts[0][1]), r: 3,
          fill: COLORS[node.index % COLORS.length] }));
      }
    }
    const legend = el("ul", { class: "legend" }, ...[...nodes.values()].map((node) => {
      const sw = el("span", { class: "swatch", "aria-hidden": "true" });
      sw.style.borderTopColor = COLORS[node.index % COLORS.length];
      sw.style.borderTopStyle = DASH_CSS[node.index % DASH_CSS.length];
      const found = series.find((s) => s.node === node);
      const last = found ? ` ${fmtNumber(found.pts[found.pts.length - 1][1])}` : "";
      return el("li", {}, sw, node.host, el("span", { class: "muted" }, last));
    }));
    box.replaceChildren(svg, legend);
  }

  // -- logs: batched per animation frame, at most MAX_LINES in the DOM ------------------------
  const logBox = $("logs");
  let pending = [];
  let lineCount = 0;
  let dropped = 0;
  let follow = true;
  const filter = { host: "", rank: "" };
  const search = { query: "", matches: [], current: -1 };

  function onLog(ev) {
    const host = ev.host ?? "";
    const rank = ev.rank ?? -1;
    const text = String(ev.text ?? "").replace(/\r\n/g, "\n");
    const parts = text.split("\n");
    if (parts.length > 1 && parts[parts.length - 1] === "") parts.pop();
    for (const part of parts) {
      // a carriage return redraws the line on a terminal: keep what it would show
      const shown = part.includes("\r") ? part.slice(part.lastIndexOf("\r") + 1) : part;
      pending.push({ host, rank, text: shown });
    }
    if (pending.length > 2 * MAX_LINES) {
      dropped += pending.length - MAX_LINES;
      pending = pending.slice(-MAX_LINES);
    }
    if (host && rank >= 0) addOption($("log-rank"), rank, `${rank} · ${host}`);
    if (host) nodeOf(host);
    queueFrame();
  }

  // a line of corral's own in the log (the folded teardown output of a node)
  function onNote(text) {
    pending.push({ host: "", rank: -1, text, corral: true });
    queueFrame();
  }

  function lineVisible(host, rank) {
    return (!filter.host || filter.host === host) && (!filter.rank || filter.rank === rank);
  }

  // one line: built with plain DOM calls (thousands per second)
  function makeLine(item) {
    const rank = item.rank >= 0 ? String(item.rank) : "";
    const line = document.createElement("div");
    line.className = item.host ? `line h${hostIndex(item.host) % COLORS.length}` : "line";
    line.dataset.host = item.host;
    line.dataset.rank = rank;
    const prefix = document.createElement("span");
    prefix.className = "prefix";
    prefix.textContent = item.corral ? "[corral]" : rank ? `[${item.host}:${rank}]` : `[${item.host}]`;
    const msg = document.createElement("span");
    msg.className = "msg";
    msg.textContent = item.text;
    line.append(prefix, " ", msg);
    if (!lineVisible(item.host, rank)) line.hidden = true;
    return line;
  }

  // Lines live in chunks of CHUNK_LINES. Only the chunks near the log box's view are
  // rendered: the others are "far" (content-visibility: hidden, at their estimated
  // height), so a flood of lines costs the browser almost no layout. Nearness is the
  // box's own (an IntersectionObserver rooted at it), never the window's.
  const nearby = "IntersectionObserver" in window
    ? new IntersectionObserver((entries) => {
      for (const e of entries) e.target.classList.toggle("far", !e.isIntersecting);
    }, { root: logBox, rootMargin: "100% 0px" })
    : null;
  let lineHeight = 0;
  function sizeChunk(chunk) {
    if (!lineHeight) lineHeight = parseFloat(getComputedStyle(logBox).lineHeight) || 16;
    chunk.style.containIntrinsicBlockSize = `${Math.ceil(chunk.shown * lineHeight)}px`;
  }

  function newChunk() {
    const chunk = document.createElement("div");
    chunk.className = nearby ? "chunk far" : "chunk";  // the observer says when it is near
    chunk.total = 0;   // lines in it
    chunk.shown = 0;   // of which not filtered out
    logBox.append(chunk);
    if (nearby) nearby.observe(chunk);
    return chunk;
  }

  function* allLines() {
    for (const chunk of logBox.children) yield* chunk.children;
  }

  // drop the oldest lines beyond MAX_LINES
  function trimLines() {
    let excess = lineCount - MAX_LINES;
    if (excess <= 0) return;
    dropped += excess;
    lineCount -= excess;
    while (excess > 0) {
      const first = logBox.firstElementChild;
      if (first.total <= excess) {
        excess -= first.total;
        if (nearby) nearby.unobserve(first);
        first.remove();
        continue;
      }
      let shownGone = 0;
      for (let i = 0; i < excess; i += 1) if (!first.children[i].hidden) shownGone += 1;
      const range = document.createRange();
      range.setStartBefore(first.firstChild);
      range.setEndAfter(first.children[excess - 1]);
      range.deleteContents();
      first.total -= excess;
      first.shown -= shownGone;
      sizeChunk(first);
      excess = 0;
    }
    let gone = 0;
    while (search.matches.length && !search.matches[0].isConnected) { search.matches.shift(); gone += 1; }
    if (gone) search.current = Math.max(search.matches.length ? 0 : -1, search.current - gone);
  }

  // append what came since the last frame, within a time budget (the rest waits for the
  // next frame)
  function flushLogs() {
    if (!pending.length) return;
    if (pending.length > MAX_LINES) {
      dropped += pending.length - MAX_LINES;
      pending = pending.slice(-MAX_LINES);
    }
    const began = performance.now();
    const q = search.query;
    let newMatch = false;
    let done = 0;
    let chunk = logBox.lastElementChild;
    const touched = new Set();
    while (done < pending.length) {
      const stop = Math.min(pending.length, done + 200);
      for (; done < stop; done += 1) {
        const line = makeLine(pending[done]);
        if (!chunk || chunk.total >= CHUNK_LINES) chunk = newChunk();
        chunk.append(line);
        chunk.total += 1;
        if (!line.hidden) chunk.shown += 1;
        touched.add(chunk);
        if (q && !line.hidden && line.textContent.toLowerCase().includes(q)) {
          line.classList.add("match");
          search.matches.push(line);
          newMatch = true;
        }
      }
      if (performance.now() - began > FRAME_BUDGET_MS) break;
    }
    for (const c of touched) sizeChunk(c);
    pending = done < pending.length ? pending.slice(done) : [];
    lineCount += done;
    trimLines();
    $("logs-empty").hidden = lineCount > 0;
    if (dropped) {
      const trimmed = $("logs-trimmed");
      trimmed.hidden = false;
      trimmed.textContent = `Showing the last ${MAX_LINES.toLocaleString()} lines; ` +
        `${dropped.toLocaleString()} earlier lines are in the per-rank log files below.`;
    }
    if (q) {
      if (newMatch && search.current < 0) { search.current = 0; showMatch(); } else countMatches();
    }
    if (follow) {
      toEnd();
      // once the chunks on screen have their real height, the end may be further down
      requestAnimationFrame(() => { if (follow) toEnd(); });
    }
    if (pending.length) queueFrame();
  }

  // Following the end stops when the user scrolls up and starts again at the end. Only
  // an upward move counts: chunks taking their real height, or old lines dropped above,
  // also move the view without the user.
  let searchScrollAt = 0;  // a scroll the search made is not the user's
  let resizedAt = 0;       // nor one a resize of the window made
  let lastScrollTop = 0;
  window.addEventListener("resize", () => { resizedAt = Date.now(); });
  logBox.addEventListener("scroll", () => {
    const top = logBox.scrollTop;
    const up = top < lastScrollTop - 2;
    lastScrollTop = top;
    if (Date.now() - searchScrollAt < 150) return;
    if (Date.now() - resizedAt < 500) {
      if (follow) requestAnimationFrame(toEnd);
      return;
    }
    const atEnd = top + logBox.clientHeight >= logBox.scrollHeight - 24;
    if (atEnd) follow = true;
    else if (up) follow = false;
    $("logs-follow").hidden = follow;
  });
  function toEnd() {
    logBox.scrollTop = logBox.scrollHeight;
    lastScrollTop = logBox.scrollTop;
  }
  $("logs-follow").addEventListener("click", () => {
    follow = true;
    toEnd();
    $("logs-follow").hidden = true;
  });

  function applyFilter() {
    filter.host = $("log-host").value;
    filter.rank = $("log-rank").value;
    for (const chunk of logBox.children) {
      let shown = 0;
      for (const line of chunk.children) {
        line.hidden = !lineVisible(line.dataset.host, line.dataset.rank);
        if (!line.hidden) shown += 1;
      }
      chunk.shown = shown;
      sizeChunk(chunk);
    }
    runSearch();
    if (!search.query && follow) toEnd();
  }
  $("log-host").addEventListener("change", applyFilter);
  $("log-rank").addEventListener("change", applyFilter);

  // -- log search: every match marked, the current one highlighted and scrolled to ------------
  function clearCurrent() {
    const line = search.matches[search.current];
    if (!line) return;
    line.classList.remove("current");
    const msg = line.querySelector(".msg");
    const pre = line.querySelector(".prefix");
    for (const span of [msg, pre]) if (span && span.querySelector("mark")) span.textContent = span.textContent;
  }

  // the text searched for (case-insensitive; spaces count, so "step 7 " skips "step 70")
  function queryText() {
    const value = $("log-search").value;
    return value.trim() ? value.toLowerCase() : "";
  }

  function runSearch() {
    clearCurrent();
    for (const line of search.matches) line.classList.remove("match", "current");
    const wasSearching = Boolean(search.query);
    search.query = queryText();
    search.matches = [];
    search.current = -1;
    if (!search.query && wasSearching) {  // the search is over: back to the end
      follow = true;
      toEnd();
      $("logs-follow").hidden = true;
    }
    if (search.query) {
      for (const line of allLines()) {
        if (!line.hidden && line.textContent.toLowerCase().includes(search.query)) {
          line.classList.add("match");
          search.matches.push(line);
        }
      }
      if (search.matches.length) search.current = 0;
    }
    showMatch();
  }

  function countMatches() {
    const out = $("search-count");
    if (!search.query) { out.textContent = ""; return; }
    out.textContent = `${search.current + 1}/${search.matches.length}`;
    out.classList.toggle("none", search.matches.length === 0);
  }

  function markIn(span, query) {
    const text = span.textContent;
    const at = text.toLowerCase().indexOf(query);
    if (at < 0) return false;
    span.replaceChildren(text.slice(0, at), el("mark", {}, text.slice(at, at + query.length)),
      text.slice(at + query.length));
    return true;
  }

  function showMatch() {
    countMatches();
    const line = search.matches[search.current];
    if (!line) return;
    line.classList.add("current");
    const msg = line.querySelector(".msg");
    if (!markIn(msg, search.query)) markIn(line.querySelector(".prefix"), search.query);
    follow = false;
    // centre the line in the log box (not the page)
    const box = logBox.getBoundingClientRect();
    const at = line.getBoundingClientRect();
    const top = logBox.scrollTop + (at.top - box.top) - logBox.clientHeight / 2 + at.height / 2;
    searchScrollAt = Date.now();
    logBox.scrollTop = Math.max(0, top);
    $("logs-follow").hidden = false;
    const r = logBox.getBoundingClientRect();
    if (r.bottom < 0 || r.top > window.innerHeight) logBox.scrollIntoView({ block: "nearest" });
  }

  function step(delta) {
    if (!search.matches.length) return;
    clearCurrent();
    const n = search.matches.length;
    search.current = ((search.current < 0 ? 0 : search.current + delta) % n + n) % n;
    showMatch();
  }

  let searchTimer = null;
  $("log-search").addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(runSearch, 150);
  });
  $("log-search").addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    ev.preventDefault();
    if (queryText() !== search.query) { clearTimeout(searchTimer); runSearch(); return; }
    step(ev.shiftKey ? -1 : 1);
  });
  $("search-next").addEventListener("click", () => {
    if (queryText() !== search.query) runSearch(); else step(1);
  });
  $("search-prev").addEventListener("click", () => {
    if (queryText() !== search.query) runSearch(); else step(-1);
  });

  // -- attempts, root cause, files ---------------------------------------------------------------
  function renderAttempts(attempts) {
    const body = $("attempts").tBodies[0];
    if (!attempts.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: "6", class: "muted" }, "No attempt yet.")));
      return;
    }
    body.replaceChildren(...attempts.map((a) => {
      const rec = a.record || {};
      let result = "running";
      if (a.ended) {
        result = rec.state || "ended";
        if (rec.exit_code !== null && rec.exit_code !== undefined) result += ` (exit ${rec.exit_code})`;
      }
      const restart = a.ended === null || a.ended === undefined ? "–"
        : `${a.restart ? "restarted" : "no restart"}${a.decision ? `: ${a.decision}` : ""}`;
      return el("tr", { "data-attempt": String(a.number) },
        el("td", { "data-label": "#" }, String(a.number)),
        el("td", { "data-label": "Hosts" }, (a.hosts || []).join(", ")),
        el("td", { "data-label": "Started" }, when(a.started)),
        el("td", { "data-label": "Ended" }, a.ended ? when(a.ended) : "–"),
        el("td", { "data-label": "Result" }, result),
        el("td", { "data-label": "Restart / cause" }, el("div", {}, el("div", {}, restart),
          a.cause && rec.state !== "succeeded" ? el("div", { class: "muted" }, `cause: ${a.cause}`) : null)));
    }));
  }

  // in-place recovery: each replica group's loss, restart and rejoin, from the stored events
  function groupText(g) {
    let text = `node ${g.host} (group ${g.group}) ${g.change}`;
    if (g.step !== null && g.step !== undefined) text += ` at step ${g.step}`;
    if (g.healed_from) text += `, healed from ${g.healed_from}`;
    text += `; ${g.participants} group${g.participants === 1 ? "" : "s"} training`;
    return text;
  }

  function renderGroups(changes) {
    $("groups-card").hidden = !changes.length;
    $("groups-timeline").replaceChildren(...changes.map((g) => el("li", { "data-change": g.change },
      el("span", { class: "muted" }, when(g.time)), " ", groupText(g),
      g.detail && g.change !== "rejoined" ? el("div", { class: "muted" }, g.detail) : null)));
  }

  // a straggler named (status or live event): kept per rank and section, shown on its chip
  function noteStraggler(s) {
    const key = `${s.host}:${s.rank}`;
    const list = (job.stragglers.get(key) || []).filter((o) => o.section !== s.section);
    job.stragglers.set(key, [...list, s]);
    markNodes();
  }

  // the last hang report: its summary, the odd ones out, the stuck collective, the files
  let hangShown = "";
  function renderHang(h) {
    const key = JSON.stringify(h);
    if (key === hangShown) return;
    hangShown = key;
    job.odd.clear();
    $("hang").hidden = !h;
    if (!h) { $("hang-body").replaceChildren(); return; }
    for (const o of h.odd || []) job.odd.set(`${o.host}:${o.rank}`, o);
    const parts = [el("p", { class: "rc-message" }, h.summary)];
    if (h.message) parts.push(el("p", { class: "muted" }, `detected: ${h.message}`));
    if ((h.odd || []).length) {
      parts.push(el("ul", { class: "hang-odd" }, ...h.odd.map((o) => el("li", { "data-rank": String(o.rank) },
        `odd one out: rank ${o.rank} on ${o.host} at `, el("code", {}, o.where),
        (o.frames || []).length ? el("pre", { class: "rc-trace" }, o.frames.join("\n")) : null))));
    }
    const c = h.collective;
    if (c) {
      const who = (c.missing_ranks || []).join(", ");
      const others = (c.mismatched || []).map((m) => `rank ${m.rank} was in ${m.collective} instead`).join("; ");
      const said = others && !who ? others : `never entered by ranks ${who || "–"}`;
      parts.push(el("p", { class: "hang-collective" },
        `collective ${c.collective} #${c.sequence} (group ${c.group}${c.state ? `, ${c.state}` : ""}): ${said}`));
    }
    if (h.report) {
      const inRun = /(^|\/)hang\/report\.md$/.test(h.report);
      parts.push(el("p", { class: "muted" }, "Report: ",
        inRun ? fileLink("hang/report.md", "report.md") : el("span", { class: "mono" }, h.report),
        inRun ? " · " : null, inRun ? fileLink("hang/report.json", "report.json") : null));
    }
    $("hang-body").replaceChildren(...parts);
    markNodes();
  }

  function renderRootCause(st) {
    const rc = st.root_cause;
    const box = $("root-cause");
    // a stop by the user is no failure: its "root cause" (interrupted) names no rank
    const none = !rc || st.status === "succeeded" || (st.status === "cancelled" && !rc.host);
    if (none) { box.hidden = true; return; }
    box.hidden = false;
    const facts = [];
    if (rc.host) facts.push(["Host", rc.host]);
    if (rc.rank !== null && rc.rank !== undefined) facts.push(["Rank", String(rc.rank)]);
    const code = rc.code ?? rc.exit_code;
    if (rc.signal || (code !== null && code !== undefined)) {
      let text = exitText(code, rc.signal);
      if ((rc.signal || code < 0) && rc.exit_code !== null && rc.exit_code !== undefined) {
        text += `, exit status ${rc.exit_code}`;
      }
      facts.push(["Exit", text]);
    }
    if (rc.time) facts.push(["When", when(rc.time)]);
    const parts = [];
    if (rc.message) parts.push(el("p", { class: "rc-message" }, rc.message));
    if (facts.length) {
      parts.push(el("dl", { class: "facts" }, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k.toLowerCase() }, v)])));
    }
    const tb = lines(rc.traceback);
    const err = lines(rc.stderr_tail);
    const log = lines(rc.log_tail);
    if (tb.length) parts.push(el("h3", {}, "Traceback"), el("pre", { class: "rc-trace" }, tb.join("\n")));
    else if (err.length) {
      // a hang's tail is a stack, not stderr: the failure says what it holds
      const label = rc.tail ? rc.tail.charAt(0).toUpperCase() + rc.tail.slice(1) : "Last lines of stderr";
      parts.push(el("h3", {}, label), el("pre", { class: "rc-trace" }, err.join("\n")));
    }
    if (log.length) {
      const det = el("details", {}, el("summary", {}, `Last ${log.length} log lines of rank ${rc.rank ?? "?"}`),
        el("pre", {}, log.join("\n")));
      if (!tb.length && !err.length) det.open = true;
      parts.push(det);
    }
    $("root-cause-body").replaceChildren(...parts);
  }

  function fileLink(path, text) {
    const href = `/api/network/local_job_file/${enc(JOB)}/${path.split("/").map(enc).join("/")}`;
    return el("a", { href, download: `${JOB}-${path.replace(/\//g, "_")}` }, text);
  }

  async function loadFiles() {
    let files;
    try {
      files = await api("GET", `/api/jobs/${enc(JOB)}/files`);
    } catch (e) {
      return;
    }
    const rankLogs = [];
    const other = [];
    for (const f of files) {
      const m = /^logs\/(.+)\.(\d+)\.log$/.exec(f);
      if (m) rankLogs.push({ f, host: m[1], rank: Number(m[2]) });
      else other.push(f);
    }
    rankLogs.sort((a, b) => a.rank - b.rank);
    const out = [];
    if (rankLogs.length) {
      out.push(el("h3", {}, "Per-rank logs"), el("ul", { class: "files rank-logs" },
        ...rankLogs.map((r) => el("li", {}, fileLink(r.f, `${r.host} · rank ${r.rank}`), " ",
          el("span", { class: "muted mono" }, r.f)))));
    }
    if (other.length) {
      out.push(el("details", {}, el("summary", {}, `Other files of the run (${other.length})`),
        el("ul", { class: "files" }, ...other.map((f) => el("li", {}, fileLink(f, f))))));
    }
    if (!out.length) out.push(el("p", { class: "muted" }, "No files yet."));
    const box = $("files");
    const open = box.querySelector("details")?.open;
    box.replaceChildren(...out);
    if (open) box.querySelector("details").open = true;
  }

  // -- stop -------------------------------------------------------------------------------------
  function renderStop() {
    const btn = $("stop-all");
    if (!btn) return; // the role may not stop jobs: the page has no button
    btn.hidden = job.final || job.state === null;
    btn.disabled = job.stopping;
    btn.textContent = job.stopping ? "Stopping…" : "Stop all";
    // an ended job can be submitted again, as it was (Resubmit) or changed (Clone)
    $("resubmit").hidden = !job.final;
    $("clone").hidden = !job.final;
  }

  if ($("resubmit")) $("resubmit").addEventListener("click", async () => {
    $("resubmit").disabled = true;
    try {
      const out = await api("POST", `/api/jobs/${enc(JOB)}/resubmit`);
      flash(`Resubmitted as ${out.job_id}${out.reason ? `: ${out.reason}` : ""}.`, "ok");
      location.href = `/jobs/${enc(out.job_id)}`;
    } catch (e) {
      flash(`Resubmit failed: ${e.message}`, "error");
      $("resubmit").disabled = false;
    }
  });

  const dialog = $("stop-dialog");
  if (dialog) $("stop-all").addEventListener("click", () => {
    if (typeof dialog.showModal === "function") dialog.showModal();
    else dialog.setAttribute("open", "");
  });
  if (dialog) $("stop-cancel").addEventListener("click", () => dialog.close());
  if (dialog) $("stop-confirm").addEventListener("click", async () => {
    dialog.close();
    job.stopping = true;
    setState("stopping", "stopping…");
    try {
      const out = await api("POST", `/api/network/distributed/stop/${enc(JOB)}`);
      flash(out.message || "Stopping every node…", "info");
      if (FINAL.has(out.status)) setState(out.status);
    } catch (e) {
      job.stopping = false;
      flash(`Stop failed: ${e.message}`, "error");
    }
    renderStop();
    pollStatus();
  });

  // -- the event stream -----------------------------------------------------------------------
  let source = null;
  let refreshTimer = null;

  function refreshSoon() {  // attempts and node states come with the status
    if (refreshTimer !== null) return;
    refreshTimer = setTimeout(() => { refreshTimer = null; pollStatus(); }, 300);
  }

  function closeStream() {
    if (source) { source.close(); source = null; }
  }

  // the job ended: its status once more (until the store has the final state), files
  async function settle(tries = 0) {
    closeStream();
    const st = await pollStatus();
    if (st && !FINAL.has(st.status) && tries < 20) {
      setTimeout(() => settle(tries + 1), 500);
      return;
    }
    loadFiles();
    markNodes();
    markChart();
  }

  let messageLevel = "info";
  function showMessage(text, level) {
    messageLevel = level;
    const box = $("job-message");
    box.textContent = text;
    box.hidden = !text;
    box.className = level === "error" ? "error" : level === "warning" ? "warn" : "muted";
  }

  function openStream() {
    source = live(`/api/jobs/${enc(JOB)}/events`, {
      state: (ev) => {
        if (messageLevel !== "error" && messageLevel !== "warning") showMessage("", "info");
        if (job.final) return;  // replayed history of a job that has ended
        if (job.stopping && !FINAL.has(ev.state)) return;
        setState(ev.state, ev.reason);
      },
      node: (ev) => {
        const node = nodeOf(ev.host);
        node.status = ev.state;
        node.detail = ev.detail || "";
        markNodes();
      },
      progress: onProgress,
      log: onLog,
      // "detail": a note that belongs with the log lines (a node's folded teardown)
      message: (ev) => (ev.level === "detail" ? onNote(ev.text) : showMessage(ev.text, ev.level)),
      checked: (ev) => {
        const checks = ((ev.report || {}).checks || []).filter((c) => c.status === "fail" || c.status === "warn");
        const text = ev.blocking ? "pre-flight checks refused the launch"
          : checks.length ? `pre-flight checks passed with ${checks.length} warning${checks.length === 1 ? "" : "s"}`
            : "pre-flight checks passed";
        showMessage(text, ev.blocking ? "error" : checks.length ? "warning" : "info");
        refreshSoon();  // the findings come with the status
      },
      attempt_started: (ev) => {
        newAttempt(ev.number, ev.time);
        showMessage(`attempt ${ev.number} started on ${(ev.hosts || []).join(", ")} (${ev.world_size} ranks)`, "info");
        refreshSoon();
      },
      attempt_ended: () => refreshSoon(),
      group: (ev) => {
        const level = ev.change === "rejoined" ? "success" : ev.change === "fallback" ? "error" : "warning";
        showMessage(groupText(ev), level);
        refreshSoon();  // the timeline comes with the status
      },
      straggler: (ev) => {
        noteStraggler(ev);
        showMessage(ev.text, "warning");
      },
      hang_report: (ev) => {
        showMessage(`hang report: ${ev.summary}`, "error");
        refreshSoon();  // the report comes with the status
      },
      rank_exit: (ev) => {
        const info = rankOf(nodeOf(ev.host), ev.rank);
        info.code = ev.code;
        markNodes();
      },
      finished: (ev) => {
        job.streamDone = true;
        setState(ev.state);
        settle();
      },
      lost: (ev) => {
        job.streamDone = true;
        setState("lost", ev.reason);
        settle();
      },
    });
    // "error" is both the server's event (with data) and the connection's (without)
    source.addEventListener("error", (ev) => {
      if (ev.data) {
        let data = {};
        try { data = JSON.parse(ev.data); } catch (e) { data = { message: ev.data }; }
        job.streamDone = true;
        showMessage(data.message || "the job ended with an error", "error");
        settle();
      } else if (job.final) {
        // the stream of an ended job closes after its last event: do not reconnect
        closeStream();
        settle();
      }
    });
  }

  // -- polling ------------------------------------------------------------------------------------
  let statusBusy = false;
  async function pollStatus() {
    if (statusBusy) return job.status;
    statusBusy = true;
    try {
      const st = await api("GET", `/api/jobs/${enc(JOB)}`);
      applyStatus(st);
      return st;
    } catch (e) {
      if (e.status === 404) {
        flash(`No job ${JOB} on this server.`, "error");
        $("job-status").replaceChildren(el("span", { class: "badge s-unknown" }, "? not found"));
        job.final = true;
        closeStream();
      }
      return null;
    } finally {
      statusBusy = false;
    }
  }

  function every(ms, fn) {
    const tick = async () => {
      if (job.final) return;
      try { await fn(); } finally { if (!job.final) setTimeout(tick, ms); }
    };
    setTimeout(tick, ms);
  }

  async function loadMachines() {
    const seen = new Set();
    await Promise.all([...nodes.values()].map(async (node) => {
      if (!node.machineId || seen.has(node.machineId)) return;
      seen.add(node.machineId);
      try {
        const m = await api("GET", `/api/network/machines/${enc(node.machineId)}`);
        for (const other of nodes.values()) {
          if (other.machineId === m.id) { other.load = m.load || null; other.loadChecked = m.last_checked; }
        }
      } catch (e) { /* a removed machine: no load */ }
    }));
    markNodes();
  }

  window.addEventListener("resize", markChart);
  $("chart-x").addEventListener("change", () => {
    chartX = $("chart-x").value;
    drawCharts();
  });
  $("chart-metric").addEventListener("change", () => {
    chartMetric = $("chart-metric").value;
    chartMetricChosen = true;
    drawCharts();
  });

  async function start() {
    const st = await pollStatus();
    if (!st) return;
    drawCharts();
    openStream();
    loadFiles();
    if (!job.final) {
      loadMachines();
      every(STATUS_EVERY_MS, pollStatus);
      every(LOAD_EVERY_MS, loadMachines);
      every(FILES_EVERY_MS, loadFiles);
    }
  }
  start();
})();
