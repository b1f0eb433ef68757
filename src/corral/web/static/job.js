// The job page: status, topology, per-node progress and utilisation, charts of a
// metric and of throughput per node (chart.js), merged logs with filters and search
// (job_logs.js), attempts, root cause, the hang report, files (job_report.js),
// stragglers (on their rank chips), "Stop all". Everything comes from the API: the
// job's status (polled while it runs) and its event stream, which replays from the
// start, so a finished job's page is rebuilt the same way.
"use strict";

(() => {
  const { api, live, el, badge, flash, when, duration, pct, STATES } = corral;
  const { job: S } = STATES;
  const page = document.getElementById("job");
  if (!page) return;

  const JOB = page.dataset.jobId;
  const FINAL = new Set(STATES.final);
  const NODE_FINAL = new Set(STATES.nodeFinal);
  const STATUS_EVERY_MS = 2000;    // status poll while the job is not final
  const LOAD_EVERY_MS = 5000;      // machines' load while the job runs
  const FILES_EVERY_MS = 10000;    // file list while the job runs
  const CHART_EVERY_MS = 500;      // charts redraw at most twice a second
  const RATE_WINDOW_S = 3;         // throughput: steps over the last seconds
  const MAX_POINTS = 4000;         // per series, then every other point is dropped
  const { COLORS, fmtNumber, swatch } = corralChart;
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
  const logs = corralJobLogs({ lineClass: (host) => `h${hostIndex(host) % COLORS.length}`, queueFrame });
  const { renderAttempts, renderGroups, groupText, renderHang, renderRootCause, loadFiles, exitText } =
    corralJobReport({ jobId: JOB, job, markNodes });

  function hostIndex(host) {
    return nodeOf(host).index;
  }

  function nodeOf(host) {
    let node = nodes.get(host);
    if (node) return node;
    node = {
      host, index: nodes.size, nodeRank: null, machineId: null, ranks: [], status: S.PENDING,
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

  // -- frame scheduling: logs and node cards render at most once per frame ----------------
  let frameQueued = false;
  let nodesDirty = false;
  function queueFrame() {
    if (frameQueued) return;
    frameQueued = true;
    requestAnimationFrame(() => {
      frameQueued = false;
      logs.flush();
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
    if (state === S.SUCCEEDED) $("job-reason").textContent = "";
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
      if (job.stopping && !FINAL.has(st.status)) setState(S.STOPPING, "stopping…");
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
    const sw = swatch(node.index);
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
      el("header", { class: "row" }, sw, title, role, state),
      ranks, bar, label, metrics, load);
    return { card, swatch: sw, role, state, bar, label, ranks, metrics, load };
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
      const ended = job.final || FINAL.has(node.status) || NODE_FINAL.has(node.status);
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
    const shared = { byStep, t0: job.t0 ?? 0, breaks: job.breaks, legend: [...nodes.values()] };
    corralChart.nodeChart($("chart"), metricSeries, { ...shared, yTitle: chartMetric || "metric",
      emptyText: job.final ? "no metrics reported" : "waiting for reported metrics…", fromZero: false });
    corralChart.nodeChart($("throughput-chart"), rateSeries, { ...shared, yTitle: "steps/s",
      emptyText: job.final ? "no progress reported" : "waiting for progress…", fromZero: true });
  }

  // -- logs (job_logs.js): a log event also names its node and rank for the filters ----------
  function onLog(ev) {
    logs.onLog(ev);
    const host = ev.host ?? "";
    const rank = ev.rank ?? -1;
    if (host && rank >= 0) addOption($("log-rank"), rank, `${rank} · ${host}`);
    if (host) nodeOf(host);
  }
  const onNote = logs.onNote;

  // -- stragglers; the attempts, root cause, hang report and files are job_report.js' --------
  // a straggler named (status or live event): kept per rank and section, shown on its chip
  function noteStraggler(s) {
    const key = `${s.host}:${s.rank}`;
    const list = (job.stragglers.get(key) || []).filter((o) => o.section !== s.section);
    job.stragglers.set(key, [...list, s]);
    markNodes();
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
    setState(S.STOPPING, "stopping…");
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
        setState(S.LOST, ev.reason);
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
