// Line charts in own inline SVG (no library, no build step), as the job page (a metric
// and the throughput per node) and the compare page (one line per job) draw them: the
// lines' colours and dashes, numbers as the axes show them, round ticks, the axes, and
// the job page's per-node chart.
"use strict";

const corralChart = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#1f6fd1", "#c62828", "#1a7f37", "#8250df", "#bc4c00", "#0a7a8a",
    "#7d4e24", "#bf3989"];
  const DASHES = ["", "7 4", "2 3"];
  const DASH_CSS = ["solid", "dashed", "dotted"];

  function fmtNumber(v) {
    if (v === null || v === undefined || Number.isNaN(Number(v))) return "–";
    const n = Number(v);
    if (Number.isInteger(n)) return String(n);
    const a = Math.abs(n);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return n.toExponential(2);
    const text = a >= 100 ? n.toFixed(1) : n.toPrecision(4);
    return text.includes(".") ? text.replace(/\.?0+$/, "") : text;
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

  // The plot of [xmin, xmax] x [ymin, ymax] in a `width` x `height` svg with margins `m`:
  // its scales (xs, ys) and its axes (grid, ticks, titles) in `axes`. Over time, an x
  // range over 5 minutes is shown in minutes.
  function plot({ width, height, m, xmin, xmax, ymin, ymax, yTicks, byStep, yTitle }) {
    const w = width - m.l - m.r;
    const h = height - m.t - m.b;
    const minutes = !byStep && xmax - xmin > 300;
    const xs = (x) => m.l + ((x - xmin) / (xmax - xmin)) * w;
    const ys = (y) => m.t + h - ((y - ymin) / (ymax - ymin)) * h;
    const axes = svgEl("g", { class: "axes" });
    for (const v of ticks(ymin, ymax, yTicks)) {
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
    return { axes, xs, ys, w, h };
  }

  // line `index`'s legend swatch: its colour and dash
  function swatch(index) {
    const sw = corral.el("span", { class: "swatch", "aria-hidden": "true" });
    sw.style.borderTopColor = COLORS[index % COLORS.length];
    sw.style.borderTopStyle = DASH_CSS[index % DASH_CSS.length];
    return sw;
  }

  // line `index` through the path `d` (its colour and dash, `attrs` and a title)
  function line(d, index, attrs, title) {
    const path = svgEl("path", {
      d, ...attrs, fill: "none", stroke: COLORS[index % COLORS.length],
      "stroke-width": 2, "stroke-linejoin": "round", "vector-effect": "non-scaling-stroke",
    });
    const dash = DASHES[index % DASHES.length];
    if (dash) path.setAttribute("stroke-dasharray", dash);
    path.append(svgEl("title", {}, title));
    return path;
  }

  // The job page's chart of one value per node (`series`: {node, pts}, a point [time,
  // value, step]) over steps or time since `t0`; each of `breaks` (a restart's start)
  // is marked on the time axis and breaks the lines; the legend lists `legend`'s nodes.
  function nodeChart(box, series, { yTitle, emptyText, fromZero, byStep, t0, breaks, legend }) {
    const width = Math.max(260, box.clientWidth || 600);
    const height = width < 500 ? 170 : 200;
    const m = { l: 54, r: 12, t: 10, b: 36 };
    const svg = svgEl("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "plot",
      role: "img", "aria-label": `${yTitle} per node over ${byStep ? "steps" : "time"}`,
      "data-x": byStep ? "step" : "time" });
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
    const { axes, xs, ys, w, h } = plot({ width, height, m, xmin, xmax, ymin, ymax, yTicks: 4, byStep, yTitle });
    breaks.forEach((b, i) => {  // where each restart began (on the time axis)
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
        const gap = i === 0 || breaks.some((b) => pts[i - 1][0] < b && b <= pts[i][0]);
        d += `${gap ? "M" : "L"}${xs(X(pts[i])).toFixed(1)} ${ys(pts[i][1]).toFixed(1)}`;
      }
      svg.append(line(d, node.index, { "data-node": node.host },
        `${node.host}: ${fmtNumber(pts[pts.length - 1][1])} ${yTitle}`));
      if (pts.length === 1) {  // a lone point still shows
        svg.append(svgEl("circle", { cx: xs(X(pts[0])), cy: ys(pts[0][1]), r: 3,
          fill: COLORS[node.index % COLORS.length] }));
      }
    }
    const { el } = corral;
    const items = el("ul", { class: "legend" }, ...legend.map((node) => {
      const found = series.find((s) => s.node === node);
      const last = found ? ` ${fmtNumber(found.pts[found.pts.length - 1][1])}` : "";
      return el("li", {}, swatch(node.index), node.host, el("span", { class: "muted" }, last));
    }));
    box.replaceChildren(svg, items);
  }

  return { COLORS, fmtNumber, svgEl, plot, swatch, line, nodeChart };
})();
