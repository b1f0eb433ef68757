// The machines page: the registry with health and load, ping / remove per machine,
// "Health check all", and the add-machine form. Polls /api/network/status every 3 s
// (paused while the tab is hidden). Rows are keyed by data-machine="NAME".
"use strict";

(() => {
  const { api, el, flash, bytes, pct, ago, badge } = corral;
  const POLL_MS = 3000;
  const COUNT_SYMBOLS = { online: "●", busy: "◐", offline: "✕", unknown: "?" };
  const body = document.getElementById("machines-body");
  const pinging = new Set(); // names whose ping is in flight (buttons stay disabled)
  let timer = null;
  let lastStatus = null;

  // -- cells ------------------------------------------------------------------------------

  function gpuCell(caps) {
    const count = caps.gpu_count;
    if (count === undefined || count === null) return "–";
    if (!count) return "none";
    const total = caps.gpu_memory_mib ? bytes(caps.gpu_memory_mib * 1024 * 1024) : "?";
    const each = caps.gpu_memory_min_mib ? `, ≥ ${bytes(caps.gpu_memory_min_mib * 1024 * 1024)} each` : "";
    const names = [...new Set((caps.gpus || []).map((g) => g.name).filter(Boolean))].join(", ");
    return el("span", { title: names || null }, `${count} × (${total} total${each})`);
  }

  function diskCell(caps) {
    const d = caps.disk;
    if (!d) return "–";
    return el("span", { title: d.path || null }, `${bytes(d.free_bytes)} / ${bytes(d.total_bytes)}`);
  }

  function loadCell(load) {
    if (!load || (load.cpu_percent === undefined && load.memory_percent === undefined)) return "–";
    const parts = [el("span", { class: "load-item" }, `CPU ${pct(load.cpu_percent)}`),
      el("span", { class: "load-item" }, `mem ${pct(load.memory_percent)}`)];
    for (const g of load.gpus || []) {
      parts.push(el("span", { class: "load-item" }, `GPU${g.index} ${pct(g.utilization_percent)}`));
    }
    return el("span", { class: "load" }, parts);
  }

  function jobsCell(jobs) {
    if (!jobs || !jobs.length) return el("span", { class: "muted" }, "–");
    return el("span", { class: "job-links" },
      jobs.map((id) => el("a", { href: `/jobs/${encodeURIComponent(id)}` }, id)));
  }

  function errorCell(m) {
    if (!m.last_error) return el("span", { class: "muted" }, "–");
    return el("span", { class: "error-text" }, m.last_error);
  }

  function nameCell(m) {
    const where = m.local ? "local (simulated)" : [m.user ? `${m.user}@` : "", m.host, m.port ? `:${m.port}` : ""].join("");
    return [el("strong", {}, m.name), el("br"), el("small", { class: "muted" }, where)];
  }

  function actionsCell(m) {
    return el("span", { class: "row actions" },
      el("button", { type: "button", class: "secondary ping", "data-action": "ping", "aria-label": `Ping ${m.name}` }, "Ping"),
      document.body.dataset.role === "admin"
        ? el("button", { type: "button", class: "danger remove", "data-action": "remove", "aria-label": `Remove ${m.name}` }, "Remove")
        : null);
  }

  const COLUMNS = [
    (m) => nameCell(m),
    (m) => badge(m.status),
    (m) => gpuCell(m.capabilities || {}),
    (m) => (m.capabilities && m.capabilities.cpus) || "–",
    (m) => (m.capabilities && m.capabilities.memory_bytes ? bytes(m.capabilities.memory_bytes) : "–"),
    (m) => diskCell(m.capabilities || {}),
    (m) => loadCell(m.load),
    (m) => el("span", { title: m.last_seen ? new Date(m.last_seen * 1000).toLocaleString() : null }, ago(m.last_seen)),
    (m) => jobsCell(m.running_jobs),
    (m) => errorCell(m),
  ];
  const CLASSES = ["name", "status", "gpus", "cpus", "ram", "disk", "load", "seen", "jobs", "last-error"];

  // -- rendering (rows updated in place so focus on a button survives a refresh) ----------

  function renderRow(m) {
    let tr = body.querySelector(`tr[data-machine="${CSS.escape(m.name)}"]`);
    if (!tr) {
      tr = el("tr", { "data-machine": m.name });
      for (const cls of CLASSES) tr.append(el("td", { class: `c-${cls}` }));
      tr.append(el("td", { class: "c-actions" }, actionsCell(m)));
    }
    tr.dataset.id = m.id;
    tr.dataset.status = m.status;
    COLUMNS.forEach((fn, i) => tr.children[i].replaceChildren(...[fn(m)].flat()));
    tr.querySelector("button.ping").disabled = pinging.has(m.name);
    return tr;
  }

  function render(status) {
    lastStatus = status;
    for (const [key, symbol] of Object.entries(COUNT_SYMBOLS)) {
      const span = document.querySelector(`[data-count="${key}"]`);
      span.textContent = `${symbol} ${status[key]} ${key}`;
      span.dataset.value = status[key];
    }
    const total = document.querySelector('[data-count="total"]');
    total.textContent = `${status.total} machine${status.total === 1 ? "" : "s"}`;
    total.dataset.value = status.total;

    const seen = new Set();
    status.machines.forEach((m, i) => {
      const tr = renderRow(m);
      seen.add(m.name);
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
    });
    for (const tr of [...body.children]) if (!seen.has(tr.dataset.machine)) tr.remove();
    document.getElementById("no-machines").hidden = status.machines.length > 0;
    document.getElementById("updated").textContent = `Updated ${new Date().toLocaleTimeString()}; refreshes every 3 s.`;
  }

  async function refresh() {
    try {
      render(await api("GET", "/api/network/status"));
    } catch (err) {
      document.getElementById("updated").textContent = `Could not refresh: ${err.message}`;
    }
  }

  function schedule() {
    clearTimeout(timer);
    timer = null;
    if (document.hidden) return;
    timer = setTimeout(async () => { await refresh(); schedule(); }, POLL_MS);
  }

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) { clearTimeout(timer); timer = null; }
    else refresh().then(schedule);
  });

  // -- actions ----------------------------------------------------------------------------

  function machineOf(tr) {
    return (lastStatus && lastStatus.machines.find((m) => m.name === tr.dataset.machine)) || null;
  }

  async function ping(tr, button) {
    const name = tr.dataset.machine;
    pinging.add(name);
    button.disabled = true;
    button.textContent = "Pinging…";
    try {
      const m = await api("POST", `/api/network/machines/${encodeURIComponent(tr.dataset.id)}/ping`);
      flash(`${name}: ${m.status}${m.last_error ? ` (${m.last_error})` : ""}`, m.status === "offline" ? "error" : "ok");
    } catch (err) {
      flash(`Ping ${name}: ${err.message}`, "error");
    } finally {
      pinging.delete(name);
      button.disabled = false;
      button.textContent = "Ping";
      await refresh();
    }
  }

  async function remove(tr) {
    const m = machineOf(tr);
    const name = tr.dataset.machine;
    const busy = m && m.running_jobs && m.running_jobs.length ? ` It runs ${m.running_jobs.join(", ")}.` : "";
    if (!window.confirm(`Remove machine ${name}?${busy}`)) return;
    try {
      await api("DELETE", `/api/network/machines/${encodeURIComponent(tr.dataset.id)}`);
      flash(`Removed ${name}.`, "ok");
    } catch (err) {
      flash(`Remove ${name}: ${err.message}`, "error");
    }
    await refresh();
  }

  body.addEventListener("click", (ev) => {
    const button = ev.target.closest("button[data-action]");
    if (!button) return;
    const tr = button.closest("tr[data-machine]");
    if (button.dataset.action === "ping") ping(tr, button);
    else if (button.dataset.action === "remove") remove(tr);
  });

  const checkAll = document.getElementById("health-check");
  checkAll.addEventListener("click", async () => {
    checkAll.disabled = true;
    checkAll.setAttribute("aria-busy", "true");
    checkAll.textContent = "Checking…";
    try {
      const status = await api("POST", "/api/network/health-check");
      render(status);
      flash(`Health check: ${status.online} online, ${status.busy} busy, ${status.offline} offline.`,
        status.offline ? "error" : "ok");
    } catch (err) {
      flash(`Health check: ${err.message}`, "error");
    } finally {
      checkAll.disabled = false;
      checkAll.removeAttribute("aria-busy");
      checkAll.textContent = "Health check all";
    }
  });

  // -- add a machine ----------------------------------------------------------------------

  const form = document.getElementById("add-machine");
  if (form) { // only an admin's page has the form
  const formError = document.getElementById("add-machine-error");
  const localBox = document.getElementById("machine_local");
  const sshOnly = ["machine_host", "machine_port", "machine_user", "machine_key_path", "machine_password_env"];

  function syncLocal() {
    for (const id of sshOnly) document.getElementById(id).disabled = localBox.checked;
  }
  localBox.addEventListener("change", syncLocal);

  function showFormError(message, fields) {
    formError.textContent = message;
    formError.hidden = !message;
    for (const input of form.querySelectorAll("[aria-invalid]")) input.removeAttribute("aria-invalid");
    for (const f of fields || []) {
      const key = String(f.field || "").split(".").pop();
      const input = form.elements.namedItem(key);
      if (input && input.setAttribute) input.setAttribute("aria-invalid", "true");
    }
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const v = (id) => document.getElementById(id).value.trim();
    const payload = { name: v("machine_name"), slots: Number(v("machine_slots") || 1), local: localBox.checked };
    if (!localBox.checked) {
      for (const [key, id] of [["host", "machine_host"], ["user", "machine_user"],
        ["key_path", "machine_key_path"], ["password_env", "machine_password_env"]]) {
        if (v(id)) payload[key] = v(id);
      }
      if (v("machine_port")) payload.port = Number(v("machine_port"));
    }
    if (!payload.name) { showFormError("A machine needs a name.", [{ field: "name" }]); return; }
    const submit = document.getElementById("add-machine-submit");
    submit.disabled = true;
    try {
      const m = await api("POST", "/api/network/machines", payload);
      showFormError("");
      form.reset();
      syncLocal();
      flash(`Added ${m.name} (${m.status}).`, "ok");
      await refresh();
    } catch (err) {
      showFormError(err.message, err.details && err.details.fields);
    } finally {
      submit.disabled = false;
    }
  });

  syncLocal();
  }
  refresh().then(schedule);
})();
