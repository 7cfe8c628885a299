/* holoprof dashboard: renders the holoprof.report/1 document of a run; computes nothing itself. */
(function () {
  "use strict";

  const H = window.HoloViews; // shared with the HTML report: formatting, findings, chart specs, palette
  const { esc, fmtS, fmtBytes, fmtRate, fmtPct, fmtNum, phaseColor, phaseLabel } = H;
  const POLL_MS = 1500;

  const state = { runId: null, timer: null, charts: {}, barSpecs: {}, summaries: {}, lastReport: null, lastActions: null, busy: false };

  function fmtUs(us) { return fmtS(us / 1e6); }
  function fmtTime(ns) { return ns ? new Date(ns / 1e6).toLocaleString() : "–"; }
  // Long tables (thousands of ranks or processes) show the MAX_ROWS costliest rows in their own
  // order, then one row for the rest; the API keeps every row (as holoprof.present.summary does).
  const MAX_ROWS = 30;
  function topRows(rows, cost) {
    if (rows.length <= MAX_ROWS) return [rows, []];
    const order = rows.map((r, i) => i).sort((a, b) => (cost(rows[b]) || 0) - (cost(rows[a]) || 0) || a - b);
    const keep = new Set(order.slice(0, MAX_ROWS - 1));
    return [rows.filter((r, i) => keep.has(i)), rows.filter((r, i) => !keep.has(i))];
  }
  const byRank = (a, b) => (a.rank == null ? -1 : a.rank) - (b.rank == null ? -1 : b.rank); // 2 before 10
  function fmtParams(p) { return Object.entries(p || {}).map(([k, v]) => k + "=" + v).join(" "); }

  // --- API -------------------------------------------------------------------------------------------
  async function api(path, opts) {
    const res = await fetch(path, Object.assign({ credentials: "same-origin", cache: "no-store" }, opts || {}));
    let doc = null;
    try { doc = await res.json(); } catch (e) { doc = null; }
    if (!res.ok) {
      const err = new Error((doc && doc.error) || res.status + " " + res.statusText);
      err.status = res.status;
      throw err;
    }
    return doc;
  }
  const runUrl = (id, rest) => "/api/runs/" + encodeURIComponent(id) + "/" + rest;
  const artifactUrl = (id, name) => runUrl(id, "artifacts/" + encodeURIComponent(name));

  // --- routing ---------------------------------------------------------------------------------------
  function route() {
    stopPolling();
    destroyCharts();
    const m = location.hash.match(/^#\/run\/(.+)$/);
    if (m) showRun(decodeURIComponent(m[1]));
    else showList();
  }
  function stopPolling() { if (state.timer) clearTimeout(state.timer); state.timer = null; }
  function destroyCharts() {
    Object.values(state.charts).forEach((c) => { try { c.destroy(); } catch (e) { /* gone */ } });
    state.charts = {};
    state.barSpecs = {};
  }
  function crumbs(html) { document.getElementById("crumbs").innerHTML = html; }
  function setLive(on) { document.getElementById("live").hidden = !on; }
  function showError(err) {
    const app = document.getElementById("app");
    if (err && (err.status === 401 || err.status === 403)) {
      app.innerHTML = '<div class="card"><h2>Not signed in</h2><p>' + esc(err.message) + "</p></div>";
    } else {
      app.innerHTML = '<div class="card"><h2>Something went wrong</h2><p>' + esc(err && err.message) + "</p></div>";
    }
  }

  // --- run list --------------------------------------------------------------------------------------
  async function showList() {
    state.runId = null;
    crumbs("runs");
    setLive(false);
    let doc;
    try { doc = await api("/api/runs"); } catch (e) { return showError(e); }
    if (doc.single && doc.runs.length === 1) { location.replace("#/run/" + encodeURIComponent(doc.runs[0].id)); return; }
    const rows = doc.runs.map((r) => `
      <tr class="clickable" data-run="${esc(r.id)}">
        <td><a href="#/run/${encodeURIComponent(r.id)}">${esc(r.name || r.id)}</a><div class="muted mono">${esc(r.id)}</div></td>
        <td><span class="badge ${esc(r.status)}">${esc(r.status)}</span></td>
        <td>${esc(fmtTime(r.start_ns))}</td>
        <td class="num">${r.end_ns && r.start_ns ? fmtS((r.end_ns - r.start_ns) / 1e9) : "–"}</td>
        <td class="num">${r.steps == null ? "–" : fmtNum(r.steps)}</td>
        <td class="num">${r.median_step_s ? fmtS(r.median_step_s) : "–"}</td>
        <td class="mono">${esc((r.command || []).join(" "))}</td>
      </tr>`).join("");
    document.getElementById("app").innerHTML = `
      <h1>Runs</h1><div class="sub mono">${esc(doc.root)}</div>
      <div class="card scroll">
        ${doc.runs.length ? `<table id="runs-table"><thead><tr><th>run</th><th>status</th><th>started</th><th class="num">duration</th><th class="num">steps</th><th class="num">median step</th><th>command</th></tr></thead><tbody>${rows}</tbody></table>`
          : '<div class="empty">No runs here yet. Start one with <code>holoprof run -- python train.py</code>.</div>'}
      </div>`;
    document.querySelectorAll("tr[data-run]").forEach((tr) => tr.addEventListener("click", () => {
      location.hash = "#/run/" + encodeURIComponent(tr.dataset.run);
    }));
    state.timer = setTimeout(() => { if (!state.runId && !location.hash.startsWith("#/run/")) showList(); }, 5000);
  }

  // --- one run ---------------------------------------------------------------------------------------
  // The first screen: the headline numbers, then where a step goes (or, for a run without steps, its
  // I/O) beside the findings; the charts and tables after.
  function skeleton(id) {
    document.getElementById("app").innerHTML = `
      <h1 id="run-title">${esc(id)}</h1>
      <div class="sub mono" id="run-sub"></div>
      <div class="kpis" id="kpis"></div>
      <div class="grid" id="first">
        <div class="card span-6 scroll" id="headline-card"><h2 id="headline-title">Where a step goes</h2><div id="headline"></div></div>
        <div class="card span-6" id="findings-card"><h2>Findings</h2><div id="findings"></div></div>
      </div>
      <div class="grid" id="step-grid">
        <div class="card span-6"><h2>Step time</h2><div class="chart" id="step-chart" data-points="0"></div></div>
        <div class="card span-6"><h2>Phases over steps</h2><div class="chart" id="phase-chart"></div></div>
      </div>
      <div class="grid" id="rank-grid"></div>
      <div class="grid" id="straggler-grid"></div>
      <div class="grid" id="timeline-grid">
        <div class="card span-12 timeline"><h2 id="timeline-title">Recent steps</h2><div id="timeline"></div></div>
      </div>
      <div class="grid" id="resources"></div>
      <div class="grid" id="hosts-grid"></div>
      <div class="grid" id="actions-grid" hidden>
        <div class="card span-12" id="actions-card"><h2>On demand</h2><div id="actions"></div></div>
      </div>
      <div class="grid" id="deep"></div>
      <div class="grid" id="extra"></div>
      <div class="grid">
        <div class="card span-12 scroll"><h2>Processes</h2><div id="processes"></div></div>
      </div>`;
  }

  async function showRun(id) {
    state.runId = id;
    state.lastReport = null;
    crumbs('<a href="#/">runs</a> / ' + esc(id));
    skeleton(id);
    renderActionsShell(id);
    await tick(id);
  }

  async function tick(id) {
    if (state.runId !== id) return;
    let running = false;
    try {
      const [report, actions] = await Promise.all([api(runUrl(id, "report")), api(runUrl(id, "actions"))]);
      if (state.runId !== id) return;
      running = report.run.status === "running";
      renderReport(id, report);
      renderActions(id, actions);
      const msg = document.getElementById("poll-msg");
      if (msg) msg.textContent = "";
    } catch (e) {
      if (state.runId !== id) return;
      if (!state.lastReport) return showError(e);
      const msg = document.getElementById("poll-msg");
      if (msg) msg.textContent = "update failed: " + e.message;
      running = true;
    }
    setLive(running);
    state.timer = setTimeout(() => tick(id), running ? POLL_MS : POLL_MS * 4);
  }

  function renderReport(id, r) {
    state.lastReport = r;
    const run = r.run, st = r.steps, io = r.io || {};
    const hasSteps = (st.count || 0) > 0;
    const ioFirst = !hasSteps && Object.keys(io).length > 0;
    document.getElementById("run-title").innerHTML = esc(run.name || id) + ` <span class="badge ${esc(run.status)}" id="run-status">${esc(run.status)}</span>`;
    document.getElementById("run-sub").textContent = (run.command || []).join(" ");
    const kpis = ioFirst ? ioKpis(r) : stepKpis(r);
    document.getElementById("kpis").innerHTML = kpis.map(([l, v, h]) => `<div class="kpi"><div class="l">${esc(l)}</div><div class="v">${esc(v)}</div>${h ? `<div class="h">${esc(h)}</div>` : ""}</div>`).join("");
    document.getElementById("step-grid").hidden = !hasSteps;
    document.getElementById("timeline-grid").hidden = !hasSteps;
    if (hasSteps) {
      renderStepChart(st.timeline || []);
      renderPhaseChart(st.timeline || [], H.phasesOf(r));
      renderTimeline(st, H.phasesOf(r));
    } else {
      ["step", "phase", "timeline"].forEach(destroyKey);
    }
    renderHeadline(r, hasSteps, ioFirst);
    renderRanks(r);
    renderStragglers(r);
    renderResources(r.resources || {});
    renderHosts(r.resources || {});
    renderExtra(r, ioFirst);
    renderFindings(r.findings || []);
    renderProcesses(r.processes || []);
  }

  function stepKpis(r) {
    const run = r.run, st = r.steps;
    const out = [
      ["steps", fmtNum(st.count)],
      ["median step", fmtS(st.median_s)],
      ["p90 step", fmtS(st.p90_s)],
      ["throughput", st.per_s ? +st.per_s.toFixed(st.per_s < 10 ? 2 : 1) + " steps/s" : "–"],
      ["epochs", st.epochs == null ? "unknown" : fmtNum(st.epochs)],
      ["duration", fmtS(run.duration_s)],
      processesKpi(run),
    ];
    if (run.dropped_events) out.push(["dropped events", fmtNum(run.dropped_events)]);
    return out;
  }
  // a run without training steps (an imported Darshan log, a data-preparation job): its I/O first
  function ioKpis(r) {
    const run = r.run, io = r.io || {};
    return [
      ["read", fmtBytes(io.bytes_read), fmtNum(io.reads || 0) + " read calls"],
      ["written", fmtBytes(io.bytes_written), fmtNum(io.writes || 0) + " write calls"],
      ["read bandwidth", fmtRate(io.bandwidth_read_wall_bytes_per_s), "over the run"],
      ["write bandwidth", fmtRate(io.bandwidth_write_wall_bytes_per_s), "over the run"],
      ["files", fmtNum(io.files)],
      ["duration", fmtS(run.duration_s)],
      processesKpi(run),
    ];
  }
  function processesKpi(run) {
    if (run.ranks && run.ranks === run.processes) return ["ranks", fmtNum(run.ranks)];
    return ["processes", fmtNum(run.processes), run.ranks ? fmtNum(run.ranks) + " ranks" : ""];
  }

  function renderHeadline(r, hasSteps, ioFirst) {
    const el = document.getElementById("headline");
    const title = document.getElementById("headline-title");
    if (hasSteps) {
      title.textContent = "Where a step goes";
      const out = r.outside_steps || {};
      const outside = Object.entries(out.phases || {}).filter(([, v]) => v > 0);
      el.innerHTML = H.phaseBarHtml(r) + `<div class="muted denominator">Shares are of the main loop's total step time (${esc(fmtS(r.steps.total_s))} over ${esc(fmtNum(r.steps.count))} steps).</div>`
        + (outside.length ? `<div class="muted denominator">Outside training steps: ${outside.map(([k, v]) => esc(phaseLabel(k)) + " " + esc(fmtS(v))).join(", ")}</div>` : "");
    } else if (ioFirst) {
      title.textContent = "I/O";
      el.innerHTML = ioSummaryHtml(r.io, 8, true);
    } else {
      title.textContent = "Steps";
      el.innerHTML = `<div class="empty">${r.run.status === "running" ? "No training step yet." : "No training steps in this run. Steps come from optimizer.step() (PyTorch) or holoprof.step()."}</div>`;
    }
  }

  // --- charts (specs from the shared views file) ------------------------------------------------------
  function chartWidth(el) { return Math.max(280, el.clientWidth || 500); }
  function upsert(key, el, spec, height) {
    const h = height || 220;
    let c = state.charts[key];
    if (c && c.series.length !== spec.opts.series.length) { c.destroy(); c = null; }
    if (!c) {
      el.innerHTML = "";
      c = new uPlot(Object.assign({ width: chartWidth(el), height: h }, spec.opts), spec.data, el);
      state.charts[key] = c;
    } else {
      c.setData(spec.data);
      const w = chartWidth(el);
      if (Math.abs(w - c.width) > 4) c.setSize({ width: w, height: h });
    }
    return c;
  }
  // a bar chart of the shared views (H.barSpec's options o): new numbers go into the chart drawn when
  // its series are the same, else a new chart replaces it; el.dataset.builds counts the charts made
  function upsertBars(key, el, o) {
    const c = state.charts[key];
    if (c && c.root.parentElement === el && state.barSpecs[key].update(c, o)) return c;
    destroyKey(key);
    const spec = H.barSpec(o);
    el.innerHTML = "";
    state.charts[key] = new uPlot(Object.assign({ width: chartWidth(el), height: spec.height }, spec.opts), spec.data, el);
    state.barSpecs[key] = spec;
    el.dataset.builds = String(Number(el.dataset.builds || 0) + 1);
    return state.charts[key];
  }
  function destroyKey(k) { if (state.charts[k]) { state.charts[k].destroy(); delete state.charts[k]; } delete state.barSpecs[k]; }

  function renderStepChart(tl) {
    const el = document.getElementById("step-chart");
    if (!tl.length) { el.innerHTML = '<div class="empty">No training step yet.</div>'; destroyKey("step"); el.dataset.points = "0"; return; }
    upsert("step", el, H.stepSpec(tl));
    el.dataset.points = String(tl.length);
    el.dataset.lastStep = String(tl[tl.length - 1].step);
  }

  function renderPhaseChart(tl, phases) {
    const el = document.getElementById("phase-chart");
    if (!tl.length) { el.innerHTML = '<div class="empty">No training step yet.</div>'; destroyKey("phase"); return; }
    const spec = H.phaseSpec(tl, phases);
    upsert("phase", el, spec);
    el.dataset.phases = spec.shown.join(" ");
  }

  // each rank's median step and its parts (a job of several step processes: DDP ranks)
  function renderRanks(r) {
    const host = document.getElementById("rank-grid");
    const per = (r.steps && r.steps.per_rank) || [];
    if (per.length < 2) { host.innerHTML = ""; destroyKey("ranks"); return; }
    if (!document.getElementById("rank-chart")) {
      host.innerHTML = `<div class="card span-12" id="rank-card"><h2>Step time per rank</h2><div class="sub">median step of each rank, split into its phases</div><div class="chart" id="rank-chart"></div></div>`;
      destroyKey("ranks");
    }
    const el = document.getElementById("rank-chart");
    const spec = H.rankSpec(per, H.phasesOf(r));
    upsert("ranks", el, spec, 260);
    el.dataset.ranks = String(per.length);
    el.dataset.phases = spec.shown.join(" ");
  }

  // the rank × step heatmap (report.stragglers.heatmap), drawn by the shared views; the map chosen
  // (step time, compute, ...) stays chosen across updates
  function renderStragglers(r) {
    const host = document.getElementById("straggler-grid");
    const heat = (r.stragglers || {}).heatmap || {};
    if (!(heat.ranks || []).length) { host.innerHTML = ""; return; }
    if (!document.getElementById("rank-heatmap")) {
      host.innerHTML = `<div class="card span-12" id="heatmap-card"><h2>Ranks × steps</h2><div class="sub" id="heatmap-sub"></div><div class="heatmap" id="rank-heatmap"></div></div>`;
    }
    document.getElementById("heatmap-sub").textContent = "one row per rank, one column per step"
      + (heat.binned ? ` (each the mean of ${heat.bin_steps} consecutive steps)` : "")
      + "; a fast rank's exposed communication is mostly waiting for the slowest";
    const el = document.getElementById("rank-heatmap");
    H.heatmap(el, heat, el.dataset.map);
  }

  // The timeline holds at most ~120 points: on a long run each is the mean of several steps, and the
  // rows say which steps they cover.
  function renderTimeline(st, phases) {
    const tl = st.timeline || [];
    const el = document.getElementById("timeline");
    const recent = tl.slice(-12);
    if (!recent.length) { destroyKey("timeline"); el.innerHTML = '<div class="empty">No training step yet.</div>'; el.dataset.rows = "0"; return; }
    const per = tl.length > 1 ? tl[tl.length - 1].step - tl[tl.length - 2].step : 1;
    const lastStep = tl[tl.length - 1].step + Math.max(0, (st.count || tl.length) - 1 - (tl.length - 1) * per);
    const label = (t, i) => {
      const first = t.step, next = i + 1 < recent.length ? recent[i + 1].step : lastStep + 1;
      return next - first > 1 ? `steps ${fmtNum(first)}–${fmtNum(next - 1)}` : `step ${fmtNum(first)}`;
    };
    document.getElementById("timeline-title").textContent = per > 1
      ? `Recent steps (each bar the mean of ${per} consecutive steps)` : "Recent steps";
    const shown = phases.filter((p) => recent.some((t) => t[p] > 0));
    const labels = recent.map(label);
    const c = upsertBars("timeline", el, {
      labels, horizontal: true, stacked: true, unit: "seconds", xLabel: "step", tip: true, width: chartWidth(el),
      series: shown.map((p) => ({ label: phaseLabel(p), color: phaseColor(p), values: recent.map((t) => t[p] || null) })),
      texts: recent.map((t) => ({ text: fmtS(t.step_s) })),
    });
    el.dataset.rows = String(c.data[0].length);
    el.dataset.labels = JSON.stringify(labels);
    el.dataset.phases = shown.join(" ");
  }

  function renderResources(res) {
    const host = document.getElementById("resources");
    const present = H.resourceSpecs(res.series || {});
    const keys = new Set(present.map((g) => "res-" + g.key));
    Object.keys(state.charts).filter((k) => k.startsWith("res-") && !keys.has(k)).forEach(destroyKey);
    Array.from(host.children).filter((c) => !keys.has(c.id)).forEach((c) => c.remove());
    present.forEach((g) => {
      let card = document.getElementById("res-" + g.key);
      if (!card) {
        card = document.createElement("div");
        card.className = "card span-6";
        card.id = "res-" + g.key;
        card.innerHTML = `<h2>${esc(g.title)}</h2><div class="chart"></div>`;
        host.appendChild(card);
      }
      upsert("res-" + g.key, card.querySelector(".chart"), g.spec);
    });
  }

  // Each host's resources (a run of two hosts or more): every host up to HOST_ROWS, else the busiest
  // and the idlest by CPU, one row with the range of the others, and how the hosts spread (as the
  // terminal and the HTML report show them: holoprof.present.hosts).
  const HOST_ROWS = 8;
  const pctText = (v) => (+v).toFixed(0) + "%";
  const HOST_COLS = [
    ["CPU mean", "cpu_percent", "mean", pctText], ["CPU p90", "cpu_percent", "p90", pctText],
    ["memory mean", "memory_used_bytes", "mean", fmtBytes], ["memory peak", "memory_used_bytes", "max", fmtBytes],
    ["net in mean", "net_recv_bytes_per_s", "mean", fmtRate], ["net in peak", "net_recv_bytes_per_s", "max", fmtRate],
    ["net out mean", "net_sent_bytes_per_s", "mean", fmtRate], ["net out peak", "net_sent_bytes_per_s", "max", fmtRate],
    ["job CPU", "job_cpu_percent", "mean", pctText], ["job RSS peak", "job_rss_bytes", "max", fmtBytes],
    ["GPU util", "gpu_util_percent", "mean", pctText],
  ];
  const HOST_SPREAD = [["cpu_percent", "CPU", pctText], ["memory_used_bytes", "memory used", fmtBytes],
    ["net_recv_bytes_per_s", "network in", fmtRate], ["net_sent_bytes_per_s", "network out", fmtRate],
    ["job_cpu_percent", "job CPU", pctText], ["job_rss_bytes", "job RSS", fmtBytes], ["gpu_util_percent", "GPU utilization", pctText]];
  function hostValue(h, key, stat) { const f = h[key]; return f && f[stat] != null ? +f[stat] : null; }
  function hostRanks(rs) {
    if (!rs || !rs.length) return "–";
    if (rs.length > 1 && rs[rs.length - 1] - rs[0] === rs.length - 1) return rs[0] + "-" + rs[rs.length - 1];
    return rs.slice(0, 4).join(", ") + (rs.length > 4 ? ` (+${rs.length - 4})` : "");
  }
  function renderHosts(res) {
    const el = document.getElementById("hosts-grid");
    const hosts = (res.hosts || []).slice().sort((a, b) => String(a.host).localeCompare(String(b.host), undefined, { numeric: true }));
    if (hosts.length < 2) { el.innerHTML = ""; return; }
    const cols = HOST_COLS.filter(([, k, s]) => hosts.some((h) => hostValue(h, k, s) != null));
    const busy = (h) => { const v = hostValue(h, "cpu_percent", "mean"); return v != null ? v : hostValue(h, "job_cpu_percent", "mean") || 0; };
    let top = hosts, rest = [], bottom = [];
    if (hosts.length > HOST_ROWS) {
      const order = hosts.slice().sort((a, b) => busy(b) - busy(a));
      const half = HOST_ROWS / 2;
      top = order.slice(0, half); rest = order.slice(half, -half); bottom = order.slice(-half);
    }
    const row = (h) => `<tr data-host="${esc(h.host)}"><td class="mono">${esc(h.host)}</td><td>${esc(hostRanks(h.ranks))}</td>${cols.map(([, k, s, f]) => { const v = hostValue(h, k, s); return `<td class="num">${v == null ? "–" : esc(f(v))}</td>`; }).join("")}</tr>`;
    const range = ([, k, s, f]) => {
      const vs = rest.map((h) => hostValue(h, k, s)).filter((v) => v != null);
      if (!vs.length) return "–";
      const lo = f(Math.min(...vs)), hi = f(Math.max(...vs));
      return lo === hi ? lo : lo + "–" + hi;
    };
    const spread = res.host_spread || {};
    const lines = rest.length ? HOST_SPREAD.filter(([k]) => spread[k]).map(([k, label, f]) => { const s = spread[k]; return `<div class="muted spread">${esc(label)}: ${esc(f(s.min))} (${esc(s.min_host)}) · median ${esc(f(s.median))} · ${esc(f(s.max))} (${esc(s.max_host)}) over ${s.hosts} hosts</div>`; }).join("") : "";
    el.innerHTML = `<div class="card span-12 scroll" id="hosts-card"><h2>Resources per host (${hosts.length} hosts)</h2>
      <div class="sub">each host's launcher samples its machine (CPU: 100% = every core) and the job's processes on it (job CPU: 100% = one core)</div>
      <table id="hosts-table"><thead><tr><th>host</th><th>ranks</th>${cols.map(([n]) => `<th class="num">${esc(n)}</th>`).join("")}</tr></thead><tbody>
      ${top.map(row).join("")}
      ${rest.length ? `<tr class="more"><td>… ${rest.length} more hosts</td><td></td>${cols.map((c) => `<td class="num">${esc(range(c))}</td>`).join("")}</tr>` : ""}
      ${bottom.map(row).join("")}
      </tbody></table>${rest.length ? '<div class="muted">the busiest and the idlest hosts by CPU; every host is in the API\'s report</div>' : ""}${lines}</div>`;
  }

  // reads and writes of the run: totals, bandwidth over the run (and inside the calls), top files
  // (``compact``: the first screen's, with fewer columns)
  function ioSummaryHtml(io, limit, compact) {
    const all = io.files_detail || [];
    const files = all.slice(0, limit);
    const shownRead = files.reduce((a, f) => a + (f.bytes_read || 0), 0);
    const shownWritten = files.reduce((a, f) => a + (f.bytes_written || 0), 0);
    const moreFiles = Math.max(0, (io.files || all.length) - files.length);
    const moreRead = Math.max(0, (io.bytes_read || 0) - shownRead), moreWritten = Math.max(0, (io.bytes_written || 0) - shownWritten);
    const more = [moreRead ? fmtBytes(moreRead) + " read" : "", moreWritten ? fmtBytes(moreWritten) + " written" : ""].filter(Boolean).join(", ");
    return `<table class="io-totals"><thead><tr><th></th><th class="num">bytes</th><th class="num">calls</th><th class="num" title="summed over the processes">time in calls</th><th class="num">over the run</th><th class="num" title="bytes over the time in calls summed over the processes">per process in calls</th></tr></thead><tbody>
        <tr><td>read</td><td class="num">${fmtBytes(io.bytes_read)}</td><td class="num">${fmtNum(io.reads || 0)}</td><td class="num">${fmtS(io.read_time_s)}</td><td class="num">${fmtRate(io.bandwidth_read_wall_bytes_per_s)}</td><td class="num">${fmtRate(io.bandwidth_read_bytes_per_s)}</td></tr>
        <tr><td>written</td><td class="num">${fmtBytes(io.bytes_written)}</td><td class="num">${fmtNum(io.writes || 0)}</td><td class="num">${fmtS(io.write_time_s)}</td><td class="num">${fmtRate(io.bandwidth_write_wall_bytes_per_s)}</td><td class="num">${fmtRate(io.bandwidth_write_bytes_per_s)}</td></tr>
      </tbody></table>
      ${files.length ? `<table class="io-files"><thead><tr><th>file</th><th class="num">read</th><th class="num">written</th><th class="num">reads</th><th class="num">writes</th>${compact ? "" : '<th class="num">sequential</th><th class="num">read time</th>'}</tr></thead><tbody>
      ${files.map((f) => `<tr><td class="mono">${esc(f.path)}</td><td class="num">${fmtBytes(f.bytes_read)}</td><td class="num">${fmtBytes(f.bytes_written)}</td><td class="num">${fmtNum(f.reads)}</td><td class="num">${fmtNum(f.writes)}</td>${compact ? "" : `<td class="num">${f.reads ? fmtPct(f.seq_read_fraction) : "–"}</td><td class="num">${fmtS(f.read_time_s)}</td>`}</tr>`).join("")}
      ${moreFiles ? `<tr class="more"><td colspan="${compact ? 5 : 7}">… and ${fmtNum(moreFiles)} more files${more ? ": " + more : ""}</td></tr>` : ""}
      </tbody></table>` : ""}`;
  }

  function fmtFlops(x, unit) {
    if (x == null) return "–";
    const u = unit || "FLOP";
    for (const [sc, p] of [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "K"]]) {
      if (Math.abs(x) >= sc) return (x / sc).toFixed(1) + " " + p + u;
    }
    return x.toFixed(0) + " " + u;
  }
  function computeCard(r) {
    const c = r.compute || {};
    const g = r.goodput || {};
    if (!Object.keys(c).length && !Object.keys(g).length) return "";
    const comp = c.compile || {};
    const kpi = (l, v) => `<div class="kpi"><div class="l">${esc(l)}</div><div class="v">${esc(v)}</div></div>`;
    const kpis = [];
    if (c.flops_per_step) {
      kpis.push(kpi("FLOPs per step", fmtFlops(c.flops_per_step)), kpi("achieved", fmtFlops(c.achieved_flops_per_s, "FLOP/s")));
      kpis.push(kpi("MFU", H.fmtMfu(c.mfu)));
    }
    if (g.categories) kpis.push(kpi("goodput", fmtPct(g.fraction)));
    if (Object.keys(comp).length) kpis.push(kpi("compiling", fmtS(comp.total_s)));
    const cats = Object.entries(g.categories || {}).filter(([, v]) => v > 0);
    return `<div class="card span-6" id="compute-card"><h2>Compute and goodput</h2>
      <div class="kpis">${kpis.join("")}</div>
      ${c.why ? `<p class="muted">FLOPs not counted: ${esc(c.why)}</p>` : ""}
      ${c.peak_source ? `<p class="muted">peak: ${esc(c.peak_source)}</p>` : ""}
      ${cats.length ? `<table><tbody>${cats.map(([k, v]) => `<tr><td>${esc(k.replace(/_/g, " "))}</td><td class="num">${fmtS(v)}</td><td class="num">${fmtPct(v / g.wall_s)}</td></tr>`).join("")}</tbody></table>` : ""}
      ${(comp.graph_breaks || []).concat(comp.recompiles || []).slice(0, 8).map((b) => `<p class="muted">${esc(b.reason)} at ${esc(b.location)} (${esc(b.count)}×)</p>`).join("")}
    </div>`;
  }
  function renderExtra(r, ioFirst) {
    const out = [];
    const cc = computeCard(r);
    if (cc) out.push(cc);
    const io = r.io || {};
    if (Object.keys(io).length && !ioFirst) {
      out.push(`<div class="card span-12 scroll" id="io-card"><h2>I/O</h2>${ioSummaryHtml(io, 12)}</div>`);
    }
    const mem = r.memory || {};
    const cats = mem.categories || {};
    const catItems = Object.entries(cats).filter(([, v]) => typeof v === "number" && v > 0);
    if (catItems.length) {
      const total = catItems.reduce((a, [, v]) => a + v, 0);
      const mc = (k) => H.P.memory_colors[k] || H.P.unknown_phase_color;
      out.push(`<div class="card span-6" id="memory-card"><h2>Memory${mem.device ? " (" + esc(mem.device) + ")" : ""}</h2>
        <div class="kpis"><div class="kpi"><div class="l">peak</div><div class="v">${fmtBytes(mem.peak_bytes)}</div></div></div>
        <div class="phasebar">${catItems.map(([k, v]) => `<div title="${esc(k)} ${fmtBytes(v)}" style="width:${((v / total) * 100).toFixed(3)}%;background:${mc(k)}"></div>`).join("")}</div>
        <table><tbody>${catItems.map(([k, v]) => `<tr><td><span class="sw" style="background:${mc(k)}"></span>${esc(k.replace(/_/g, " "))}</td><td class="num">${fmtBytes(v)}</td><td class="num">${fmtPct(v / total)}</td></tr>`).join("")}</tbody></table></div>`);
    }
    const comm = r.communication || {};
    const perRank = comm.per_rank || [];
    const stepRanks = (r.steps && r.steps.per_rank) || [];
    if (perRank.length || stepRanks.length) {
      const all = (perRank.length ? perRank : stepRanks).slice().sort(byRank);
      const [rows, rest] = topRows(all, (x) => x.step_median_s != null ? x.step_median_s : x.median_s);
      const keys = Array.from(new Set(rows.flatMap((x) => Object.keys(x)))).filter((k) => k !== "phases" && typeof rows[0][k] !== "object");
      out.push(`<div class="card span-12 scroll" id="comm-card"><h2>Communication and ranks</h2>
        ${comm.bytes_per_step != null ? `<div class="kpis"><div class="kpi"><div class="l">bytes per step</div><div class="v">${fmtBytes(comm.bytes_per_step)}</div></div><div class="kpi"><div class="l">exposed communication</div><div class="v">${fmtPct(comm.exposed_fraction)}</div></div></div>` : ""}
        <table><thead><tr>${keys.map((k) => `<th class="num">${esc(colLabel(k))}</th>`).join("")}</tr></thead><tbody>
        ${rows.map((x) => `<tr>${keys.map((k) => `<td class="num">${esc(fmtCell(k, x[k]))}</td>`).join("")}</tr>`).join("")}
        ${rest.length ? `<tr class="more"><td colspan="${keys.length}">… and ${rest.length} more ranks (the slowest are shown; every rank is in the API's report)</td></tr>` : ""}
        </tbody></table></div>`);
    }
    document.getElementById("extra").innerHTML = out.join("");
  }
  // a column's name without its unit: the cells carry it ("step median", not "step median s")
  const COL_LABELS = { count: "steps", median_s: "median step", p90_s: "p90 step", per_s: "steps per second" };
  function colLabel(k) { return COL_LABELS[k] || H.evidenceLabel(k); }
  function fmtCell(k, v) {
    if (typeof v !== "number") return v == null ? "–" : String(v);
    if (/^(pid|rank|local_rank|host)$/.test(k)) return String(v);
    return H.evidenceValue(k, v);
  }

  function renderFindings(fs) {
    const el = document.getElementById("findings");
    el.innerHTML = H.findingsHtml(fs);
  }

  function renderProcesses(ps) {
    const el = document.getElementById("processes");
    if (!ps.length) { el.innerHTML = '<div class="empty">No process has reported yet.</div>'; return; }
    const now = Date.now() * 1e6;
    const [shown, rest] = topRows(ps.slice().sort(byRank), (p) => (p.end_ns || now) - (p.start_ns || now));
    el.innerHTML = `<table id="processes-table"><thead><tr><th>process</th><th>role</th><th class="num">rank</th><th class="num">steps</th><th>state</th><th>command</th></tr></thead><tbody>
      ${shown.map((p) => `<tr><td class="mono">${esc(p.host)}-${esc(p.pid)}</td><td>${esc(p.role)}</td><td class="num">${p.rank >= 0 ? p.rank : "–"}</td><td class="num">${fmtNum(p.steps)}</td>
        <td>${p.end_ns ? `<span class="badge">exited${p.exit_code >= 0 ? " " + p.exit_code : ""}</span>` : '<span class="badge running">running</span>'}${p.errors && p.errors.length ? ' <span class="badge failed" title="' + esc(p.errors.join("\n")) + '">errors</span>' : ""}</td>
        <td class="mono">${esc((p.argv || []).join(" ").slice(0, 140))}</td></tr>`).join("")}
      ${rest.length ? `<tr class="more"><td colspan="6">… and ${rest.length} more processes (the longest are shown): ${fmtNum(rest.reduce((a, p) => a + (p.steps || 0), 0))} steps</td></tr>` : ""}
      </tbody></table>`;
  }

  // --- on-demand actions -----------------------------------------------------------------------------
  function renderActionsShell(id) {
    document.getElementById("actions").innerHTML = `
      <div class="actions">
        <button id="btn-stacks" data-action="stacks">Stack dump</button>
        <span class="group"><button id="btn-deep-profile" data-action="deep-profile">Deep profile</button>
          <label>steps <input type="number" id="in-steps" min="1" max="100" value="5"></label></span>
        <button id="btn-memory-snapshot" class="secondary" data-action="memory-snapshot">Memory snapshot</button>
        <span class="group"><button id="btn-io-trace" class="secondary" data-action="io-trace">I/O trace</button>
          <label>seconds <input type="number" id="in-seconds" min="1" max="600" value="10"></label></span>
        <span class="muted" id="actions-note"></span>
      </div>
      <div class="msg" id="action-msg"></div>
      <div class="msg" id="poll-msg"></div>
      <div class="scroll" id="requests"></div>`;
    document.querySelectorAll("#actions button[data-action]").forEach((b) => b.addEventListener("click", () => submitAction(id, b.dataset.action)));
  }

  async function submitAction(id, action) {
    const params = {};
    if (action === "deep-profile") params.steps = parseInt(document.getElementById("in-steps").value, 10);
    if (action === "io-trace") params.seconds = parseInt(document.getElementById("in-seconds").value, 10);
    const msg = document.getElementById("action-msg");
    msg.textContent = "";
    try {
      await api(runUrl(id, "actions"), {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-Holoprof-Request": "1" },
        body: JSON.stringify({ action, params, target: null }),
      });
      const actions = await api(runUrl(id, "actions"));
      renderActions(id, actions);
    } catch (e) {
      msg.textContent = e.message;
    }
  }

  function renderActions(id, doc) {
    state.lastActions = doc;
    const running = doc.status === "running";
    // the buttons need a live job: a finished or imported run's page has no on-demand panel
    document.getElementById("actions-grid").hidden = !running;
    document.querySelectorAll("#actions button[data-action]").forEach((b) => { b.disabled = !running; });
    document.getElementById("actions-note").textContent = running ? "each traced process answers within about a second" : "the run is not running: on-demand actions need a live job";
    const reqs = doc.requests || [];
    const el = document.getElementById("requests");
    if (!reqs.length) { el.innerHTML = '<div class="empty">No request yet.</div>'; renderDeep(id, reqs); return; }
    el.innerHTML = `<table id="requests-table"><thead><tr><th>requested</th><th>action</th><th>process</th><th>state</th><th>artifacts</th></tr></thead><tbody>
      ${reqs.map((q) => {
        const states = q.states.length ? q.states : [null];
        return states.map((s, i) => `<tr data-request="${esc(q.id)}">
          ${i === 0 ? `<td rowspan="${states.length}">${esc(fmtTime(q.created_ns))}<div class="muted mono">${esc(q.id)}</div></td><td rowspan="${states.length}">${esc(q.action)} <span class="muted">${esc(fmtParams(q.params))}</span></td>` : ""}
          <td class="mono">${s ? esc(s.host + "-" + s.pid) + ` <span class="muted">${esc(s.role)}</span>` : '<span class="muted">waiting for the processes…</span>'}</td>
          <td>${s ? `<span class="badge ${esc(s.state)}">${esc(s.state)}</span>${s.reason ? ` <span class="muted">${esc(s.reason)}</span>` : ""}${s.info && s.info.phase && s.state === "running" ? ` <span class="muted">${esc(s.info.phase)}</span>` : ""}` : '<span class="badge queued">queued</span>'}</td>
          <td>${s ? (s.artifacts || []).map((a) => `<a class="artifact-link" href="${artifactUrl(id, a)}" download="${esc(a)}">${esc(a)}</a>`).join("<br>") : ""}</td>
        </tr>`).join("");
      }).join("")}
      </tbody></table>`;
    renderDeep(id, reqs);
  }

  async function renderDeep(id, reqs) {
    const host = document.getElementById("deep");
    let found = null;
    for (const q of reqs) {
      if (q.action !== "deep-profile") continue;
      for (const s of q.states) {
        const summary = (s.artifacts || []).find((a) => a.endsWith(".summary.json"));
        if (s.state === "done" && summary) { found = { q, s, summary, trace: (s.artifacts || []).find((a) => !a.endsWith(".summary.json")) }; break; }
      }
      if (found) break;
    }
    if (!found) { host.innerHTML = ""; return; }
    if (host.dataset.shown === found.summary) return;
    let doc = state.summaries[found.summary];
    if (!doc) {
      try { doc = await api(artifactUrl(id, found.summary), { headers: { Accept: "application/json" } }); } catch (e) { return; }
      state.summaries[found.summary] = doc;
    }
    host.dataset.shown = found.summary;
    const ops = doc.ops || [];
    host.innerHTML = `<div class="card span-12 scroll" id="deep-card"><h2>Deep profile: top ops by self CPU time</h2>
      <div class="sub">${esc(found.s.host + "-" + found.s.pid)} · ${fmtNum(doc.steps)} steps after ${fmtNum(doc.warmup_steps)} warm-up step${doc.partial ? " (partial: the process ended)" : ""} ·
        ${found.trace ? `<a class="artifact-link" id="trace-link" href="${artifactUrl(id, found.trace)}" download="${esc(found.trace)}">download the trace</a> (opens in Perfetto or chrome://tracing)` : ""}</div>
      <table id="op-table"><thead><tr><th>op</th><th>input shapes</th><th class="num">calls</th><th class="num">self CPU</th><th class="num">share</th><th class="num">total CPU</th><th class="num">per call</th></tr></thead><tbody>
      ${ops.map((o) => `<tr><td class="mono">${esc(o.name)}</td><td class="mono muted">${esc(o.input_shapes)}</td><td class="num">${fmtNum(o.calls)}</td><td class="num">${fmtUs(o.self_cpu_us)}</td><td class="num">${fmtPct(o.self_cpu_fraction)}</td><td class="num">${fmtUs(o.total_cpu_us)}</td><td class="num">${fmtUs(o.self_cpu_us / Math.max(1, o.calls))}</td></tr>`).join("")}
      </tbody></table></div>`;
  }

  // the token came in the address once: the server answered with a cookie, so drop it from the URL
  if (/[?&]token=/.test(location.search)) history.replaceState(null, "", location.pathname + location.hash);
  window.addEventListener("hashchange", route);
  window.addEventListener("resize", () => {
    Object.values(state.charts).forEach((c) => { const el = c.root.parentElement; if (el) c.setSize({ width: chartWidth(el), height: c.height }); });
  });
  route();
})();
