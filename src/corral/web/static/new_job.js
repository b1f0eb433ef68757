// The new-job page: build a JobRequest from the form, "Plan" it (and show the
// execution plan), "Launch" it, or "Queue" it as a task. Saved preferences prefill
// the form; "Save as defaults" stores them. Errors appear next to the form and next
// to the field they name.
"use strict";

(() => {
  const { api, el, flash, badge } = corral;
  const $ = (id) => document.getElementById(id);
  const form = $("job-form");
  const planView = $("plan-view");
  const launchBtn = $("launch");
  let prefs = { preferred_machines: [], default_num_machines: 1, default_gpus_per_machine: 0, auto_machine_selection: true };
  let suggestions = []; // last answer of suggest_machines
  let plan = null; // { job_id, execution_plan } of the plan on show
  let planStale = false;
  let busy = false;

  // -- modes ------------------------------------------------------------------------------

  const distributed = () => $("distributed").checked;
  const manual = () => $("selection-manual").checked;
  const commandLaunch = () => $("launcher").value === "command";

  // launcher command: a template instead of a script and its arguments
  function syncLauncher() {
    for (const node of form.querySelectorAll(".only-command")) node.hidden = !commandLaunch();
    for (const node of form.querySelectorAll(".not-command")) node.hidden = commandLaunch();
  }

  function syncMode() {
    for (const node of form.querySelectorAll(".only-distributed")) node.hidden = !distributed();
    for (const node of form.querySelectorAll(".only-single")) node.hidden = distributed();
    $("machine-picker").hidden = !(distributed() && manual());
    syncLaunch();
  }

  function syncLaunch() {
    const ready = !distributed() || (plan && !planStale);
    launchBtn.disabled = busy || !ready;
    for (const id of ["plan", "queue", "save_defaults"]) $(id).disabled = busy;
    $("action-hint").textContent = busy ? "Working…"
      : !distributed() ? "Launch runs the job on the chosen machine now."
        : plan && !planStale ? "Review the plan, then Launch."
          : plan ? "The form changed since the plan: plan again." : "Plan first to review where it runs.";
  }

  // -- errors -----------------------------------------------------------------------------

  class FormError extends Error {
    constructor(field, message) { super(message); this.field = field; }
  }

  // server field paths (body.resource_requirements.num_machines, request.script...) -> input ids
  const FIELD_IDS = {
    script: "script", name: "name", args: "args", env: "env",
    launcher: "launcher", command_template: "command_template", num_machines: "num_machines", gpus_per_machine: "gpus_per_machine",
    nproc_per_node: "nproc_per_node", min_gpu_memory: "min_gpu_memory", max_restarts: "max_restarts",
    checkpoint_dir: "checkpoint_dir", hang_timeout: "hang_timeout", config: "config",
    config_scaling: "config_rule", rule: "config_rule", adjust_config: "adjust_config",
    preflight: "preflight", machine_selection: "selection-auto",
    calibration: "calibration", rebalance: "rebalance",
    track: "track",
    recovery: "recovery", spares: "spares",
  };

  function inputFor(field) {
    const parts = String(field || "").split(".").reverse();
    for (const part of parts) {
      if (part === "selected_machines") return distributed() ? $("picker-list") : $("machine");
      if (FIELD_IDS[part]) return $(FIELD_IDS[part]);
      const option = form.querySelector(`[data-option="${CSS.escape(part)}"]`);
      if (option) return option;
    }
    return null;
  }

  function clearErrors() {
    const box = $("form-errors");
    box.hidden = true;
    box.replaceChildren();
    for (const node of form.querySelectorAll(".field-error")) node.remove();
    for (const node of form.querySelectorAll("[aria-invalid]")) {
      node.removeAttribute("aria-invalid");
      const described = (node.getAttribute("aria-describedby") || "").split(" ").filter((d) => !d.endsWith("-error"));
      if (described.length) node.setAttribute("aria-describedby", described.join(" "));
      else node.removeAttribute("aria-describedby");
    }
  }

  function fieldError(field, message) {
    const input = inputFor(field);
    if (!input) return false;
    const id = `${input.id}-error`;
    const section = input.closest("details");
    if (section) section.open = true; // an option's error is never hidden in a closed section
    if (!$(id)) {
      input.setAttribute("aria-invalid", "true");
      input.setAttribute("aria-describedby", `${input.getAttribute("aria-describedby") || ""} ${id}`.trim());
      const after = input.closest(".check") || input;
      after.after(el("p", { class: "field-error error", id, "data-field": input.id }, message));
    }
    return true;
  }

  function suggestionList(items) {
    return el("ul", { id: "suggestions", class: "suggestions" }, items.map((s) =>
      el("li", { "data-machine": s.name },
        el("strong", {}, s.name), " ",
        el("span", { class: `badge ${s.eligible ? "s-online" : "s-offline"}` }, s.eligible ? "✓ eligible" : "✕ not eligible"),
        ` score ${s.score}: `, (s.reasons || []).join("; "))));
  }

  function showError(err) {
    clearErrors();
    const box = $("form-errors");
    const details = err.details || {};
    const children = [el("p", { class: "error-message" },
      el("strong", {}, err.status ? `${err.status === 409 ? "Conflict" : err.status === 422 ? "Invalid" : "Error"}: ` : "Error: "),
      err.message)];
    if (err instanceof FormError) fieldError(err.field, err.message);
    for (const f of details.fields || []) fieldError(f.field, f.message);
    if (details.field) fieldError(details.field, err.message);
    if (details.unavailable) {
      children.push(el("ul", { class: "unavailable" }, Object.entries(details.unavailable).map(([name, why]) =>
        el("li", { "data-machine": name }, el("strong", {}, name), `: ${[why].flat().join(", ")}`))));
    }
    if (details.suggestions && details.suggestions.length) {
      children.push(el("p", {}, "Machines, best first:"), suggestionList(details.suggestions));
    }
    box.replaceChildren(...children);
    box.hidden = false;
    const invalid = form.querySelector('[aria-invalid="true"]');
    if (invalid && invalid.focus && invalid.tagName !== "UL") invalid.focus();
    else box.scrollIntoView({ block: "nearest" });
  }

  // -- the request ------------------------------------------------------------------------

  const text = (id) => $(id).value.trim();

  function number(id, { integer = true, optional = false } = {}) {
    const raw = text(id);
    if (raw === "") {
      if (optional) return undefined;
      throw new FormError(id, `${labelOf(id)} is needed.`);
    }
    const value = Number(raw);
    if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) {
      throw new FormError(id, `${labelOf(id)}: ${integer ? "a whole number" : "a number"} please.`);
    }
    return value;
  }

  function labelOf(id) {
    const label = form.querySelector(`label[for="${id}"]`);
    return label ? label.firstChild.textContent.trim() : id;
  }

  // -- the generated options (corral.web.form: JobRequest's schema) ---------------------------

  const optionInputs = () => [...form.querySelectorAll("[data-option]")];

  // an option's value as the request takes it; null: not given (the API's default applies)
  function optionValue(input) {
    const name = input.dataset.option;
    const raw = input.value.trim();
    const numeric = (piece) => {
      const value = Number(piece);
      if (piece === "" || !Number.isFinite(value) || ("integer" in input.dataset && !Number.isInteger(value))) {
        throw new FormError(name, `${labelOf(name)}: ${"integer" in input.dataset ? "a whole number" : "a number"} please (not ${JSON.stringify(piece)}).`);
      }
      return value;
    };
    switch (input.dataset.kind) {
      case "checkbox": return input.checked;
      case "number": return raw === "" ? null : numeric(raw);
      case "lines": return input.value.split(/[\n,]/).map((v) => v.trim()).filter((v) => v !== "");
      case "numbers": return raw === "" ? null : raw.split(/[\s,]+/).filter((v) => v !== "").map(numeric);
      default: return raw === "" ? null : raw;
    }
  }

  // a value differs from the API's default (blank is the default)
  const changed = (input, value) => value !== null && JSON.stringify(value) !== JSON.stringify(JSON.parse(input.dataset.default));

  // the options the user changed from the API's default: only those are sent
  function changedOptions() {
    const out = {};
    for (const input of optionInputs()) {
      const value = optionValue(input);
      if (changed(input, value)) out[input.dataset.option] = value;
    }
    return out;
  }

  // each section's summary counts its changed fields (visible while it is closed)
  function syncChangedCounts() {
    for (const counter of form.querySelectorAll("[data-count]")) {
      const section = counter.closest("details");
      let count = 0;
      for (const input of section.querySelectorAll("[data-option]")) {
        try {
          if (changed(input, optionValue(input))) count += 1;
        } catch {
          count += 1; // not a valid value: certainly not the default
        }
      }
      counter.textContent = count ? `(${count} changed)` : "";
    }
  }

  function parseEnv() {
    const env = {};
    $("env").value.split("\n").forEach((line, i) => {
      const entry = line.replace(/\r$/, "");
      if (!entry.trim() || entry.trim().startsWith("#")) return;
      const at = entry.indexOf("=");
      if (at <= 0) throw new FormError("env", `Environment line ${i + 1}: KEY=value expected.`);
      env[entry.slice(0, at).trim()] = entry.slice(at + 1);
    });
    return env;
  }

  function parseConfig() {
    const raw = text("config");
    if (!raw) return undefined;
    let value;
    try { value = JSON.parse(raw); } catch (err) { throw new FormError("config", `Config is not JSON: ${err.message}`); }
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      throw new FormError("config", "Config must be a JSON object ({...}).");
    }
    return value;
  }

  // machines are named by name in requests (the API takes ids or names): tasks stay readable
  function selectedNames() {
    return [...$("picker-list").querySelectorAll("input[type=checkbox]:checked")].map((box) => box.value);
  }

  // the JobRequest of the form (throws FormError on what the form itself can tell)
  function buildRequest() {
    const request = {
      env: parseEnv(),
      launcher: $("launcher").value,
      resource_requirements: {
        num_machines: distributed() ? number("num_machines") : 1,
        gpus_per_machine: number("gpus_per_machine"),
        min_gpu_memory: number("min_gpu_memory", { integer: false }),
      },
      max_restarts: number("max_restarts"),
      adjust_config: $("adjust_config").checked,
      config_scaling: { rule: $("config_rule").value },
      preflight: $("preflight").checked,
    };
    if (commandLaunch()) {
      request.command_template = text("command_template");
      if (!request.command_template) {
        throw new FormError("command_template", "The command launcher needs a command template.");
      }
    } else {
      if (text("script")) request.script = text("script");
      request.args = $("args").value.split("\n").map((a) => a.replace(/\r$/, "")).filter((a) => a.trim() !== "");
      if (!request.script && !text("plugin_name")) throw new FormError("script", "A job needs a script (or a plugin).");
    }
    if (text("name")) request.name = text("name");
    const nproc = number("nproc_per_node", { optional: true });
    if (nproc !== undefined) request.nproc_per_node = nproc;
    if (text("checkpoint_dir")) request.checkpoint_dir = text("checkpoint_dir");
    if (text("calibration")) request.calibration = text("calibration");
    if ($("rebalance").checked) request.rebalance = true;
    const hang = number("hang_timeout", { integer: false, optional: true });
    if (hang !== undefined) request.hang_timeout = hang;
    if ($("recovery").value === "in-place") {
      request.recovery = "in-place";
      const spares = number("spares");
      if (spares) request.spares = spares;
    }
    const track = $("track").value.split("\n").map((t) => t.trim()).filter((t) => t !== "");
    if (track.length) request.track = track;
    const config = parseConfig();
    if (config !== undefined) request.config = config;
    if (request.adjust_config && config === undefined) {
      throw new FormError("config", "Adjusting the config needs a config (with batch_size and learning_rate).");
    }
    Object.assign(request, changedOptions());
    if (!distributed()) {
      if (!$("machine").value) throw new FormError("selected_machines", "Choose a machine.");
      request.machine_selection = "manual";
      request.selected_machines = [$("machine").value];
    } else if (manual()) {
      const ids = selectedNames();
      if (ids.length !== request.resource_requirements.num_machines) {
        throw new FormError("selected_machines",
          `Pick ${request.resource_requirements.num_machines} machine(s): ${ids.length} picked.`);
      }
      request.machine_selection = "manual";
      request.selected_machines = ids;
    } else {
      request.machine_selection = "auto";
    }
    return request;
  }

  // -- machine picker and single-machine dropdown -----------------------------------------

  function suggestionQuery() {
    const params = new URLSearchParams();
    const add = (key, id) => { const v = text(id); if (v !== "" && Number(v) >= 0) params.set(key, v); };
    params.set("num_machines", distributed() && Number(text("num_machines")) >= 1 ? text("num_machines") : "1");
    add("gpus_per_machine", "gpus_per_machine");
    add("min_gpu_memory", "min_gpu_memory");
    if (Number(text("nproc_per_node")) >= 1) params.set("nproc_per_node", text("nproc_per_node"));
    return params.toString();
  }

  function isPreferred(s) {
    return prefs.preferred_machines.includes(s.name) || prefs.preferred_machines.includes(s.machine_id);
  }

  function renderPicker(first) {
    const list = $("picker-list");
    const firstPicks = cloned ? cloned.selected_machines || [] : suggestions.filter(isPreferred).map((s) => s.name);
    const checked = new Set(first ? firstPicks : selectedNames());
    const wanted = Number(text("num_machines")) || 1;
    let eligibleSeen = 0;
    list.replaceChildren(...suggestions.map((s) => {
      const suggested = s.eligible && eligibleSeen++ < wanted;
      const id = `pick-${s.machine_id}`;
      return el("li", { class: `pick${s.eligible ? "" : " ineligible"}`, "data-machine": s.name },
        el("input", { type: "checkbox", id, name: "selected_machines", value: s.name,
          "data-machine": s.name, "data-machine-id": s.machine_id, checked: checked.has(s.name),
          "aria-describedby": `${id}-why` }),
        el("label", { for: id },
          el("strong", {}, s.name), " ",
          el("span", { class: `badge ${s.eligible ? "s-online" : "s-offline"}` }, s.eligible ? "✓ eligible" : "✕ not eligible"),
          suggested ? el("span", { class: "badge s-planned suggested" }, "★ suggested") : null,
          isPreferred(s) ? el("span", { class: "badge s-busy" }, "♥ preferred") : null,
          el("span", { class: "muted" }, ` score ${s.score}`)),
        el("small", { id: `${id}-why`, class: "hint reasons" }, (s.reasons || []).join("; ")));
    }));
    if (!suggestions.length) list.append(el("li", { class: "muted" }, "No machine registered: add one on the Machines page."));
    syncPickerCount();
  }

  function syncPickerCount() {
    const wanted = Number(text("num_machines")) || 1;
    $("picker-count").textContent = `${selectedNames().length} of ${wanted} picked`;
  }

  function renderSingle() {
    const select = $("machine");
    const current = select.value;
    select.replaceChildren(...suggestions.map((s) =>
      el("option", { value: s.name, "data-machine": s.name, "data-machine-id": s.machine_id },
        `${s.name} — ${s.eligible ? "eligible" : "not eligible"}, score ${s.score}`)));
    if (!suggestions.length) select.append(el("option", { value: "" }, "no machine registered"));
    const keep = suggestions.find((s) => s.name === current)
      || suggestions.find((s) => s.eligible && isPreferred(s)) || suggestions.find((s) => s.eligible);
    if (keep) select.value = keep.name;
    syncSingleReasons();
  }

  function syncSingleReasons() {
    const s = suggestions.find((x) => x.name === $("machine").value);
    $("machine-reasons").textContent = s ? (s.reasons || []).join("; ") : "";
  }

  async function loadSuggestions(first = false) {
    try {
      suggestions = await api("GET", `/api/tasks/distributed/suggest_machines?${suggestionQuery()}`);
    } catch (err) {
      $("picker-count").textContent = `Could not list machines: ${err.message}`;
      return;
    }
    renderPicker(first);
    renderSingle();
  }

  let suggestTimer = null;
  function suggestSoon() {
    clearTimeout(suggestTimer);
    suggestTimer = setTimeout(() => loadSuggestions(false), 300);
  }

  // -- the plan ---------------------------------------------------------------------------

  function kv(label, value) {
    return [el("dt", {}, label), el("dd", {}, value)];
  }

  function renderPlan(answer) {
    const p = answer.execution_plan;
    const master = p.master || {};
    const port = master.port ? `:${master.port}` : " (port picked at launch)";
    const nodes = p.nodes || [];
    const children = [
      el("h2", { id: "plan-heading" }, "Execution plan ", el("span", { class: "mono muted" }, answer.job_id)),
      el("dl", { class: "facts" },
        kv("Job", el("span", { class: "mono", "data-field": "job_id" }, answer.job_id)),
        kv("Status", badge(answer.status)),
        kv("Launcher", p.launcher),
        p.command_template
          ? kv("Command template", el("code", {}, p.command_template))
          : kv("Script", el("code", {}, [p.script, ...(p.args || [])].join(" "))),
        kv("World size", String(p.world_size)),
        kv("Master", el("span", { "data-field": "master" }, `${master.host || "?"} — ${master.address || "?"}${port}`)),
        kv("Fault tolerance", faultText(p.fault_tolerance || {})),
        kv("Pre-flight", p.preflight ? "yes" : "no"),
        Object.keys(answer.options || {}).length
          ? kv("Options", el("span", { "data-field": "options" }, Object.entries(answer.options)
            .map(([k, v]) => `${k} ${Array.isArray(v) ? v.join(", ") : v}`).join("; ")))
          : []),
      el("h3", {}, `Machines (${(p.machines || []).length})`),
      el("div", { class: "table-wrap" }, el("table", { id: "plan-machines" },
        el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Node"), el("th", { scope: "col" }, "Machine"),
          el("th", { scope: "col" }, "Why"))),
        el("tbody", {}, (p.machines || []).map((m) => el("tr", { "data-machine": m.name },
          el("td", {}, String(m.node_rank)), el("td", {}, el("strong", {}, m.name)),
          el("td", {}, (m.reasons || []).join("; "))))))),
    ];
    if ((p.rejected || []).length) {
      children.push(el("h3", {}, `Not chosen (${p.rejected.length})`),
        el("ul", { id: "plan-rejected", class: "rejected" }, p.rejected.map((r) =>
          el("li", { "data-machine": r.name }, el("strong", {}, r.name),
            ` (${r.eligible ? "eligible" : "not eligible"}, score ${r.score}): ${(r.reasons || []).join("; ")}`))));
    }
    if ((p.workload_weights || []).length) {
      children.push(el("h3", {}, `Workload weights${p.rebalance ? " (rebalanced at restarts)" : ""}`),
        corral.weightsTable(p.workload_weights, "plan-weights"));
    }
    children.push(el("h3", {}, `Nodes (${nodes.length})`));
    for (const node of nodes) {
      const ranks = node.ranks && node.ranks.length
        ? `ranks ${node.ranks[0]}${node.ranks.length > 1 ? `–${node.ranks[node.ranks.length - 1]}` : ""}`
        : `${node.nproc} processes`;
      children.push(el("section", { class: "plan-node", "data-node": node.host, "data-node-rank": String(node.node_rank) },
        el("h4", {}, `Node ${node.node_rank}: ${node.host} `, el("span", { class: "muted" }, `(${ranks})`)),
        el("p", { class: "hint" }, "Working directory: ", el("code", {}, node.cwd || "–")),
        el("details", { class: "plan-env", open: nodes.length <= 4 },
          el("summary", {}, `Environment (${Object.keys(node.env || {}).length} variables)`),
          el("pre", { class: "env" }, Object.entries(node.env || {}).map(([k, v]) => `${k}=${v}`).join("\n"))),
        (node.commands || []).flatMap((c) => [el("p", { class: "cmd-label" }, c.label),
          el("pre", { class: "cmd" }, c.line)])));
    }
    if (p.config) {
      children.push(el("h3", {}, $("adjust_config").checked ? "Adjusted config" : "Config"),
        el("pre", { id: "plan-config" }, JSON.stringify(p.config, null, 2)));
    }
    planView.replaceChildren(...children);
    planView.dataset.jobId = answer.job_id;
    planView.classList.remove("stale");
    planView.hidden = false;
  }

  function faultText(ft) {
    const parts = [`max restarts ${ft.max_restarts || 0}`];
    if (ft.checkpoint_dir) parts.push(`checkpoints in ${ft.checkpoint_dir}`);
    if (ft.hang_timeout) parts.push(`hang timeout ${ft.hang_timeout} s`);
    if (ft.recovery === "in-place") {
      parts.push(`in-place recovery (torchft)${ft.spares ? `, ${ft.spares} spare machine(s)` : ""}`);
    }
    return parts.join(", ");
  }

  // -- actions ----------------------------------------------------------------------------

  async function act(fn) {
    if (busy) return;
    clearErrors();
    busy = true;
    syncLaunch();
    try {
      await fn();
    } catch (err) {
      showError(err);
    } finally {
      busy = false;
      syncLaunch();
    }
  }

  $("plan").addEventListener("click", () => act(async () => {
    const request = buildRequest();
    const options = changedOptions(); // what the plan is made with, beyond the defaults
    const answer = await api("POST", "/api/network/distributed/plan", request);
    answer.options = options;
    plan = answer;
    planStale = false;
    renderPlan(answer);
    planView.scrollIntoView({ behavior: "smooth", block: "start" });
  }));

  launchBtn.addEventListener("click", () => act(async () => {
    let status;
    if (!distributed()) {
      const request = buildRequest();
      status = await api("POST", `/api/network/machines/${encodeURIComponent($("machine").value)}/dispatch_job`, request);
    } else {
      if (!plan || planStale) throw new FormError("", "Plan the job first.");
      status = await api("POST", "/api/network/distributed/dispatch", { job_id: plan.job_id });
    }
    flash(`Launched ${status.job_id}.`, "ok");
    location.href = `/jobs/${encodeURIComponent(status.job_id)}`;
  }));

  $("queue").addEventListener("click", () => act(async () => {
    const request = buildRequest();
    const task = await api("POST", "/api/tasks", {
      name: request.name || request.script || request.plugin_name || request.command_template.slice(0, 255),
      kind: distributed() ? "distributed" : "single",
      request,
      priority: number("queue-priority"),
    });
    const queued = distributed()
      ? await api("POST", `/api/tasks/${encodeURIComponent(task.id)}/queue_distributed`)
      : await api("POST", `/api/tasks/${encodeURIComponent(task.id)}/queue/${encodeURIComponent($("machine").value)}`);
    flash(`Queued ${queued.job_id} (position ${queued.position}).`, "ok");
    location.href = "/jobs";
  }));

  $("save_defaults").addEventListener("click", () => act(async () => {
    const body = {
      preferred_machines: manual() && distributed()
        ? selectedNames()
        : prefs.preferred_machines,
      default_num_machines: distributed() ? number("num_machines") : 1,
      default_gpus_per_machine: number("gpus_per_machine"),
      auto_machine_selection: !manual(),
    };
    prefs = await api("PUT", "/api/preferences", body);
    flash("Saved as defaults.", "ok");
    renderPicker(false);
  }));

  // any edit makes a shown plan stale (Launch needs a plan of what the form says now)
  function edited(ev) {
    if (plan && !planStale && ev.target.id !== "refresh-machines") {
      planStale = true;
      planView.classList.add("stale");
      syncLaunch();
    }
  }
  form.addEventListener("input", edited);
  form.addEventListener("input", syncChangedCounts);
  form.addEventListener("change", syncChangedCounts);
  form.addEventListener("change", edited);

  $("distributed").addEventListener("change", () => { syncMode(); suggestSoon(); });
  $("launcher").addEventListener("change", syncLauncher);
  syncLauncher();
  for (const radio of form.querySelectorAll('input[name="machine_selection"]')) radio.addEventListener("change", syncMode);
  for (const id of ["num_machines", "gpus_per_machine", "min_gpu_memory", "nproc_per_node"]) $(id).addEventListener("input", suggestSoon);
  $("picker-list").addEventListener("change", syncPickerCount);
  $("machine").addEventListener("change", syncSingleReasons);
  $("refresh-machines").addEventListener("click", () => loadSuggestions(false));
  const syncRule = () => { $("config_rule").disabled = !$("adjust_config").checked; };
  $("adjust_config").addEventListener("change", syncRule);
  syncRule();
  // in-place recovery: spare machines only make sense with it
  const syncRecovery = () => {
    const inPlace = $("recovery").value === "in-place";
    for (const node of form.querySelectorAll(".only-in-place")) node.hidden = !inPlace;
  };
  $("recovery").addEventListener("change", syncRecovery);
  syncRecovery();

  // -- Clone (/jobs/new?from=JOB): the form filled with an earlier job's request --------------

  const REDACTED = "<redacted>"; // a secret value the server never stored: to be typed again
  function fillForm(req) {
    const set = (id, v) => { if ($(id)) $(id).value = v === undefined || v === null ? "" : String(v); };
    const rr = req.resource_requirements || {};
    set("name", req.name);
    set("script", req.script);
    $("args").value = (req.args || []).join("\n");
    set("launcher", req.launcher);
    set("command_template", req.command_template);
    $("env").value = Object.entries(req.env || {}).map(([k, v]) => `${k}=${v === REDACTED ? "" : v}`).join("\n");
    set("num_machines", rr.num_machines ?? 1);
    set("gpus_per_machine", rr.gpus_per_machine ?? 0);
    set("min_gpu_memory", rr.min_gpu_memory ?? 0);
    set("nproc_per_node", req.nproc_per_node);
    set("max_restarts", req.max_restarts ?? 0);
    set("checkpoint_dir", req.checkpoint_dir);
    set("hang_timeout", req.hang_timeout);
    set("calibration", req.calibration);
    $("rebalance").checked = !!req.rebalance;
    $("adjust_config").checked = !!req.adjust_config;
    set("config", req.config ? JSON.stringify(req.config, null, 2) : "");
    if (req.config_scaling && req.config_scaling.rule) set("config_rule", req.config_scaling.rule);
    $("preflight").checked = req.preflight !== false;
    set("recovery", req.recovery || "restart");
    set("spares", req.spares || 0);
    $("track").value = (req.track || []).join("\n");
    for (const input of optionInputs()) {
      const value = req[input.dataset.option];
      if (value === undefined) continue;
      if (input.dataset.kind === "checkbox") input.checked = !!value;
      else if (input.dataset.kind === "lines") input.value = (value || []).join("\n");
      else if (input.dataset.kind === "numbers") input.value = (value || []).join(", ");
      else input.value = value === null ? "" : String(value);
    }
    $(req.machine_selection === "manual" ? "selection-manual" : "selection-auto").checked = true;
    syncLauncher();
    syncRule();
    syncRecovery();
    syncChangedCounts();
  }

  let cloned = null; // the request of the job cloned (its machines are ticked once listed)
  const cloneOf = new URLSearchParams(location.search).get("from");

  // -- start: preferences (or the cloned job's request) prefill the form -------------------

  async function start() {
    try {
      prefs = await api("GET", "/api/preferences");
      // a field typed into while the preferences were on their way keeps what was typed
      if (!touched.has("num_machines")) $("num_machines").value = prefs.default_num_machines;
      if (!touched.has("gpus_per_machine")) $("gpus_per_machine").value = prefs.default_gpus_per_machine;
      if (!touched.has("machine_selection")) $(prefs.auto_machine_selection ? "selection-auto" : "selection-manual").checked = true;
    } catch (err) {
      flash(`Could not read the saved preferences: ${err.message}`, "error");
    }
    if (cloneOf) {
      try {
        cloned = await api("GET", `/api/jobs/${encodeURIComponent(cloneOf)}/request`);
        fillForm(cloned);
        const secret = Object.values(cloned.env || {}).includes(REDACTED);
        flash(`The form holds job ${cloneOf}'s request${secret ? ": type its secret env values again" : ""}.`, secret ? "error" : "ok");
      } catch (err) {
        flash(`Could not read job ${cloneOf}'s request: ${err.message}`, "error");
      }
    }
    syncMode();
    await loadSuggestions(true);
    form.dataset.ready = "true"; // prefilled and machines listed
  }
  const touched = new Set(); // fields (by name) the user changed before the prefill arrived
  const touch = (event) => { if (event.target.name) touched.add(event.target.name); };
  form.addEventListener("input", touch);
  form.addEventListener("change", touch);
  syncMode();
  start();
})();
