// envsched dashboard: draws the views with plotly.js and keeps them live by polling /api/state.
// Every value that comes from the run (task ids, instructions, environments, reasons) is inserted with
// textContent, never as markup.
(function () {
  "use strict";
  const mode = document.body.dataset.mode || "live";
  const POLL_MS = 500;
  const FIGURES = ["coverage", "envs_per_batch", "signal", "signal_env", "reliability", "async"];
  const CONFIG = {responsive: true, displaylogo: false, modeBarButtonsToRemove: ["sendDataToCloud"]};
  let shownVersion = null;
  let searching = null; // {task, step} while a search is shown
  let embedded = null;
  // milliseconds since navigation at each stage of the first draw (read by benchmarks/dashboard_load.py)
  const timings = window.envschedTimings = {script: performance.now()};

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function fmt(x, digits) {
    if (x === null || x === undefined) return "\u2013";
    if (typeof x === "number") return Number.isInteger(x) ? x.toLocaleString("en") : x.toFixed(digits ?? 4);
    return String(x);
  }

  function setStatus(text, cls) {
    const s = document.getElementById("status");
    s.textContent = text;
    s.className = "status " + (cls || "");
  }

  function renderSummary(views) {
    const m = views.metrics, s = views.summary;
    const cards = [
      ["steps", views.steps], ["groups reported", m.groups], ["signal groups / episode", m.signal_groups_per_episode],
      ["zero-signal share", m.zero_signal_fraction], ["outstanding", m.outstanding_groups],
      ["late updates", m.late_updates], ["discarded", m.discarded_groups], ["environments", s.num_envs],
      ["tasks", s.num_tasks],
    ];
    const box = document.getElementById("summary");
    box.replaceChildren();
    for (const [label, value] of cards) {
      const c = el("div", null, "card");
      c.appendChild(el("div", fmt(value, 4), "value"));
      c.appendChild(el("div", label, "label"));
      box.appendChild(c);
    }
    const src = el("div", null, "card wide");
    src.appendChild(el("div", s.sampler_class, "value small"));
    src.appendChild(el("div", "store " + s.store + (s.run_file ? " \u00b7 run file " + s.run_file : ""), "label"));
    box.appendChild(src);
    for (const w of s.warnings || []) box.appendChild(el("div", "\u26a0 " + w, "card wide warning"));
  }

  function renderMetrics(metrics) {
    const body = document.querySelector("#metrics tbody");
    body.replaceChildren();
    for (const [k, v] of Object.entries(metrics)) {
      const tr = el("tr");
      tr.appendChild(el("th", k));
      tr.appendChild(el("td", fmt(v, 6)));
      body.appendChild(tr);
    }
  }

  function renderFigures(views) {
    for (const name of FIGURES) {
      const fig = views.figures[name];
      const div = document.getElementById("fig-" + name);
      if (!fig || !div) continue;
      Plotly.react(div, fig.data, fig.layout, CONFIG);
      timings["fig-" + name] = timings["fig-" + name] || performance.now();
    }
    document.getElementById("fig-coverage").dataset.steps = String(views.steps);
  }

  function renderPicks(rows) {
    const body = document.querySelector("#picks tbody");
    body.replaceChildren();
    if (!rows.length) {
      const tr = el("tr");
      const td = el("td", "no picks match", "empty");
      td.colSpan = 11;
      tr.appendChild(td);
      body.appendChild(tr);
      return;
    }
    for (const r of rows) {
      const tr = el("tr");
      tr.appendChild(el("td", r.step, "num"));
      tr.appendChild(el("td", r.rank, "num"));
      const task = el("td", null, "task");
      task.appendChild(el("div", r.task_id, "task-id"));
      if (r.instruction) task.appendChild(el("div", r.instruction, "instruction"));
      tr.appendChild(task);
      tr.appendChild(el("td", r.env));
      tr.appendChild(el("td", r.phase || "\u2013", r.phase ? "phase " + r.phase : ""));
      tr.appendChild(el("td", fmt(r.predicted_variance), "num"));
      tr.appendChild(el("td", r.status, "status-" + r.status.replace(/\s/g, "-")));
      tr.appendChild(el("td", fmt(r.observed_mean, 3), "num"));
      tr.appendChild(el("td", fmt(r.observed_variance), "num"));
      tr.appendChild(el("td", r.signal === null ? "\u2013" : (r.signal ? "yes" : "no")));
      const reasons = el("td", null, "reasons");
      for (const reason of r.reasons || []) reasons.appendChild(el("div", reason));
      tr.appendChild(reasons);
      body.appendChild(tr);
    }
  }

  async function getJSON(url) {
    const resp = await fetch(url, {cache: "no-store"});
    if (!resp.ok) throw new Error(url + ": HTTP " + resp.status);
    return resp.json();
  }

  function picksURL() {
    const params = new URLSearchParams({limit: "300"});
    if (searching && searching.task) params.set("task", searching.task);
    if (searching && searching.step) params.set("step", searching.step);
    return "/api/picks?" + params.toString();
  }

  async function loadPicks(pending) {
    if (mode === "report") {
      let rows = embedded.picks;
      if (searching) {
        const needle = (searching.task || "").toLowerCase();
        rows = rows.filter(r => (!needle || r.task_id.toLowerCase().includes(needle)) &&
                                (!searching.step || r.step === Number(searching.step)));
      }
      renderPicks(rows);
      return;
    }
    renderPicks((await (pending || getJSON(picksURL()))).rows);
  }

  async function poll() {
    try {
      const st = await getJSON("/api/state");
      if (st.error) {
        setStatus("cannot read the store: " + st.error, "bad");
      } else if (!st.caught_up && st.head > 0) {
        setStatus("indexing the log: " + fmt(st.seq) + " of " + fmt(st.head) + " events", "busy");
      }
      if (st.version !== shownVersion && (st.caught_up || shownVersion === null)) {
        timings.state = timings.state || performance.now();
        const views = await getJSON("/api/views");
        const picks = getJSON(picksURL()); // fetched while the figures are drawn
        timings.views = timings.views || performance.now();
        renderSummary(views);
        renderFigures(views);
        timings.figures = timings.figures || performance.now();
        renderMetrics(views.metrics);
        await loadPicks(picks);
        timings.picks = timings.picks || performance.now();
        shownVersion = views.version;
        document.body.dataset.version = String(views.version);
      }
      if (!st.error && st.caught_up) {
        const ago = st.last_event_time ? Math.max(0, st.now - st.last_event_time) : null;
        setStatus("live \u00b7 " + fmt(st.steps) + " steps, " + fmt(st.seq) + " events" +
                  (ago === null ? "" : " \u00b7 last event " + ago.toFixed(0) + " s ago"), "ok");
      }
    } catch (err) {
      setStatus("dashboard unreachable (" + err.message + ")", "bad");
    }
    setTimeout(poll, POLL_MS);
  }

  function setupSearch() {
    document.getElementById("search").addEventListener("submit", ev => {
      ev.preventDefault();
      const task = document.getElementById("search-task").value.trim();
      const step = document.getElementById("search-step").value.trim();
      searching = (task || step) ? {task, step} : null;
      loadPicks();
    });
    document.getElementById("search-clear").addEventListener("click", () => {
      searching = null;
      document.getElementById("search-task").value = "";
      document.getElementById("search-step").value = "";
      loadPicks();
    });
  }

  function start() {
    setupSearch();
    if (mode === "report") {
      embedded = JSON.parse(document.getElementById("envsched-data").textContent);
      renderSummary(embedded.views);
      renderFigures(embedded.views);
      renderMetrics(embedded.views.metrics);
      loadPicks();
      setStatus("report \u00b7 " + fmt(embedded.views.steps) + " steps, written " + embedded.written, "ok");
      return;
    }
    poll();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
