/* holoprof dashboard: renders the holoprof.report/1 document of a run; computes nothing itself. */
(function () {
  "use strict";

  const POLL_MS = 1500;
  const PHASES = ["data_wait", "forward", "backward", "optimizer", "compile", "communication", "checkpoint", "eval", "other"];
  const COLORS = {
    data_wait: "#e45756", forward: "#4c78a8", backward: "#72b7b2", optimizer: "#54a24b", compile: "#ff9da6",
    communication: "#b279a2", checkpoint: "#f58518", eval: "#eeca3b", other: "#a5a9b4",
  };
  const LABELS = {
    data_wait: "data wait", forward: "forward", backward: "backward", optimizer: "optimizer", compile: "compile",
    communication: "communication", checkpoint: "checkpoint", eval: "eval", other: "other",
  };

  const state = { runId: null, timer: null, charts: {}, summaries: {}, lastReport: null, lastActions: null, busy: false };

  // --- formatting ------------------------------------------------------------------------------------
  function esc(v) {
    return String(v == null ? "" : v).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }
  function fmtS(s) {
    if (s == null || isNaN(s)) return "–";
    const a = Math.abs(s);
    if (a === 0) return "0 s";
    if (a < 1e-3) return (s * 1e6).toFixed(a < 1e-5 ? 2 : 0) + " µs";
    if (a < 1) return (s * 1e3).toFixed(a < 0.01 ? 2 : a < 0.1 ? 1 : 0) + " ms";
    if (a < 120) return s.toFixed(a < 10 ? 2 : 1) + " s";
    if (a < 7200) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return (s / 3600).toFixed(1) + " h";
  }
  // a phase's time per step: its median, or for a phase of a few steps only (eval, checkpoint: median 0)
  // its time per step where it occurs and in how many steps (as the terminal and HTML reports)
  function phasePerStep(v) {
    const n = v.steps || 0;
    if (!(v.median_s > 0) && v.total_s > 0 && n) return fmtS(v.per_occurrence_s) + " in " + n + (n === 1 ? " step" : " steps");
    return fmtS(v.median_s);
  }
  function fmtUs(us) { return fmtS(us / 1e6); }
  function fmtBytes(b) {
    if (b == null || isNaN(b)) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, v = Math.abs(b);
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (b < 0 ? "-" : "") + (i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)) + " " + u[i];
  }
  function fmtRate(b) { return fmtBytes(b) + "/s"; }
  function fmtPct(f) { return f == null ? "–" : (f * 100).toFixed(f < 0.1 ? 1 : 0) + "%"; }
  function fmtNum(n) { return n == null ? "–" : Number(n).toLocaleString("en-US"); }
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
        <td class="mono">${esc((r.command || []).join(" "))}</td>
      </tr>`).join("");
    document.getElementById("app").innerHTML = `
      <h1>Runs</h1><div class="sub mono">${esc(doc.root)}</div>
      <div class="card scroll">
        ${doc.runs.length ? `<table id="runs-table"><thead><tr><th>run</th><th>status</th><th>started</th><th class="num">duration</th><th>command</th></tr></thead><tbody>${rows}</tbody></table>`
          : '<div class="empty">No runs here yet. Start one with <code>holoprof run -- python train.py</code>.</div>'}
      </div>`;
    document.querySelectorAll("tr[data-run]").forEach((tr) => tr.addEventListener("click", () => {
      location.hash = "#/run/" + encodeURIComponent(tr.dataset.run);
    }));
    state.timer = setTimeout(() => { if (!state.runId && !location.hash.startsWith("#/run/")) showList(); }, 5000);
  }

  // --- one run ---------------------------------------------------------------------------------------
  function skeleton(id) {
    document.getElementById("app").innerHTML = `
      <h1 id="run-title">${esc(id)}</h1>
      <div class="sub mono" id="run-sub"></div>
      <div class="kpis" id="kpis"></div>
      <div class="grid">
        <div class="card span-6"><h2>Step time</h2><div class="chart" id="step-chart" data-points="0"></div></div>
        <div class="card span-6"><h2>Phases over steps</h2><div class="chart" id="phase-chart"></div></div>
      </div>
      <div class="grid">
        <div class="card span-6"><h2>Where a step goes</h2><div id="phasebar"></div></div>
        <div class="card span-6 timeline"><h2>Recent steps</h2><div id="timeline"></div></div>
      </div>
      <div class="grid" id="resources"></div>
      <div class="grid">
        <div class="card span-12" id="actions-card"><h2>On demand</h2><div id="actions"></div></div>
      </div>
      <div class="grid" id="deep"></div>
      <div class="grid" id="extra"></div>
      <div class="grid">
        <div class="card span-12"><h2>Findings</h2><div id="findings"></div></div>
      </div>
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
    const run = r.run, st = r.steps;
    document.getElementById("run-title").innerHTML = esc(run.name || id) + ` <span class="badge ${esc(run.status)}" id="run-status">${esc(run.status)}</span>`;
    document.getElementById("run-sub").textContent = (run.command || []).join(" ");
    const kpis = [
      ["steps", fmtNum(st.count)],
      ["epochs", st.epochs == null ? "unknown" : fmtNum(st.epochs)],
      ["median step", fmtS(st.median_s)],
      ["p90 step", fmtS(st.p90_s)],
      ["throughput", st.per_s ? st.per_s.toFixed(st.per_s < 10 ? 2 : 1) + " steps/s" : "–"],
      ["duration", fmtS(run.duration_s)],
      ["processes", fmtNum(run.processes) + (run.ranks ? " · " + run.ranks + " ranks" : "")],
      ["dropped events", fmtNum(run.dropped_events)],
    ];
    const clocks = run.host_clocks || [];
    const tips = {};
    if (clocks.length > 1) {  // a run of several hosts: their clocks are aligned, to within this
      const unc = clocks.map((c) => c.clock_uncertainty_s);
      const known = unc.filter((u) => u != null);
      const dead = (run.dead_hosts || []).length;
      kpis.push(["hosts", clocks.length + " · clocks " + (known.length === unc.length ? "± " + fmtS(Math.max(...known)) : "partly unaligned") + (dead ? " · " + dead + " dead" : "")]);
      tips.hosts = clocks.map((c) => `${c.host}: ranks ${(c.ranks || []).join(", ") || "none"}, ` + (c.clock_source === "reference" ? "reference clock" : c.clock_uncertainty_s == null ? "clock offset unknown" : `clock ${c.clock_offset_s >= 0 ? "+" : "-"}${fmtS(Math.abs(c.clock_offset_s))} ± ${fmtS(c.clock_uncertainty_s)} (${c.clock_source})`)).join("\n");
    }
    document.getElementById("kpis").innerHTML = kpis.map(([l, v]) => `<div class="kpi"${tips[l] ? ` title="${esc(tips[l])}"` : ""}><div class="l">${esc(l)}</div><div class="v">${esc(v)}</div></div>`).join("");
    renderStepChart(st.timeline || []);
    renderPhaseChart(st.timeline || []);
    renderPhaseBar(r.phases);
    renderTimeline(st.timeline || []);
    renderResources(r.resources || {});
    renderExtra(r);
    renderFindings(r.findings || []);
    renderProcesses(r.processes || []);
  }

  // --- charts ----------------------------------------------------------------------------------------
  function chartWidth(el) { return Math.max(280, el.clientWidth || 500); }
  function upsert(key, el, opts, data) {
    let c = state.charts[key];
    if (c && c.series.length !== opts.series.length) { c.destroy(); c = null; }
    if (!c) {
      el.innerHTML = "";
      c = new uPlot(Object.assign({ width: chartWidth(el), height: 220 }, opts), data, el);
      state.charts[key] = c;
    } else {
      c.setData(data);
      const w = chartWidth(el);
      if (Math.abs(w - c.width) > 4) c.setSize({ width: w, height: 220 });
    }
    return c;
  }
  const axis = (fmt, label) => ({ stroke: "#6b7385", grid: { stroke: "#eef1f5" }, ticks: { stroke: "#e3e7ee" }, size: 78, label, labelSize: 18, values: (u, ticks) => ticks.map(fmt) });

  function renderStepChart(tl) {
    const el = document.getElementById("step-chart");
    if (!tl.length) { el.innerHTML = '<div class="empty">No training step yet.</div>'; destroyKey("step"); el.dataset.points = "0"; return; }
    const xs = tl.map((p) => p.step), ys = tl.map((p) => p.step_s);
    upsert("step", el, {
      scales: { x: { time: false } },
      series: [{ label: "step", value: (u, v) => v == null ? "–" : fmtNum(v) }, { label: "step time", stroke: "#3b6fd8", width: 2, fill: "rgba(59,111,216,.08)", value: (u, v) => fmtS(v), points: { show: tl.length < 40 } }],
      axes: [axis((v) => fmtNum(v), "step"), axis((v) => fmtS(v))],
    }, [xs, ys]);
    el.dataset.points = String(tl.length);
    el.dataset.lastStep = String(xs[xs.length - 1]);
  }
  function destroyKey(k) { if (state.charts[k]) { state.charts[k].destroy(); delete state.charts[k]; } }

  function renderPhaseChart(tl) {
    const el = document.getElementById("phase-chart");
    if (!tl.length) { el.innerHTML = '<div class="empty">No training step yet.</div>'; destroyKey("phase"); return; }
    const shown = PHASES.filter((p) => tl.some((t) => t[p] > 0));
    const cum = [], acc = tl.map(() => 0);
    shown.forEach((p) => { cum.push(tl.map((t, i) => (acc[i] += t[p] || 0))); });
    // draw the top of the stack first: each lower area paints over the one above it
    const order = shown.map((p, i) => i).reverse();
    const series = [{ label: "step", value: (u, v) => v == null ? "–" : fmtNum(v) }].concat(order.map((i) => ({
      label: LABELS[shown[i]], stroke: COLORS[shown[i]], fill: COLORS[shown[i]], width: 1,
      points: { show: false },
      value: (u, v, si, idx) => idx == null ? "–" : fmtS(tl[idx][shown[i]]),
    })));
    upsert("phase", el, {
      scales: { x: { time: false } },
      series,
      axes: [axis((v) => fmtNum(v), "step"), axis((v) => fmtS(v))],
    }, [tl.map((t) => t.step)].concat(order.map((i) => cum[i])));
  }

  function renderPhaseBar(phases) {
    const el = document.getElementById("phasebar");
    const items = PHASES.map((p) => [p, phases[p] || { fraction: 0 }]).filter(([, v]) => v.fraction > 0);
    if (!items.length) { el.innerHTML = '<div class="empty">No training step yet.</div>'; return; }
    el.innerHTML = `<div class="phasebar">${items.map(([p, v]) => `<div title="${esc(LABELS[p])} ${fmtPct(v.fraction)}" style="width:${(v.fraction * 100).toFixed(3)}%;background:${COLORS[p]}"></div>`).join("")}</div>
      <table><thead><tr><th>phase</th><th class="num">share</th><th class="num">median per step</th><th class="num">total</th></tr></thead><tbody>
      ${items.map(([p, v]) => `<tr><td><span class="legend"><span><span class="sw" style="background:${COLORS[p]}"></span>${esc(LABELS[p])}</span></span></td><td class="num">${fmtPct(v.fraction)}</td><td class="num">${esc(phasePerStep(v))}</td><td class="num">${fmtS(v.total_s)}</td></tr>`).join("")}
      </tbody></table>`;
  }

  function renderTimeline(tl) {
    const el = document.getElementById("timeline");
    const recent = tl.slice(-12);
    if (!recent.length) { el.innerHTML = '<div class="empty">No training step yet.</div>'; return; }
    const W = 640, rowH = 18, gap = 5, left = 64, right = 70;
    const max = Math.max(...recent.map((t) => t.step_s)) || 1;
    const H = recent.length * (rowH + gap) + 4;
    let svg = `<svg viewBox="0 0 ${W} ${H}" role="img" aria-label="phases of recent steps">`;
    recent.forEach((t, i) => {
      const y = i * (rowH + gap);
      let x = left;
      svg += `<text x="${left - 8}" y="${y + 13}" text-anchor="end">step ${fmtNum(t.step)}</text>`;
      PHASES.forEach((p) => {
        const w = ((t[p] || 0) / max) * (W - left - right);
        if (w > 0.2) {
          svg += `<rect x="${x.toFixed(2)}" y="${y}" width="${w.toFixed(2)}" height="${rowH}" fill="${COLORS[p]}"><title>${esc(LABELS[p])}: ${esc(fmtS(t[p]))}</title></rect>`;
        }
        x += w;
      });
      svg += `<text x="${x + 6}" y="${y + 13}">${esc(fmtS(t.step_s))}</text>`;
    });
    svg += "</svg>";
    const legend = PHASES.filter((p) => recent.some((t) => t[p] > 0)).map((p) => `<span><span class="sw" style="background:${COLORS[p]}"></span>${esc(LABELS[p])}</span>`).join("");
    el.innerHTML = svg + `<div class="legend">${legend}</div>`;
  }

  const RESOURCE_GROUPS = [
    { key: "cpu", title: "CPU", names: ["job.cpu_percent", "host.cpu_percent"], fmt: (v) => v.toFixed(0) + "%" },
    { key: "mem", title: "Memory", names: ["job.rss_bytes", "host.mem_used_bytes"], fmt: fmtBytes },
    { key: "disk", title: "Disk I/O", names: ["job.read_bytes_per_s", "job.write_bytes_per_s"], fmt: fmtRate },
    { key: "net", title: "Network", names: ["host.net_recv_bytes_per_s", "host.net_sent_bytes_per_s"], fmt: fmtRate },
  ];
  const SERIES_COLORS = ["#3b6fd8", "#e45756", "#54a24b", "#b279a2", "#f58518", "#72b7b2"];

  function renderResources(res) {
    const series = res.series || {};
    const groups = RESOURCE_GROUPS.slice();
    const gpu = Object.keys(series).filter((n) => n.startsWith("gpu."));
    if (gpu.length) {
      groups.push({ key: "gpu-util", title: "GPU utilization", names: gpu.filter((n) => n.endsWith("util_percent") || n.endsWith("utilization")), fmt: (v) => v.toFixed(0) + "%" });
      groups.push({ key: "gpu-mem", title: "GPU memory", names: gpu.filter((n) => n.includes("mem")), fmt: fmtBytes });
    }
    const host = document.getElementById("resources");
    const present = groups.filter((g) => g.names.some((n) => (series[n] || []).length));
    if (!present.length) { host.innerHTML = ""; Object.keys(state.charts).filter((k) => k.startsWith("res-")).forEach(destroyKey); return; }
    present.forEach((g) => {
      let card = document.getElementById("res-" + g.key);
      if (!card) {
        card = document.createElement("div");
        card.className = "card span-6";
        card.id = "res-" + g.key;
        card.innerHTML = `<h2>${esc(g.title)}</h2><div class="chart"></div>`;
        host.appendChild(card);
      }
      const names = g.names.filter((n) => (series[n] || []).length);
      const xs = Array.from(new Set(names.flatMap((n) => series[n].map((p) => p[0])))).sort((a, b) => a - b);
      const data = [xs].concat(names.map((n) => { const m = new Map(series[n]); return xs.map((x) => (m.has(x) ? m.get(x) : null)); }));
      upsert("res-" + g.key, card.querySelector(".chart"), {
        scales: { x: { time: false } },
        series: [{ label: "time", value: (u, v) => v == null ? "–" : fmtS(v) }].concat(names.map((n, i) => ({ label: n, stroke: SERIES_COLORS[i % SERIES_COLORS.length], width: 2, spanGaps: true, value: (u, v) => v == null ? "–" : g.fmt(v) }))),
        axes: [axis((v) => fmtS(v), "time since start"), axis(g.fmt)],
      }, data);
    });
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
      kpis.push(kpi("MFU", c.mfu == null ? "–" : fmtPct(c.mfu)));
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
  function renderExtra(r) {
    const out = [];
    const cc = computeCard(r);
    if (cc) out.push(cc);
    const io = r.io || {};
    if (Object.keys(io).length) {
      const files = (io.files_detail || []).slice(0, 12);
      out.push(`<div class="card span-6 scroll" id="io-card"><h2>I/O</h2>
        <div class="kpis">
          <div class="kpi"><div class="l">read</div><div class="v">${fmtBytes(io.bytes_read)}</div></div>
          <div class="kpi"><div class="l">written</div><div class="v">${fmtBytes(io.bytes_written)}</div></div>
          <div class="kpi"><div class="l">read bandwidth</div><div class="v">${fmtRate(io.bandwidth_read_bytes_per_s)}</div></div>
          <div class="kpi"><div class="l">files</div><div class="v">${fmtNum(io.files)}</div></div>
        </div>
        ${files.length ? `<table><thead><tr><th>file</th><th class="num">read</th><th class="num">reads</th><th class="num">sequential</th><th class="num">read time</th></tr></thead><tbody>
        ${files.map((f) => `<tr><td class="mono">${esc(f.path)}</td><td class="num">${fmtBytes(f.bytes_read)}</td><td class="num">${fmtNum(f.reads)}</td><td class="num">${fmtPct(f.seq_read_fraction)}</td><td class="num">${fmtS(f.read_time_s)}</td></tr>`).join("")}
        </tbody></table>` : ""}</div>`);
    }
    const mem = r.memory || {};
    const cats = mem.categories || {};
    const catItems = Object.entries(cats).filter(([, v]) => typeof v === "number" && v > 0);
    if (catItems.length) {
      const total = catItems.reduce((a, [, v]) => a + v, 0);
      const mc = ["#4c78a8", "#e45756", "#f58518", "#54a24b", "#a5a9b4", "#b279a2"];
      out.push(`<div class="card span-6" id="memory-card"><h2>Memory${mem.device ? " (" + esc(mem.device) + ")" : ""}</h2>
        <div class="kpis"><div class="kpi"><div class="l">peak</div><div class="v">${fmtBytes(mem.peak_bytes)}</div></div></div>
        <div class="phasebar">${catItems.map(([k, v], i) => `<div title="${esc(k)} ${fmtBytes(v)}" style="width:${((v / total) * 100).toFixed(3)}%;background:${mc[i % mc.length]}"></div>`).join("")}</div>
        <table><tbody>${catItems.map(([k, v], i) => `<tr><td><span class="legend"><span><span class="sw" style="background:${mc[i % mc.length]}"></span>${esc(k.replace(/_/g, " "))}</span></span></td><td class="num">${fmtBytes(v)}</td><td class="num">${fmtPct(v / total)}</td></tr>`).join("")}</tbody></table></div>`);
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
        <table><thead><tr>${keys.map((k) => `<th class="num">${esc(k.replace(/_/g, " "))}</th>`).join("")}</tr></thead><tbody>
        ${rows.map((x) => `<tr>${keys.map((k) => `<td class="num">${esc(fmtCell(k, x[k]))}</td>`).join("")}</tr>`).join("")}
        ${rest.length ? `<tr class="more"><td colspan="${keys.length}">… and ${rest.length} more ranks (the slowest are shown; every rank is in the API's report)</td></tr>` : ""}
        </tbody></table></div>`);
    }
    document.getElementById("extra").innerHTML = out.join("");
  }
  function fmtCell(k, v) {
    if (typeof v !== "number") return v == null ? "–" : String(v);
    if (k.endsWith("_s")) return fmtS(v);
    if (k.endsWith("_bytes") || k === "bytes") return fmtBytes(v);
    if (k.endsWith("fraction")) return fmtPct(v);
    return fmtNum(v);
  }

  function renderFindings(fs) {
    const el = document.getElementById("findings");
    if (!fs.length) { el.innerHTML = '<div class="empty">No findings: nothing stands out (yet).</div>'; return; }
    el.innerHTML = fs.map((f) => `<div class="finding ${esc(f.severity)}">
      <span class="badge ${esc(f.severity)}">${esc(f.severity)}</span> <span class="muted mono">${esc(f.id)}</span>
      <div class="t">${esc(f.title)}</div>
      <div class="r">${esc(f.recommendation)}</div>
      <div class="e">evidence: ${esc(Object.entries(f.evidence || {}).filter(([k]) => k !== "stacks").map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join(", "))}${f.estimated_gain ? " · estimated gain up to " + fmtPct(f.estimated_gain) + " of step time" : ""}</div>
      ${Object.entries((f.evidence || {}).stacks || {}).map(([rank, text]) => `<details><summary>Python stacks of rank ${esc(rank)}</summary><pre class="mono">${esc(text)}</pre></details>`).join("")}
    </div>`).join("");
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
    Object.values(state.charts).forEach((c) => { const el = c.root.parentElement; if (el) c.setSize({ width: chartWidth(el), height: 220 }); });
  });
  route();
})();
