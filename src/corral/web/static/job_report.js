// The job page's account of how the job went: its attempts, the in-place recovery's
// replica groups, the last hang report, the root cause of a failure, and the run's
// files. corralJobReport({ jobId, job, markNodes }) returns the renderers the page
// calls with its status (and groupText, exitText for its live events and node cards).
"use strict";

const corralJobReport = ({ jobId, job, markNodes }) => {
  const { api, el, when } = corral;
  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;
  const JOB = jobId;
  const SIGNALS = { 1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 6: "SIGABRT", 9: "SIGKILL",
    11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM" };

  // a rank's end: its exit code, or the signal that killed it (a negative code, or the
  // signal's name when the server gives it)
  function exitText(code, signal) {
    const number = typeof code === "number" && code < 0 ? -code : null;
    if (signal || number) {
      const name = signal || SIGNALS[number] || "a signal";
      return `killed by ${name}${number ? ` (signal ${number})` : ""}`;
    }
    if (code === null || code === undefined) return "–";
    return `exit code ${code}`;
  }

  function lines(value) {
    if (value === null || value === undefined) return [];
    if (Array.isArray(value)) return value.map(String);
    return String(value).replace(/\n$/, "").split("\n");
  }

  function renderAttempts(attempts) {
    const body = $("attempts").tBodies[0];
    if (!attempts.length) {
      body.replaceChildren(el("tr", {}, el("td", { colspan: "6", class: "muted" }, "No attempt yet.")));
      return;
    }
    body.replaceChildren(...attempts.map((a) => {
      const rec = a.record || {};
      let result = corral.STATES.job.RUNNING;
      if (a.ended) {
        result = rec.state || "ended";
        if (rec.exit_code !== null && rec.exit_code !== undefined) result += ` (exit ${rec.exit_code})`;
      }
      const restart = a.ended === null || a.ended === undefined ? "–"
        : `${a.restart ? "restarted" : "no restart"}${a.decision ? `: ${a.decision}` : ""}`;
      return el("tr", { "data-attempt": String(a.number) },
        el("td", { "data-label": "#" }, String(a.number)),
        el("td", { "data-label": "Hosts" }, (a.hosts || []).join(", ")),
        el("td", { "data-label": "Started" }, when(a.started)),
        el("td", { "data-label": "Ended" }, a.ended ? when(a.ended) : "–"),
        el("td", { "data-label": "Result" }, result),
        el("td", { "data-label": "Restart / cause" }, el("div", {}, el("div", {}, restart),
          a.cause && rec.state !== corral.STATES.job.SUCCEEDED ? el("div", { class: "muted" }, `cause: ${a.cause}`) : null)));
    }));
  }

  // in-place recovery: each replica group's loss, restart and rejoin, from the stored events
  function groupText(g) {
    let text = `node ${g.host} (group ${g.group}) ${g.change}`;
    if (g.step !== null && g.step !== undefined) text += ` at step ${g.step}`;
    if (g.healed_from) text += `, healed from ${g.healed_from}`;
    text += `; ${g.participants} group${g.participants === 1 ? "" : "s"} training`;
    return text;
  }

  function renderGroups(changes) {
    $("groups-card").hidden = !changes.length;
    $("groups-timeline").replaceChildren(...changes.map((g) => el("li", { "data-change": g.change },
      el("span", { class: "muted" }, when(g.time)), " ", groupText(g),
      g.detail && g.change !== "rejoined" ? el("div", { class: "muted" }, g.detail) : null)));
  }

  // the last hang report: its summary, the odd ones out, the stuck collective, the files
  let hangShown = "";
  function renderHang(h) {
    const key = JSON.stringify(h);
    if (key === hangShown) return;
    hangShown = key;
    job.odd.clear();
    $("hang").hidden = !h;
    if (!h) { $("hang-body").replaceChildren(); return; }
    for (const o of h.odd || []) job.odd.set(`${o.host}:${o.rank}`, o);
    const parts = [el("p", { class: "rc-message" }, h.summary)];
    if (h.message) parts.push(el("p", { class: "muted" }, `detected: ${h.message}`));
    if ((h.odd || []).length) {
      parts.push(el("ul", { class: "hang-odd" }, ...h.odd.map((o) => el("li", { "data-rank": String(o.rank) },
        `odd one out: rank ${o.rank} on ${o.host} at `, el("code", {}, o.where),
        (o.frames || []).length ? el("pre", { class: "rc-trace" }, o.frames.join("\n")) : null))));
    }
    const c = h.collective;
    if (c) {
      const who = (c.missing_ranks || []).join(", ");
      const others = (c.mismatched || []).map((m) => `rank ${m.rank} was in ${m.collective} instead`).join("; ");
      const said = others && !who ? others : `never entered by ranks ${who || "–"}`;
      parts.push(el("p", { class: "hang-collective" },
        `collective ${c.collective} #${c.sequence} (group ${c.group}${c.state ? `, ${c.state}` : ""}): ${said}`));
    }
    if (h.report) {
      const inRun = /(^|\/)hang\/report\.md$/.test(h.report);
      parts.push(el("p", { class: "muted" }, "Report: ",
        inRun ? fileLink("hang/report.md", "report.md") : el("span", { class: "mono" }, h.report),
        inRun ? " · " : null, inRun ? fileLink("hang/report.json", "report.json") : null));
    }
    $("hang-body").replaceChildren(...parts);
    markNodes();
  }

  function renderRootCause(st) {
    const rc = st.root_cause;
    const box = $("root-cause");
    // a stop by the user is no failure: its "root cause" (interrupted) names no rank
    const { SUCCEEDED, CANCELLED } = corral.STATES.job;
    const none = !rc || st.status === SUCCEEDED || (st.status === CANCELLED && !rc.host);
    if (none) { box.hidden = true; return; }
    box.hidden = false;
    const facts = [];
    if (rc.host) facts.push(["Host", rc.host]);
    if (rc.rank !== null && rc.rank !== undefined) facts.push(["Rank", String(rc.rank)]);
    const code = rc.code ?? rc.exit_code;
    if (rc.signal || (code !== null && code !== undefined)) {
      let text = exitText(code, rc.signal);
      if ((rc.signal || code < 0) && rc.exit_code !== null && rc.exit_code !== undefined) {
        text += `, exit status ${rc.exit_code}`;
      }
      facts.push(["Exit", text]);
    }
    if (rc.time) facts.push(["When", when(rc.time)]);
    const parts = [];
    if (rc.message) parts.push(el("p", { class: "rc-message" }, rc.message));
    if (facts.length) {
      parts.push(el("dl", { class: "facts" }, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-field": k.toLowerCase() }, v)])));
    }
    const tb = lines(rc.traceback);
    const err = lines(rc.stderr_tail);
    const log = lines(rc.log_tail);
    if (tb.length) parts.push(el("h3", {}, "Traceback"), el("pre", { class: "rc-trace" }, tb.join("\n")));
    else if (err.length) {
      // a hang's tail is a stack, not stderr: the failure says what it holds
      const label = rc.tail ? rc.tail.charAt(0).toUpperCase() + rc.tail.slice(1) : "Last lines of stderr";
      parts.push(el("h3", {}, label), el("pre", { class: "rc-trace" }, err.join("\n")));
    }
    if (log.length) {
      const det = el("details", {}, el("summary", {}, `Last ${log.length} log lines of rank ${rc.rank ?? "?"}`),
        el("pre", {}, log.join("\n")));
      if (!tb.length && !err.length) det.open = true;
      parts.push(det);
    }
    $("root-cause-body").replaceChildren(...parts);
  }

  function fileLink(path, text) {
    const href = `/api/network/local_job_file/${enc(JOB)}/${path.split("/").map(enc).join("/")}`;
    return el("a", { href, download: `${JOB}-${path.replace(/\//g, "_")}` }, text);
  }

  async function loadFiles() {
    let files;
    try {
      files = await api("GET", `/api/jobs/${enc(JOB)}/files`);
    } catch (e) {
      return;
    }
    const rankLogs = [];
    const other = [];
    for (const f of files) {
      const m = /^logs\/(.+)\.(\d+)\.log$/.exec(f);
      if (m) rankLogs.push({ f, host: m[1], rank: Number(m[2]) });
      else other.push(f);
    }
    rankLogs.sort((a, b) => a.rank - b.rank);
    const out = [];
    if (rankLogs.length) {
      out.push(el("h3", {}, "Per-rank logs"), el("ul", { class: "files rank-logs" },
        ...rankLogs.map((r) => el("li", {}, fileLink(r.f, `${r.host} · rank ${r.rank}`), " ",
          el("span", { class: "muted mono" }, r.f)))));
    }
    if (other.length) {
      out.push(el("details", {}, el("summary", {}, `Other files of the run (${other.length})`),
        el("ul", { class: "files" }, ...other.map((f) => el("li", {}, fileLink(f, f))))));
    }
    if (!out.length) out.push(el("p", { class: "muted" }, "No files yet."));
    const box = $("files");
    const open = box.querySelector("details")?.open;
    box.replaceChildren(...out);
    if (open) box.querySelector("details").open = true;
  }

  return { renderAttempts, renderGroups, groupText, renderHang, renderRootCause, loadFiles, exitText };
};
