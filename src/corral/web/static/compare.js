// The compare page (/compare?job_id=A&job_id=B..., or ?job=A&job=B): the selected jobs' metric series overlaid
// on one chart (GET /api/compare), one line per job (its lowest reporting rank), over
// steps by default (over time since each job's start when a point has no step).
// Paths: #compare-chart svg path[data-job="ID"]; the svg's data-x and data-metric.
"use strict";

(() => {
  const { api, el, flash } = corral;
  const $ = (id) => document.getElementById(id);
  const { COLORS, fmtNumber, svgEl, plot, swatch, line } = corralChart;
  // ?job_id=A&job_id=B as the API spells it, or ?job=A&job=B (both, in their order)
  const query = new URLSearchParams(location.search);
  const ids = [...new Set([...query.getAll("job_id"), ...query.getAll("job")])];
  let data = null;

  const label = (job) => job.name || job.job_id;

  function draw() {
    const metric = $("compare-metric").value;
    const series = data.jobs.map((job, index) => ({ job, index, pts: job.series[metric] || [] }))
      .filter((s) => s.pts.length);
    // over steps when every point has one, else over time since each job's start
    const byStep = $("compare-x").value === "step" &&
      series.every(({ pts }) => pts.every((p) => p[0] !== null));
    const X = (p) => (byStep ? p[0] : p[1]);
    const box = $("compare-chart");
    const width = Math.max(300, box.clientWidth || 700);
    const height = width < 500 ? 220 : 320;
    const m = { l: 58, r: 14, t: 12, b: 38 };
    let xmin = Infinity; let xmax = -Infinity; let ymin = Infinity; let ymax = -Infinity;
    for (const { pts } of series) {
      for (const p of pts) {
        xmin = Math.min(xmin, X(p)); xmax = Math.max(xmax, X(p));
        ymin = Math.min(ymin, p[2]); ymax = Math.max(ymax, p[2]);
      }
    }
    if (!series.length) { xmin = 0; xmax = 1; ymin = 0; ymax = 1; }
    if (!byStep) xmin = Math.min(0, xmin);
    if (xmax - xmin < 1e-9) xmax = xmin + 1;
    const pad = ymax - ymin < 1e-12 ? Math.abs(ymax) * 0.1 || 1 : (ymax - ymin) * 0.05;
    ymin -= pad; ymax += pad;
    const svg = svgEl("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "plot",
      role: "img", "aria-label": `${metric} of ${series.length} jobs over ${byStep ? "steps" : "time"}`,
      "data-x": byStep ? "step" : "time", "data-metric": metric });
    const { axes, xs, ys, w, h } = plot({ width, height, m, xmin, xmax, ymin, ymax, yTicks: 5, byStep,
      yTitle: metric || "metric" });
    svg.append(axes);
    if (!series.length) {
      svg.append(svgEl("text", { x: m.l + w / 2, y: m.t + h / 2, class: "empty", "text-anchor": "middle" },
        metric ? `no job reported ${metric}` : "no metrics reported"));
    }
    for (const { job, index, pts } of series) {
      const d = pts.map((p, i) => `${i ? "L" : "M"}${xs(X(p)).toFixed(1)} ${ys(p[2]).toFixed(1)}`).join("");
      svg.append(line(d, index, { "data-job": job.job_id },
        `${label(job)}: ${fmtNumber(pts[pts.length - 1][2])} ${metric}`));
      if (pts.length === 1) {
        svg.append(svgEl("circle", { cx: xs(X(pts[0])), cy: ys(pts[0][2]), r: 3,
          fill: COLORS[index % COLORS.length] }));
      }
    }
    box.replaceChildren(svg);
    $("compare-legend").replaceChildren(...data.jobs.map((job, index) => {
      const sw = swatch(index);
      const pts = job.series[metric] || [];
      const last = pts.length ? ` ${metric} ${fmtNumber(pts[pts.length - 1][2])}` : " (not reported)";
      return el("li", { "data-job": job.job_id }, sw,
        el("a", { href: `/jobs/${encodeURIComponent(job.job_id)}` }, label(job)),
        el("span", { class: "muted" }, ` ${job.status}${last}`));
    }));
    const thinned = data.jobs.filter((j) => (j.reported[metric] || 0) > (j.series[metric] || []).length);
    $("compare-note").textContent = thinned.length
      ? `Long series are thinned to ${data.points} evenly spaced points each.` : "";
  }

  function fillMetrics() {
    const all = [...new Set(data.jobs.flatMap((j) => Object.keys(j.series)))].sort();
    const others = all.filter((name) => !data.shared.includes(name));
    const select = $("compare-metric");
    const option = (name) => el("option", { value: name }, name);
    select.replaceChildren(
      ...(data.shared.length ? [el("optgroup", { label: "reported by every job" }, data.shared.map(option))] : []),
      ...(others.length ? [el("optgroup", { label: "reported by some" }, others.map(option))] : []));
    const pick = ["loss", ...data.shared, ...all].find((name) => all.includes(name));
    if (pick) select.value = pick;
  }

  async function load() {
    if (ids.length < 2) {
      flash("Select two or more jobs on the jobs page to compare them.", "error");
    }
    if (!ids.length) return;
    const params = new URLSearchParams();
    for (const id of ids) params.append("job_id", id);
    try {
      data = await api("GET", `/api/compare?${params}`);
    } catch (err) {
      flash(`Compare: ${err.message}`, "error");
      return;
    }
    fillMetrics();
    draw();
  }

  $("compare-metric").addEventListener("change", () => data && draw());
  $("compare-x").addEventListener("change", () => data && draw());
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => data && draw(), 200);
  });
  load();
})();
