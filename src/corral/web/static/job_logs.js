// The job page's merged log: lines batched per animation frame, at most MAX_LINES in
// the DOM (in chunks the browser skips while far from view), following the end until
// the reader scrolls up, filtered by host and rank, searched with every match marked.
// corralJobLogs({ lineClass, queueFrame }) wires the page's #logs box and its controls
// and returns { onLog, onNote, flush }: the page calls flush() once per frame it queued.
"use strict";

const corralJobLogs = ({ lineClass, queueFrame }) => {
  const { el } = corral;
  const $ = (id) => document.getElementById(id);
  const MAX_LINES = 20000;         // log lines kept in the DOM
  const FRAME_BUDGET_MS = 10;      // log lines built per frame: about this long
  const CHUNK_LINES = 200;         // log lines per chunk (the unit the browser skips)

  const logBox = $("logs");
  let pending = [];
  let lineCount = 0;
  let dropped = 0;
  let follow = true;
  const filter = { host: "", rank: "" };
  const search = { query: "", matches: [], current: -1 };

  // a log event's lines (a carriage return: what a terminal would show of the line)
  function onLog(ev) {
    const host = ev.host ?? "";
    const rank = ev.rank ?? -1;
    const text = String(ev.text ?? "").replace(/\r\n/g, "\n");
    const parts = text.split("\n");
    if (parts.length > 1 && parts[parts.length - 1] === "") parts.pop();
    for (const part of parts) {
      // a carriage return redraws the line on a terminal: keep what it would show
      const shown = part.includes("\r") ? part.slice(part.lastIndexOf("\r") + 1) : part;
      pending.push({ host, rank, text: shown });
    }
    if (pending.length > 2 * MAX_LINES) {
      dropped += pending.length - MAX_LINES;
      pending = pending.slice(-MAX_LINES);
    }
    queueFrame();
  }

  // a line of corral's own in the log (the folded teardown output of a node)
  function onNote(text) {
    pending.push({ host: "", rank: -1, text, corral: true });
    queueFrame();
  }

  function lineVisible(host, rank) {
    return (!filter.host || filter.host === host) && (!filter.rank || filter.rank === rank);
  }

  // one line: built with plain DOM calls (thousands per second)
  function makeLine(item) {
    const rank = item.rank >= 0 ? String(item.rank) : "";
    const line = document.createElement("div");
    line.className = item.host ? `line ${lineClass(item.host)}` : "line";
    line.dataset.host = item.host;
    line.dataset.rank = rank;
    const prefix = document.createElement("span");
    prefix.className = "prefix";
    prefix.textContent = item.corral ? "[corral]" : rank ? `[${item.host}:${rank}]` : `[${item.host}]`;
    const msg = document.createElement("span");
    msg.className = "msg";
    msg.textContent = item.text;
    line.append(prefix, " ", msg);
    if (!lineVisible(item.host, rank)) line.hidden = true;
    return line;
  }

  // Lines live in chunks of CHUNK_LINES. Only the chunks near the log box's view are
  // rendered: the others are "far" (content-visibility: hidden, at their estimated
  // height), so a flood of lines costs the browser almost no layout. Nearness is the
  // box's own (an IntersectionObserver rooted at it), never the window's.
  const nearby = "IntersectionObserver" in window
    ? new IntersectionObserver((entries) => {
      for (const e of entries) e.target.classList.toggle("far", !e.isIntersecting);
    }, { root: logBox, rootMargin: "100% 0px" })
    : null;
  let lineHeight = 0;
  function sizeChunk(chunk) {
    if (!lineHeight) lineHeight = parseFloat(getComputedStyle(logBox).lineHeight) || 16;
    chunk.style.containIntrinsicBlockSize = `${Math.ceil(chunk.shown * lineHeight)}px`;
  }

  function newChunk() {
    const chunk = document.createElement("div");
    chunk.className = nearby ? "chunk far" : "chunk";  // the observer says when it is near
    chunk.total = 0;   // lines in it
    chunk.shown = 0;   // of which not filtered out
    logBox.append(chunk);
    if (nearby) nearby.observe(chunk);
    return chunk;
  }

  function* allLines() {
    for (const chunk of logBox.children) yield* chunk.children;
  }

  // drop the oldest lines beyond MAX_LINES
  function trimLines() {
    let excess = lineCount - MAX_LINES;
    if (excess <= 0) return;
    dropped += excess;
    lineCount -= excess;
    while (excess > 0) {
      const first = logBox.firstElementChild;
      if (first.total <= excess) {
        excess -= first.total;
        if (nearby) nearby.unobserve(first);
        first.remove();
        continue;
      }
      let shownGone = 0;
      for (let i = 0; i < excess; i += 1) if (!first.children[i].hidden) shownGone += 1;
      const range = document.createRange();
      range.setStartBefore(first.firstChild);
      range.setEndAfter(first.children[excess - 1]);
      range.deleteContents();
      first.total -= excess;
      first.shown -= shownGone;
      sizeChunk(first);
      excess = 0;
    }
    let gone = 0;
    while (search.matches.length && !search.matches[0].isConnected) { search.matches.shift(); gone += 1; }
    if (gone) search.current = Math.max(search.matches.length ? 0 : -1, search.current - gone);
  }

  // append what came since the last frame, within a time budget (the rest waits for the
  // next frame)
  function flush() {
    if (!pending.length) return;
    if (pending.length > MAX_LINES) {
      dropped += pending.length - MAX_LINES;
      pending = pending.slice(-MAX_LINES);
    }
    const began = performance.now();
    const q = search.query;
    let newMatch = false;
    let done = 0;
    let chunk = logBox.lastElementChild;
    const touched = new Set();
    while (done < pending.length) {
      const stop = Math.min(pending.length, done + 200);
      for (; done < stop; done += 1) {
        const line = makeLine(pending[done]);
        if (!chunk || chunk.total >= CHUNK_LINES) chunk = newChunk();
        chunk.append(line);
        chunk.total += 1;
        if (!line.hidden) chunk.shown += 1;
        touched.add(chunk);
        if (q && !line.hidden && line.textContent.toLowerCase().includes(q)) {
          line.classList.add("match");
          search.matches.push(line);
          newMatch = true;
        }
      }
      if (performance.now() - began > FRAME_BUDGET_MS) break;
    }
    for (const c of touched) sizeChunk(c);
    pending = done < pending.length ? pending.slice(done) : [];
    lineCount += done;
    trimLines();
    $("logs-empty").hidden = lineCount > 0;
    if (dropped) {
      const trimmed = $("logs-trimmed");
      trimmed.hidden = false;
      trimmed.textContent = `Showing the last ${MAX_LINES.toLocaleString()} lines; ` +
        `${dropped.toLocaleString()} earlier lines are in the per-rank log files below.`;
    }
    if (q) {
      if (newMatch && search.current < 0) { search.current = 0; showMatch(); } else countMatches();
    }
    if (follow) {
      toEnd();
      // once the chunks on screen have their real height, the end may be further down
      requestAnimationFrame(() => { if (follow) toEnd(); });
    }
    if (pending.length) queueFrame();
  }

  // Following the end stops when the user scrolls up and starts again at the end. Only
  // an upward move counts: chunks taking their real height, or old lines dropped above,
  // also move the view without the user.
  let searchScrollAt = 0;  // a scroll the search made is not the user's
  let resizedAt = 0;       // nor one a resize of the window made
  let lastScrollTop = 0;
  window.addEventListener("resize", () => { resizedAt = Date.now(); });
  logBox.addEventListener("scroll", () => {
    const top = logBox.scrollTop;
    const up = top < lastScrollTop - 2;
    lastScrollTop = top;
    if (Date.now() - searchScrollAt < 150) return;
    if (Date.now() - resizedAt < 500) {
      if (follow) requestAnimationFrame(toEnd);
      return;
    }
    const atEnd = top + logBox.clientHeight >= logBox.scrollHeight - 24;
    if (atEnd) follow = true;
    else if (up) follow = false;
    $("logs-follow").hidden = follow;
  });
  function toEnd() {
    logBox.scrollTop = logBox.scrollHeight;
    lastScrollTop = logBox.scrollTop;
  }
  $("logs-follow").addEventListener("click", () => {
    follow = true;
    toEnd();
    $("logs-follow").hidden = true;
  });

  function applyFilter() {
    filter.host = $("log-host").value;
    filter.rank = $("log-rank").value;
    for (const chunk of logBox.children) {
      let shown = 0;
      for (const line of chunk.children) {
        line.hidden = !lineVisible(line.dataset.host, line.dataset.rank);
        if (!line.hidden) shown += 1;
      }
      chunk.shown = shown;
      sizeChunk(chunk);
    }
    runSearch();
    if (!search.query && follow) toEnd();
  }
  $("log-host").addEventListener("change", applyFilter);
  $("log-rank").addEventListener("change", applyFilter);

  // -- log search: every match marked, the current one highlighted and scrolled to ------------
  function clearCurrent() {
    const line = search.matches[search.current];
    if (!line) return;
    line.classList.remove("current");
    const msg = line.querySelector(".msg");
    const pre = line.querySelector(".prefix");
    for (const span of [msg, pre]) if (span && span.querySelector("mark")) span.textContent = span.textContent;
  }

  // the text searched for (case-insensitive; spaces count, so "step 7 " skips "step 70")
  function queryText() {
    const value = $("log-search").value;
    return value.trim() ? value.toLowerCase() : "";
  }

  function runSearch() {
    clearCurrent();
    for (const line of search.matches) line.classList.remove("match", "current");
    const wasSearching = Boolean(search.query);
    search.query = queryText();
    search.matches = [];
    search.current = -1;
    if (!search.query && wasSearching) {  // the search is over: back to the end
      follow = true;
      toEnd();
      $("logs-follow").hidden = true;
    }
    if (search.query) {
      for (const line of allLines()) {
        if (!line.hidden && line.textContent.toLowerCase().includes(search.query)) {
          line.classList.add("match");
          search.matches.push(line);
        }
      }
      if (search.matches.length) search.current = 0;
    }
    showMatch();
  }

  function countMatches() {
    const out = $("search-count");
    if (!search.query) { out.textContent = ""; return; }
    out.textContent = `${search.current + 1}/${search.matches.length}`;
    out.classList.toggle("none", search.matches.length === 0);
  }

  function markIn(span, query) {
    const text = span.textContent;
    const at = text.toLowerCase().indexOf(query);
    if (at < 0) return false;
    span.replaceChildren(text.slice(0, at), el("mark", {}, text.slice(at, at + query.length)),
      text.slice(at + query.length));
    return true;
  }

  function showMatch() {
    countMatches();
    const line = search.matches[search.current];
    if (!line) return;
    line.classList.add("current");
    const msg = line.querySelector(".msg");
    if (!markIn(msg, search.query)) markIn(line.querySelector(".prefix"), search.query);
    follow = false;
    // centre the line in the log box (not the page)
    const box = logBox.getBoundingClientRect();
    const at = line.getBoundingClientRect();
    const top = logBox.scrollTop + (at.top - box.top) - logBox.clientHeight / 2 + at.height / 2;
    searchScrollAt = Date.now();
    logBox.scrollTop = Math.max(0, top);
    $("logs-follow").hidden = false;
    const r = logBox.getBoundingClientRect();
    if (r.bottom < 0 || r.top > window.innerHeight) logBox.scrollIntoView({ block: "nearest" });
  }

  function step(delta) {
    if (!search.matches.length) return;
    clearCurrent();
    const n = search.matches.length;
    search.current = ((search.current < 0 ? 0 : search.current + delta) % n + n) % n;
    showMatch();
  }

  let searchTimer = null;
  $("log-search").addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(runSearch, 150);
  });
  $("log-search").addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    ev.preventDefault();
    if (queryText() !== search.query) { clearTimeout(searchTimer); runSearch(); return; }
    step(ev.shiftKey ? -1 : 1);
  });
  $("search-next").addEventListener("click", () => {
    if (queryText() !== search.query) runSearch(); else step(1);
  });
  $("search-prev").addEventListener("click", () => {
    if (queryText() !== search.query) runSearch(); else step(-1);
  });

  return { onLog, onNote, flush };
};
