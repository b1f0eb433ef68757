// corral's shared page helpers: the API with the session cookie and CSRF header,
// live events, formatting. No framework, no build step.
"use strict";

const corral = (() => {
  const csrf = () => document.querySelector('meta[name="csrf-token"]')?.content || "";

  class ApiError extends Error {
    constructor(status, body) {
      const err = (body && body.error) || {};
      super(err.message || `HTTP ${status}`);
      this.status = status;
      this.type = err.type || "http_error";
      this.details = err.details || {};
    }
  }

  // fetch an API route: JSON in, JSON out; throws ApiError with the server's message
  async function api(method, path, body) {
    const init = { method, credentials: "same-origin", headers: { Accept: "application/json" } };
    if (method !== "GET" && method !== "HEAD") init.headers["X-CSRF-Token"] = csrf();
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(path, init);
    if (resp.status === 401) { location.href = "/login?next=" + encodeURIComponent(location.pathname); }
    const text = await resp.text();
    const data = text ? JSON.parse(text) : null;
    if (!resp.ok) throw new ApiError(resp.status, data);
    return data;
  }

  // a live stream of a job's events: handlers by event kind; resumes by itself
  function live(path, handlers) {
    const source = new EventSource(path, { withCredentials: true });
    for (const [kind, fn] of Object.entries(handlers)) {
      // the browser's own connection errors are "error" events too, without data
      source.addEventListener(kind, (ev) => { if (ev.data !== undefined) fn(JSON.parse(ev.data), ev); });
    }
    return source;
  }

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function flash(message, kind = "info") {
    const box = document.getElementById("flash");
    if (!box) return;
    box.replaceChildren(el("p", { class: `flash ${kind}`, text: message }));
    if (kind !== "error") setTimeout(() => box.replaceChildren(), 6000);
  }

  const bytes = (n) => {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0; let v = Number(n);
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return `${v.toFixed(v < 10 && i ? 1 : 0)} ${units[i]}`;
  };
  const pct = (v) => (v === null || v === undefined ? "–" : `${Number(v).toFixed(0)}%`);
  const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");
  const ago = (t) => {
    if (!t) return "never";
    const s = Math.max(0, Date.now() / 1000 - t);
    if (s < 60) return `${s.toFixed(0)} s ago`;
    if (s < 3600) return `${(s / 60).toFixed(0)} min ago`;
    return `${(s / 3600).toFixed(1)} h ago`;
  };
  const duration = (s) => {
    if (s === null || s === undefined) return "–";
    if (s < 60) return `${s.toFixed(1)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
    return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
  };
  // the job and node states (corral.states, served in <body data-states>): their names,
  // the final ones and each one's symbol; no script spells a state itself
  const STATES = JSON.parse(document.body?.dataset.states || '{"job":{},"node":{},"final":[],"nodeFinal":[],"symbols":{}}');
  // a status as a badge: a word and a symbol, never colour alone
  const SYMBOLS = { online: "●", offline: "✕", busy: "◐", unknown: "?", ...STATES.symbols };
  const badge = (status) =>
    el("span", { class: `badge s-${status}` }, `${SYMBOLS[status] || "·"} ${status}`);

  // a job's workload weights ({host, node_rank, local_rank, weight} per rank, from a
  // calibration) as a table: one row per rank, the share as a number and a bar
  function weightsTable(rows, id) {
    const most = Math.max(...rows.map((w) => w.weight));
    // a calibration that found memory limits: each rank's largest micro-batch
    const fits = rows.some((w) => w.fits != null);
    return el("div", { class: "table-wrap" }, el("table", { id, class: "weights" },
      el("caption", { class: "hint" }, "Each rank's share of the work, in proportion to its measured throughput"),
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Host"), el("th", { scope: "col" }, "Node"),
        el("th", { scope: "col" }, "Local rank"), el("th", { scope: "col" }, "Weight"),
        el("th", { scope: "col" }, "Share"),
        ...(fits ? [el("th", { scope: "col", title: "The largest micro-batch it fits; a larger share runs as gradient accumulation" }, "Fits")] : []))),
      el("tbody", {}, rows.map((w) => el("tr", { "data-host": w.host, "data-local-rank": String(w.local_rank) },
        el("th", { scope: "row" }, w.host), el("td", {}, String(w.node_rank)), el("td", {}, String(w.local_rank)),
        el("td", { class: "mono", "data-field": "weight" }, Number(w.weight).toFixed(3)),
        el("td", {}, el("meter", { min: "0", max: "1", value: String(most ? w.weight / most : 0),
          "aria-label": `${w.host} rank ${w.local_rank}: ${(100 * w.weight).toFixed(1)}%` }),
        ` ${(100 * w.weight).toFixed(1)}%`),
        ...(fits ? [el("td", { class: "mono", "data-field": "fits" }, w.fits == null ? "no limit" : String(w.fits))] : []))))));
  }

  return { api, live, el, flash, bytes, pct, when, ago, duration, badge, csrf, ApiError, weightsTable, STATES };
})();
