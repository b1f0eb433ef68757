// The jobs page: every job (paged, filtered by status), the queue in its order (as
// GET /api/queue and `corral job queue` give it) with "Cancel", and
// the saved tasks with "Queue". Refreshes every 3 s while the tab is visible.
// Rows: tr[data-job="ID"] (jobs and queue), tr[data-task="ID"] (tasks).
"use strict";

(() => {
  const { api, el, flash, when, duration, badge } = corral;
  const $ = (id) => document.getElementById(id);
  const POLL_MS = 3000;
  const LIMIT = 20;
  let offset = 0;
  let total = 0;
  let timer = null;
  let seq = 0; // answers of an older refresh than the last one started are dropped
  let tasks = new Map(); // id -> task (for names and scripts of the jobs made from tasks)
  const picked = new Set(); // the jobs ticked for "Compare selected" (kept across pages)

  // what the role may do (the server renders it; the API refuses the rest anyway)
  const ME = document.body.dataset.user || "";
  const ROLE = document.body.dataset.role || "viewer";
  const mayChange = (owner) => ROLE === "admin" || (ROLE === "user" && owner === ME);

  const jobLink = (id) => el("a", { href: `/jobs/${encodeURIComponent(id)}`, class: "mono" }, id);

  function nameOf(job) {
    const task = job.task_id ? tasks.get(job.task_id) : null;
    const req = task && task.request;
    const script = req ? req.script || req.plugin_name || req.command_template : null;
    const name = job.name || (task && task.name);
    if (!name && !script) return el("span", { class: "muted" }, job.kind);
    return [name ? el("strong", {}, name) : null,
      script && script !== name ? el("small", { class: "muted" }, ` ${script}`) : null];
  }

  function machinesOf(job) {
    if (job.machines && job.machines.length) return job.machines.join(", ");
    const task = job.task_id ? tasks.get(job.task_id) : null;
    const req = task && task.request;
    if (!req) return "–";
    const n = (req.resource_requirements || {}).num_machines || 1;
    if (req.machine_selection === "manual" && (req.selected_machines || []).length) {
      return req.selected_machines.join(", ");
    }
    return `auto (${n})`;
  }

  // -- jobs -------------------------------------------------------------------------------

  function jobRow(job) {
    return el("tr", { "data-job": job.job_id, "data-status": job.status },
      el("td", {}, el("input", { type: "checkbox", class: "compare-pick", value: job.job_id,
        checked: picked.has(job.job_id), "aria-label": `Select ${job.job_id} to compare` })),
      el("td", {}, badge(job.status)),
      el("td", {}, jobLink(job.job_id)),
      el("td", {}, nameOf(job)),
      el("td", {}, job.owner || "–"),
      el("td", {}, machinesOf(job)),
      el("td", { class: "num" }, job.world_size ? String(job.world_size) : "–"),
      el("td", {}, when(job.created)),
      el("td", {}, duration(job.duration)),
      el("td", { class: "num" }, job.exit_code === null || job.exit_code === undefined ? "–" : String(job.exit_code)));
  }

  function renderJobs(page) {
    total = page.total;
    $("jobs-body").replaceChildren(...page.jobs.map(jobRow));
    $("jobs-empty").hidden = page.jobs.length > 0;
    $("jobs-table").parentElement.hidden = page.jobs.length === 0;
    const first = page.jobs.length ? offset + 1 : 0;
    $("page-info").textContent = `${first}–${offset + page.jobs.length} of ${total}`;
    $("newer").disabled = offset === 0;
    $("older").disabled = offset + LIMIT >= total;
  }

  // -- compare: two or more ticked jobs, overlaid on /compare ----------------------------

  const MAX_COMPARE = 8; // GET /api/compare's bound
  function updateCompare() {
    const button = $("compare-selected");
    button.disabled = picked.size < 2 || picked.size > MAX_COMPARE;
    button.textContent = picked.size ? `Compare selected (${picked.size})` : "Compare selected";
  }

  $("jobs-body").addEventListener("change", (ev) => {
    const box = ev.target.closest("input.compare-pick");
    if (!box) return;
    if (box.checked) picked.add(box.value); else picked.delete(box.value);
    updateCompare();
  });

  $("compare-selected").addEventListener("click", () => {
    const params = new URLSearchParams();
    for (const id of picked) params.append("job_id", id);
    location.href = `/compare?${params}`;
  });

  // -- queue ------------------------------------------------------------------------------

  // the queue as GET /api/queue gives it (what `corral job queue` prints): in the order
  // the jobs start, each with its priority, owner and what it waits for
  function renderQueue(queued) {
    $("queue-body").replaceChildren(...queued.map((entry) =>
      el("tr", { "data-job": entry.job_id, "data-status": corral.STATES.job.QUEUED },
        el("td", { class: "num" }, String(entry.position + 1)),
        el("td", {}, jobLink(entry.job_id)),
        el("td", {}, entry.name || "–"),
        el("td", { class: "num" }, String(entry.priority)),
        el("td", {}, entry.owner || "–"),
        el("td", { class: "num" }, String(entry.machines)),
        el("td", {}, when(entry.queued)),
        el("td", { class: "reason" }, entry.reason || "starts now"),
        el("td", {}, mayChange(entry.owner) ? el("button", { type: "button", class: "danger cancel",
          "data-action": "cancel", "aria-label": `Cancel ${entry.job_id}` }, "Cancel") : null))));
    $("queue-empty").hidden = queued.length > 0;
    $("queue-table").parentElement.hidden = queued.length === 0;
  }

  $("queue-body").addEventListener("click", async (ev) => {
    const button = ev.target.closest("button[data-action=cancel]");
    if (!button) return;
    const id = button.closest("tr").dataset.job;
    if (!window.confirm(`Cancel queued job ${id}?`)) return;
    button.disabled = true;
    try {
      const answer = await api("POST", `/api/network/distributed/stop/${encodeURIComponent(id)}`);
      flash(`${id}: ${answer.message || answer.status}`, "ok");
    } catch (err) {
      flash(`Cancel ${id}: ${err.message}`, "error");
    }
    await refresh();
  });

  // -- tasks ------------------------------------------------------------------------------

  function renderTasks(list) {
    tasks = new Map(list.map((t) => [t.id, t]));
    $("tasks-body").replaceChildren(...[...list].reverse().map((t) => {
      const req = t.request || {};
      return el("tr", { "data-task": t.id },
        el("td", {}, el("strong", {}, t.name)),
        el("td", {}, t.kind),
        el("td", {}, el("code", {}, [req.script || req.plugin_name || req.command_template || "–", ...(req.args || [])].join(" "))),
        el("td", {}, machinesOf({ task_id: t.id })),
        el("td", {}, when(t.created)),
        el("td", {}, mayChange(t.owner) ? el("button", { type: "button", class: "secondary queue-task",
          "data-action": "queue", "aria-label": `Queue ${t.name}` }, "Queue") : null));
    }));
    $("tasks-empty").hidden = list.length > 0;
    $("tasks-table").parentElement.hidden = list.length === 0;
  }

  $("tasks-body").addEventListener("click", async (ev) => {
    const button = ev.target.closest("button[data-action=queue]");
    if (!button) return;
    const task = tasks.get(button.closest("tr").dataset.task);
    if (!task) return;
    const req = task.request || {};
    const machine = task.kind === "single" ? (req.selected_machines || [])[0] : null;
    const path = machine
      ? `/api/tasks/${encodeURIComponent(task.id)}/queue/${encodeURIComponent(machine)}`
      : `/api/tasks/${encodeURIComponent(task.id)}/queue_distributed`;
    button.disabled = true;
    try {
      const queued = await api("POST", path);
      flash(`Queued ${queued.job_id} (position ${queued.position}).`, "ok");
    } catch (err) {
      flash(`Queue ${task.name}: ${err.message}`, "error");
    } finally {
      button.disabled = false;
    }
    await refresh();
  });

  // -- refresh ----------------------------------------------------------------------------

  async function refresh() {
    const status = $("status-filter").value;
    const params = new URLSearchParams({ limit: String(LIMIT), offset: String(offset) });
    if (status) params.set("status", status);
    if ($("mine-filter").checked) params.set("mine", "true");
    const mine = ++seq;
    try {
      const [page, queue, taskList] = await Promise.all([
        api("GET", `/api/jobs?${params}`),
        api("GET", "/api/queue?limit=1000"),
        api("GET", "/api/tasks"),
      ]);
      if (mine !== seq) return undefined;
      renderTasks(taskList);
      if (page.jobs.length === 0 && offset > 0 && page.total > 0) { // the page emptied: step back
        offset = Math.max(0, Math.floor((page.total - 1) / LIMIT) * LIMIT);
        return refresh();
      }
      renderJobs(page);
      renderQueue(queue);
      $("updated").textContent = `Updated ${new Date().toLocaleTimeString()}; refreshes every 3 s.`;
    } catch (err) {
      $("updated").textContent = `Could not refresh: ${err.message}`;
    }
    return undefined;
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

  $("newer").addEventListener("click", () => { offset = Math.max(0, offset - LIMIT); refresh(); });
  $("older").addEventListener("click", () => { offset += LIMIT; refresh(); });
  $("status-filter").addEventListener("change", () => { offset = 0; refresh(); });
  $("mine-filter").addEventListener("change", () => { offset = 0; refresh(); });

  refresh().then(schedule);
})();
