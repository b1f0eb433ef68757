// The machines page's link heatmap: the last matrix from GET /api/network/links,
// "Measure links" POSTs a new one. Cells come levelled by the server (good, fair,
// slow, error, self): the same verdict as `corral check --links`.
"use strict";

(() => {
  const { api, el, flash } = corral;
  const table = document.getElementById("links-table");
  const head = document.getElementById("links-head");
  const body = document.getElementById("links-body");
  const status = document.getElementById("links-status");
  const error = document.getElementById("links-error");
  const button = document.getElementById("measure-links");
  if (!table || !button) return;

  function gbs(v) {
    if (v === null || v === undefined) return "–";
    return v >= 1 ? `${v.toPrecision(3)} GB/s` : `${(v * 1000).toPrecision(3)} MB/s`;
  }

  function render(out) {
    if (!out || !out.measured) {
      table.hidden = true;
      status.textContent = "Not measured yet.";
      return;
    }
    const data = out.data;
    const culprits = new Set(data.score.culprits || []);
    head.replaceChildren(el("th", { scope: "col" }, "from \\ to"),
      ...data.hosts.map((h) => el("th", { scope: "col" }, h)));
    body.replaceChildren(...data.grid.map((row, i) => {
      const host = data.hosts[i];
      const name = el("th", { scope: "row", class: culprits.has(host) ? "link-culprit" : null },
        culprits.has(host) ? `${host} ✗` : host);
      return el("tr", { "data-host": host }, [name, ...row.map((c) =>
        el("td", { class: `link-${c.level}`, "data-level": c.level, title: `${c.from} → ${c.to}` }, c.text))]);
    }));
    table.hidden = false;
    const when = new Date(out.measured_at * 1000).toLocaleTimeString();
    const named = culprits.size ? `; slow links point at ${[...culprits].join(", ")}` : "";
    const ring = data.ring && data.ring.busbw_gbs !== null ? `, ring ${gbs(data.ring.busbw_gbs)}` : "";
    status.textContent = `reference ${gbs(data.score.reference_gbs)}${ring}${named} (${when})`;
  }

  async function load() {
    try { render(await api("GET", "/api/network/links")); } catch (e) { /* shown on click */ }
  }

  button.addEventListener("click", async () => {
    button.disabled = true;
    error.hidden = true;
    status.textContent = "Measuring…";
    try {
      render(await api("POST", "/api/network/links", {}));
      flash("Links measured");
    } catch (e) {
      error.textContent = e.message;
      error.hidden = false;
      status.textContent = "Measurement failed.";
    } finally {
      button.disabled = false;
    }
  });

  load();
})();
