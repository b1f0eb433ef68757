// The admin page of users and the audit log: GET /api/users (roles, limits, revoked)
// and GET /api/audit (newest first, 50 at a time, "Older" for more; a user filter).
"use strict";

(() => {
  const { api, el } = corral;
  const $ = (id) => document.getElementById(id);
  const PAGE = 50;
  let offset = 0;

  const limit = (n, none) => (n === null || n === undefined ? none : String(n));
  const shown = (value) => (value === null || value === undefined ? "–" : JSON.stringify(value));

  function userRow(u) {
    return el("tr", { "data-user": u.name },
      el("td", {}, u.name),
      el("td", {}, u.role),
      el("td", { class: "num" }, limit(u.max_jobs, "no limit")),
      el("td", { class: "num" }, limit(u.max_machines, "no limit")),
      el("td", { class: "num" }, limit(u.max_queued, "server default")),
      el("td", {}, u.revoked ? new Date(u.revoked * 1000).toLocaleString() : "–"));
  }

  function entryRow(e) {
    const what = e.action || `${e.method} ${e.path}`;
    return el("tr", { "data-entry": String(e.id) },
      el("td", {}, new Date(e.time * 1000).toLocaleString()),
      el("td", {}, e.user || "(no valid token)"),
      el("td", {}, what + (e.count > 1 ? ` ×${e.count}` : "")),
      el("td", { class: "mono" }, e.target || "–"),
      el("td", { class: "mono" }, shown(e.before)),
      el("td", { class: "mono" }, shown(e.after)),
      el("td", { class: "mono" }, `${e.method} ${e.path}` + (e.source ? ` from ${e.source}` : "")),
      el("td", { class: "num" }, String(e.status)));
  }

  async function users() {
    const rows = await api("GET", "/api/users");
    $("users-body").replaceChildren(...rows.map(userRow));
  }

  async function entries(more) {
    offset = more ? offset + PAGE : 0;
    const who = $("audit-user").value.trim();
    const query = new URLSearchParams({ limit: String(PAGE), offset: String(offset) });
    if (who) query.set("user", who);
    try {
      const page = await api("GET", `/api/audit?${query}`);
      const rows = page.entries.map(entryRow);
      if (more) $("audit-body").append(...rows);
      else $("audit-body").replaceChildren(...rows);
      const seen = offset + page.entries.length;
      $("audit-count").textContent = `${seen} of ${page.total} entries`;
      $("audit-older").hidden = seen >= page.total;
    } catch (err) {
      $("audit-count").textContent = `Could not load the audit log: ${err.message}`;
    }
  }

  $("audit-filter").addEventListener("submit", (ev) => { ev.preventDefault(); entries(false); });
  $("audit-older").addEventListener("click", () => entries(true));
  users().catch((err) => { $("audit-count").textContent = `Could not load the users: ${err.message}`; });
  entries(false);
})();
