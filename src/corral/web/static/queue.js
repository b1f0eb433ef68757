// The queue page: the queued jobs in the order they will start (GET /api/queue), each
// with its priority, owner and what it waits for; an admin's page (a "Top" column,
// rendered by the server) moves a job ahead of every other. Refreshes every 3 s.
"use strict";

(() => {
  const { api, el, flash } = corral;
  const $ = (id) => document.getElementById(id);
  const ADMIN = document.body.dataset.role === "admin";

  function row(entry) {
    return el("tr", { "data-job": entry.job_id },
      el("td", { class: "num" }, String(entry.position + 1)),
      el("td", {}, el("a", { href: `/jobs/${encodeURIComponent(entry.job_id)}`, class: "mono" }, entry.job_id)),
      el("td", {}, entry.name || "–"),
      el("td", { class: "num" }, String(entry.priority)),
      el("td", {}, entry.owner || "–"),
      el("td", { class: "num" }, String(entry.machines)),
      el("td", {}, entry.reason || "starts now"),
      ADMIN ? el("td", {}, el("button", { type: "button", class: "secondary", "data-action": "top",
        "aria-label": `Move ${entry.job_id} to the top` }, "Top")) : null);
  }

  async function refresh() {
    try {
      const entries = await api("GET", "/api/queue");
      $("order-body").replaceChildren(...entries.map(row));
      $("order-empty").hidden = entries.length > 0;
      $("updated").textContent = `Updated ${new Date().toLocaleTimeString()}; refreshes every 3 s.`;
    } catch (err) {
      $("updated").textContent = `Could not refresh: ${err.message}`;
    }
  }

  $("order-body").addEventListener("click", async (ev) => {
    const button = ev.target.closest("button[data-action=top]");
    if (!button) return;
    const id = button.closest("tr").dataset.job;
    button.disabled = true;
    try {
      const moved = await api("POST", `/api/queue/${encodeURIComponent(id)}/move`, { top: true });
      flash(`${id}: priority ${moved.priority}, position ${moved.position + 1}.`, "ok");
    } catch (err) {
      flash(`Move ${id}: ${err.message}`, "error");
    }
    await refresh();
  });

  refresh();
  setInterval(() => { if (!document.hidden) refresh(); }, 3000);
})();
