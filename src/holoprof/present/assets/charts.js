/* holoprof views: the formatting, findings and charts that the dashboard and the HTML report share.
   Reads window.HOLOPROF_PALETTE (holoprof.present.palette: the data model's phases, colours, labels)
   and draws with uPlot. Renders a holoprof.report/1 document; computes nothing the report does not say. */
(function (root) {
  "use strict";

  const P = root.HOLOPROF_PALETTE;

  // --- formatting ------------------------------------------------------------------------------------
  function esc(v) {
    return String(v == null ? "" : v).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }
  function fmtS(s) {
    if (s == null || isNaN(s)) return "–";
    const a = Math.abs(s);
    if (a === 0) return "0 s";
    if (a < 1e-3) return (s * 1e6).toFixed(a < 1e-5 ? 2 : 0) + " µs";
    if (a < 1) return +(s * 1e3).toFixed(a < 0.01 ? 2 : a < 0.1 ? 1 : 0) + " ms";
    if (a < 120) return +s.toFixed(a < 10 ? 2 : 1) + " s";
    if (a < 7200) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return (s / 3600).toFixed(1) + " h";
  }
  function fmtBytes(b) {
    if (b == null || isNaN(b)) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let i = 0, v = Math.abs(b);
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (b < 0 ? "-" : "") + (i === 0 ? v.toFixed(0) : +v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)) + " " + u[i];
  }
  function fmtRate(b) { return b == null || isNaN(b) ? "–" : fmtBytes(b) + "/s"; }
  function fmtPct(f) { return f == null || isNaN(f) ? "–" : +(f * 100).toFixed(f < 0.1 ? 1 : 0) + "%"; }
  // counts with thousands separators; other numbers to three significant digits
  function fmtNum(n) {
    if (n == null || isNaN(n)) return "–";
    if (Number.isInteger(n)) return Number(n).toLocaleString("en-US");
    const a = Math.abs(n);
    return a >= 1000 ? Math.round(n).toLocaleString("en-US") : String(+n.toPrecision(3));
  }
  // FLOPs (or FLOP/s) with an SI prefix, as holoprof.present.palette.fmt_flops
  function fmtFlops(x, unit) {
    unit = unit || "FLOP";
    if (x == null || isNaN(x)) return "n/a";
    for (const [scale, prefix] of [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "K"]]) {
      if (Math.abs(x) >= scale) return (x / scale).toFixed(1) + " " + prefix + unit;
    }
    return x.toFixed(0) + " " + unit;
  }
  // as holoprof.present.palette.fmt_mfu
  function fmtMfu(f) { return f == null || isNaN(f) ? "–" : (f * 100).toFixed(1) + "%"; }
  const UNIT_FMT = {
    percent: (v) => +v.toFixed(Math.abs(v) < 10 ? 1 : 0) + "%",
    bytes: fmtBytes,
    bytes_per_s: fmtRate,
    watts: (v) => +v.toFixed(0) + " W",
    seconds: fmtS,
    count: fmtNum,
  };
  const unitFmt = (unit) => UNIT_FMT[unit] || fmtNum;

  // --- phases: the report's own list (the data model's, in its order) ------------------------------
  const phaseColor = (p) => (P.phase_colors && P.phase_colors[p]) || P.unknown_phase_color;
  const phaseLabel = (p) => (P.phase_labels && P.phase_labels[p]) || String(p).replace(/_/g, " ");
  function phasesOf(report) {
    const keys = Object.keys((report && report.phases) || {});
    return keys.length ? keys : P.phases.slice();
  }
  function phasesPresent(report) {
    return phasesOf(report).filter((p) => { const v = report.phases[p] || {}; return v.fraction > 0 || v.total_s > 0; });
  }
  // a phase's time per step: its median, or for a phase of a few steps only (eval, checkpoint: median
  // 0) its time per step where it occurs and in how many steps (as the terminal report)
  function phasePerStep(v) {
    const n = v.steps || 0;
    if (!(v.median_s > 0) && v.total_s > 0 && n) return fmtS(v.per_occurrence_s) + " in " + n + (n === 1 ? " step" : " steps");
    return fmtS(v.median_s);
  }
  function phaseBarHtml(report) {
    const items = phasesPresent(report).map((p) => [p, report.phases[p]]);
    if (!items.length) return "";
    return `<div class="phasebar">${items.map(([p, v]) => `<div title="${esc(phaseLabel(p))} ${fmtPct(v.fraction)}" style="width:${(v.fraction * 100).toFixed(3)}%;background:${phaseColor(p)}"></div>`).join("")}</div>
      <table class="phase-table"><thead><tr><th>phase</th><th class="num">share of step time</th><th class="num">median per step</th><th class="num">total</th></tr></thead><tbody>
      ${items.map(([p, v]) => `<tr data-phase="${esc(p)}"><td><span class="sw" style="background:${phaseColor(p)}"></span>${esc(phaseLabel(p))}</td><td class="num">${fmtPct(v.fraction)}</td><td class="num">${esc(phasePerStep(v))}</td><td class="num">${fmtS(v.total_s)}</td></tr>`).join("")}
      </tbody></table>`;
  }

  // --- findings --------------------------------------------------------------------------------------
  const ms = (s) => (1000 * (s || 0)).toFixed(1) + " ms";
  // as holoprof.analyze.findings.gain_label
  function gainLabel(f) {
    const gain = Number(f.estimated_gain || 0), basis = f.gain_basis || {};
    if (f.gain_kind === "measured") {
      const iv = basis.best_interval_s || [0, 0];
      const where = `${basis.best}: step ${ms(basis.best_step_s)} (95% CI ${ms(iv[0])}–${ms(iv[1])}) against ${ms(basis.this_step_s)} with ${basis.this}`;
      if (basis.best === basis.this) return `measured: this run is the sweep's best configuration, step ${ms(basis.best_step_s)}`;
      return gain ? `measured: ${(100 * gain).toFixed(0)}% of step time, ${where}` : `measured: no significant gain, ${where}`;
    }
    if (!gain) return basis.model === "input_pipeline" ? "predicted: no gain on this machine" : "";
    if (basis.model === "input_pipeline") return `predicted by the input-pipeline model: ${(100 * gain).toFixed(0)}% of step time`;
    const upper = basis.gain_upper_bound;
    if (typeof upper === "number" && upper > gain) return `predicted: ${(100 * gain).toFixed(0)}% of step time (at most ${(100 * upper).toFixed(0)}%)`;
    return `predicted: up to ${(100 * gain).toFixed(0)}% of step time`;
  }
  // as holoprof.present.palette.evidence_label / evidence_value
  function evidenceLabel(k) {
    if (k === "per_s") return "per second";
    return String(k).replace(/_bytes_per_s$/, "").replace(/_per_s$/, " per second").replace(/_s_per_step$/, " per step").replace(/_(s|bytes|percent)$/, "")
      .replace(/_fraction(_of_[a-z]+)?$/, " share$1").replace(/_/g, " ");
  }
  function evidenceValue(k, v) {
    if (v == null) return "–";
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (typeof v !== "number") return String(v);
    if (/(^|_)flops_per_s$/.test(k)) return fmtFlops(v, "FLOP/s");
    if (/(^|_)flops(_per_step)?$/.test(k)) return fmtFlops(v);
    if (/(^|_)mfu$/.test(k)) return fmtMfu(v);
    if (/_bytes_per_s$/.test(k)) return fmtRate(v);
    if (/(^|_)per_s$/.test(k)) return fmtNum(v) + "/s";
    if (/_s(_per_step)?$/.test(k)) return fmtS(v);
    if (/(^|_)bytes(_per_(step|save|sample))?$/.test(k)) return fmtBytes(v);
    if (/(fraction|share|ratio)(_of_[a-z]+)?$/.test(k)) return fmtPct(v);
    if (/_percent$/.test(k)) return UNIT_FMT.percent(v);
    if (/(^|_)(pid|rank|step)$/.test(k)) return String(v);
    return fmtNum(v);
  }
  const NESTED_ROWS = 8;
  function nestedHtml(k, v) {
    let body;
    if (Array.isArray(v) && v.length && v.every((x) => x && typeof x === "object" && !Array.isArray(x))) {
      const cols = Array.from(new Set(v.flatMap((x) => Object.keys(x))));
      const rows = v.slice(0, NESTED_ROWS);
      body = `<table class="ev-nested"><thead><tr>${cols.map((c) => `<th>${esc(evidenceLabel(c))}</th>`).join("")}</tr></thead><tbody>
        ${rows.map((x) => `<tr>${cols.map((c) => `<td>${esc(typeof x[c] === "object" && x[c] != null ? JSON.stringify(x[c]) : evidenceValue(c, x[c]))}</td>`).join("")}</tr>`).join("")}
        ${v.length > rows.length ? `<tr class="more"><td colspan="${cols.length}">… and ${v.length - rows.length} more</td></tr>` : ""}</tbody></table>`;
    } else if (Array.isArray(v)) {
      body = `<div class="ev-list">${esc(v.map((x) => typeof x === "object" ? JSON.stringify(x) : evidenceValue(k, x)).join(", "))}</div>`;
    } else {
      body = `<table class="ev-nested"><tbody>${Object.entries(v).map(([kk, vv]) => `<tr><th>${esc(evidenceLabel(kk))}</th><td>${esc(typeof vv === "object" && vv != null ? JSON.stringify(vv) : evidenceValue(kk, vv))}</td></tr>`).join("")}</tbody></table>`;
    }
    const n = Array.isArray(v) ? v.length : Object.keys(v).length;
    return `<details class="ev-details"><summary>${esc(evidenceLabel(k))} (${n})</summary>${body}</details>`;
  }
  function evidenceHtml(ev) {
    const entries = Object.entries(ev || {});
    const scalars = entries.filter(([, v]) => v == null || typeof v !== "object");
    const nested = entries.filter(([, v]) => v != null && typeof v === "object" && (Array.isArray(v) ? v.length : Object.keys(v).length));
    return (scalars.length ? `<table class="ev"><tbody>${scalars.map(([k, v]) => `<tr><th>${esc(evidenceLabel(k))}</th><td>${esc(evidenceValue(k, v))}</td></tr>`).join("")}</tbody></table>` : "")
      + nested.map(([k, v]) => nestedHtml(k, v)).join("");
  }
  function findingsHtml(fs) {
    if (!fs || !fs.length) return '<div class="empty" id="no-findings">No findings: nothing crossed a threshold.</div>';
    return fs.map((f) => {
      const gain = gainLabel(f);
      return `<div class="finding ${esc(f.severity)}" data-finding="${esc(f.id)}">
        <div class="fh"><span class="badge ${esc(f.severity)}">${esc(f.severity)}</span> <span class="t">${esc(f.title)}</span></div>
        ${gain ? `<div class="gain">${esc(gain)}</div>` : ""}
        ${evidenceHtml(Object.fromEntries(Object.entries(f.evidence || {}).filter(([k]) => k !== "stacks")))}
        ${Object.entries((f.evidence || {}).stacks || {}).map(([rank, text]) => `<details><summary>Python stacks of rank ${esc(rank)}</summary><pre class="mono">${esc(text)}</pre></details>`).join("")}
        <div class="fix"><strong>Fix:</strong> ${esc(f.recommendation)}</div>
        <div class="fid mono">${esc(f.id)}</div>
      </div>`;
    }).join("");
  }

  // --- chart specs: {opts, data} for uPlot ---------------------------------------------------------
  const BYTE_INCRS = [];
  for (let e = 0; e <= 5; e++) [1, 2, 5, 10, 20, 50, 100, 200, 500].forEach((m) => BYTE_INCRS.push(m * Math.pow(1024, e)));
  const COUNT_INCRS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6];
  // an axis with ticks at round values of its unit (bytes: 1, 2, 5 × powers of 1024); ``x``: the
  // horizontal one (a short band), else the vertical one (room for "143.1 MiB/s")
  function axis(unit, label, x) {
    const a = { stroke: "#6b7385", grid: { stroke: "#eef1f5" }, ticks: { stroke: "#e3e7ee" }, size: x ? 34 : 84, values: (u, ticks) => ticks.map(unitFmt(unit)) };
    if (label) { a.label = label; a.labelSize = 18; }
    if (x && unit === "seconds") a.space = 80; // "1 min 40 s" needs room
    if (unit === "bytes" || unit === "bytes_per_s") a.incrs = BYTE_INCRS;
    if (unit === "count") a.incrs = COUNT_INCRS;
    return a;
  }
  const fromZero = (u, mn, mx) => [0, mx > 0 ? mx * 1.04 : 1];
  const xSeries = (label, fmt) => ({ label, value: (u, v) => (v == null ? "" : fmt(v)) });

  function stepSpec(tl) {
    return {
      opts: {
        scales: { x: { time: false }, y: { range: fromZero } },
        series: [xSeries("step", String), { label: "step time", stroke: "#3b6fd8", width: 2, fill: "rgba(59,111,216,.08)", value: (u, v) => (v == null ? "" : fmtS(v)), points: { show: tl.length < 40 } }],
        axes: [axis("count", "step", true), axis("seconds")],
      },
      data: [tl.map((p) => p.step), tl.map((p) => p.step_s)],
    };
  }
  // the phases of each step, stacked (the top of the stack first: each lower area paints over it)
  function phaseSpec(tl, phases) {
    const shown = phases.filter((p) => tl.some((t) => t[p] > 0));
    const acc = tl.map(() => 0);
    const cum = shown.map((p) => tl.map((t, i) => (acc[i] += t[p] || 0)));
    const order = shown.map((p, i) => i).reverse();
    return {
      shown,
      opts: {
        scales: { x: { time: false }, y: { range: fromZero } },
        series: [xSeries("step", String)].concat(order.map((i) => ({
          label: phaseLabel(shown[i]), stroke: phaseColor(shown[i]), fill: phaseColor(shown[i]), width: 1, points: { show: false },
          value: (u, v, si, idx) => (idx == null ? "" : fmtS(tl[idx][shown[i]])),
        }))),
        axes: [axis("count", "step", true), axis("seconds")],
      },
      data: [tl.map((t) => t.step)].concat(order.map((i) => cum[i])),
    };
  }
  // each rank's median step, split into its phases (stacked bars, ranks in numeric order)
  function rankSpec(perRank, phases) {
    const rows = perRank.slice().sort((a, b) => a.rank - b.rank);
    const part = (r, p) => ((r.phases || {})[p] || 0) * (r.median_s || 0);
    const shown = phases.filter((p) => rows.some((r) => part(r, p) > 0));
    const acc = rows.map(() => 0);
    const cum = shown.map((p) => rows.map((r, i) => (acc[i] += part(r, p))));
    const order = shown.map((p, i) => i).reverse();
    const bars = root.uPlot && root.uPlot.paths && root.uPlot.paths.bars ? root.uPlot.paths.bars({ size: [0.7, 48] }) : undefined;
    return {
      shown,
      opts: {
        scales: { x: { time: false, range: (u, mn, mx) => [mn - 0.6, mx + 0.6] }, y: { range: fromZero } },
        series: [xSeries("rank", String)].concat(order.map((i) => ({
          label: phaseLabel(shown[i]), stroke: phaseColor(shown[i]), fill: phaseColor(shown[i]), width: 0, paths: bars, points: { show: false },
          value: (u, v, si, idx) => (idx == null ? "" : fmtS(part(rows[idx], shown[i]))),
        }))).concat([{ label: "median step", stroke: "#1d2433", paths: () => null, points: { show: false }, value: (u, v) => (v == null ? "" : fmtS(v)) }]),
        axes: [axis("count", "rank", true), axis("seconds")],
      },
      data: [rows.map((r) => r.rank)].concat(order.map((i) => cum[i])).concat([rows.map((r) => r.median_s)]),
    };
  }
  // resource charts: [{key, title, unit, spec}] for the series the run has; host lines start hidden
  // when the job's own are in the same chart (a click on the legend shows them)
  function resourceSpecs(series) {
    series = series || {};
    const groups = (P.resource_groups || []).map((g) => Object.assign({}, g));
    const gpu = {};
    Object.keys(series).forEach((n) => {
      const m = n.match(/^gpu\.([^.]+)\.(.+)$/);
      const what = m && P.gpu_series[m[2]];
      if (!what) return;
      (gpu[what.key] = gpu[what.key] || { key: what.key, title: what.title, unit: what.unit, names: [] }).names.push(n);
    });
    Object.values(gpu).forEach((g) => groups.push(g));
    return groups.map((g) => {
      const names = g.names.filter((n) => (series[n] || []).length);
      if (!names.length) return null;
      const hasJob = names.some((n) => !n.startsWith("host."));
      const xs = Array.from(new Set(names.flatMap((n) => series[n].map((p) => p[0])))).sort((a, b) => a - b);
      const data = [xs].concat(names.map((n) => { const m = new Map(series[n]); return xs.map((x) => (m.has(x) ? m.get(x) : null)); }));
      const fmt = unitFmt(g.unit);
      return {
        key: g.key, title: g.title, unit: g.unit,
        spec: {
          opts: {
            scales: { x: { time: false }, y: { range: fromZero } },
            series: [xSeries("time", fmtS)].concat(names.map((n, i) => ({
              label: seriesLabel(n), stroke: P.series_colors[i % P.series_colors.length], width: n.startsWith("host.") ? 1.5 : 2,
              dash: n.startsWith("host.") && hasJob ? [6, 4] : undefined, show: !(hasJob && n.startsWith("host.")),
              spanGaps: true, value: (u, v) => (v == null ? "" : fmt(v)),
            }))),
            axes: [axis("seconds", "time since start", true), axis(g.unit)],
          },
          data,
        },
      };
    }).filter(Boolean);
  }
  function seriesLabel(n) {
    if (P.series[n]) return P.series[n].label;
    const m = n.match(/^gpu\.([^.]+)\.(.+)$/);
    if (m && P.gpu_series[m[2]]) return "GPU " + m[1] + " " + P.gpu_series[m[2]].label;
    return n.replace(/[._]/g, " ");
  }
  // a uPlot chart of spec in el, as wide as el
  function draw(el, spec, height) {
    el.innerHTML = "";
    return new root.uPlot(Object.assign({ width: Math.max(280, el.clientWidth || 500), height: height || spec.height || 220 }, spec.opts), spec.data, el);
  }

  // --- bars and timelines with a category axis (the HTML report's, the sweep's) ----------------------
  const FONT = '12px system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans", sans-serif';
  let measurer = null;
  // the width in CSS pixels of text in the axes' font
  function textWidth(s) {
    measurer = measurer || root.document.createElement("canvas").getContext("2d");
    measurer.font = FONT;
    return Math.ceil(measurer.measureText(String(s)).width);
  }
  // text cut with "…" to at most px pixels
  function fitText(s, px) {
    s = String(s);
    if (textWidth(s) <= px) return s;
    while (s.length > 1 && textWidth(s + "…") > px) s = s.slice(0, -1);
    return s + "…";
  }
  const pxr = () => root.uPlot.pxRatio || root.devicePixelRatio || 1;
  // an axis of categories (labels[i] at i): on the left (horizontal bars, rows) as wide as the longest
  // label (at most maxPx), or at the bottom (turned when the labels would overlap)
  function catAxis(labels, side, maxPx, slotPx) {
    const a = { stroke: "#6b7385", side, grid: { show: false }, ticks: { show: false }, gap: 6,
      splits: () => labels.map((l, i) => i), values: (u, splits) => splits.map((i) => (labels[i] == null ? "" : labels[i])) };
    const widest = Math.max(0, ...labels.map(textWidth));
    if (side === 3) {
      a.size = Math.min(maxPx || 260, widest) + 14;
      a.values = (u, splits) => splits.map((i) => (labels[i] == null ? "" : fitText(labels[i], a.size - 14)));
    }
    else if (slotPx && widest > slotPx - 6) { a.rotate = -35; a.size = Math.min(120, Math.ceil(widest * 0.6) + 24); } else a.size = 30;
    return a;
  }
  // text beside each bar (its value) or over it: st.texts[i] as {text, color} at value st.tops[i] of
  // category i (st: the numbers of a bar chart, see barState)
  function barTexts(st) {
    return (u) => {
      const g = u.ctx, r = pxr();
      g.save();
      g.font = Math.round(11 * r) + "px system-ui, sans-serif";
      st.texts.forEach((t, i) => {
        if (!t || !t.text) return;
        const c = u.valToPos(i, "x", true), v = u.valToPos(st.tops[i] || 0, "y", true);
        g.fillStyle = t.color || "#3b4456";
        if (st.horizontal) { g.textAlign = "left"; g.textBaseline = "middle"; g.fillText(t.text, v + 5 * r, c); }
        else {
          g.textAlign = "center"; g.textBaseline = "bottom";
          String(t.text).split("\n").reverse().forEach((line, k) => g.fillText(line, c, v - (4 + 13 * k) * r));
        }
      });
      g.restore();
    };
  }
  // the numbers of a bar chart of options o (see barSpec): one object that the chart's scales, axes,
  // legend and hooks read, so that new numbers can be drawn by the same uPlot (barSpec's update)
  function barState(o) {
    const labels = o.labels, n = labels.length, fmt = unitFmt(o.unit), horizontal = !!o.horizontal, width = o.width || 500;
    const acc = labels.map(() => 0);
    const data = o.series.map((s) => labels.map((l, i) => {
      const v = s.values[i];
      if (v == null) return null;
      return o.stacked ? (acc[i] += v) : v;
    }));
    const tops = labels.map((l, i) => Math.max(0, ...data.map((d) => d[i] || 0)));
    const texts = o.texts || tops.map((t, i) => (data.some((d) => d[i] != null) ? { text: fmt(t) } : null));
    const lines = Math.max(1, ...texts.map((t) => (t && t.text ? String(t.text).split("\n").length : 0)));
    const head = horizontal ? 1.04 + Math.min(0.6, (Math.max(0, ...texts.map((t) => (t ? textWidth(t.text) : 0))) + 10) / Math.max(120, width - 200)) : 1 + 0.09 * lines + 0.04;
    const order = o.series.map((s, i) => i);
    if (o.stacked) order.reverse();
    const cat = horizontal ? catAxis(labels, 3, Math.round(width * 0.4)) : catAxis(labels, 2, 0, (width - 100) / Math.max(1, n));
    return { o, labels, n, fmt, horizontal, data, tops, texts, head, order, cat, height: horizontal ? Math.max(90, 24 * n + 70) : o.height };
  }
  const barData = (st) => [st.labels.map((l, i) => i)].concat(st.order.map((k) => st.data[k]));
  const barKind = (o) => JSON.stringify([!!o.horizontal, !!o.stacked, o.unit, o.series.map((s) => [s.label, s.color])]);
  // the bar (stacked: the part of the bar) under the cursor, as its category and series, or null
  function barAt(u, st) {
    const i = u.cursor.idx;
    if (i == null || u.cursor.left < 0 || st.data.every((d) => d[i] == null)) return null;
    const c = u.posToVal(st.horizontal ? u.cursor.top : u.cursor.left, "x"), v = u.posToVal(st.horizontal ? u.cursor.left : u.cursor.top, "y");
    if (Math.abs(c - i) > 0.4 || v < 0) return null;
    let below = 0;
    for (let k = 0; k < st.data.length; k++) {
      const top = st.data[k][i];
      if (top == null) continue;
      if (v >= (st.o.stacked ? below : 0) && v <= top) return { i, k };
      if (st.o.stacked) below = top;
    }
    return null;
  }
  // bars of categories: {labels, series: [{label, color, values}], unit, stacked, horizontal, texts,
  // xLabel, yLabel, width, tip}; a value missing (null) draws no bar. Stacked: each series on the ones
  // before it (the top of the stack drawn first: each lower bar paints over it). texts: what to write
  // at the end of each bar (default: its value, or the stack's total). tip: hovering a bar writes its
  // category, series and value in a line under the chart. The spec's update(u, o) draws the numbers of
  // o in the chart u made of it and answers true, or answers false when o's series are not the same
  // (then make a new chart).
  function barSpec(o) {
    const st = barState(o);
    const bars = root.uPlot.paths.bars({ size: [st.horizontal ? 0.72 : 0.6, st.horizontal ? 22 : 64] });
    const cat = { stroke: "#6b7385", side: st.horizontal ? 3 : 2, grid: { show: false }, ticks: { show: false }, gap: 6,
      splits: (u) => st.cat.splits(u), values: (u, splits) => st.cat.values(u, splits), size: () => st.cat.size, rotate: () => st.cat.rotate || 0 };
    let tip = null;
    const showTip = (u) => {
      const at = tip && barAt(u, st);
      if (tip) tip.textContent = at ? st.labels[at.i] + " · " + st.o.series[at.k].label + ": " + st.fmt(st.o.series[at.k].values[at.i]) : "";
    };
    const hooks = { draw: [barTexts(st)] };
    if (o.tip) {
      hooks.ready = [(u) => { tip = root.document.createElement("div"); tip.className = "chart-tip muted"; u.root.after(tip); }];
      hooks.setCursor = [showTip];
      hooks.destroy = [() => { if (tip) tip.remove(); tip = null; }];
    }
    return {
      height: st.height,
      opts: {
        scales: {
          x: { time: false, ori: st.horizontal ? 1 : 0, dir: st.horizontal ? -1 : 1, range: () => [-0.5, st.n - 0.5] },
          y: { ori: st.horizontal ? 0 : 1, range: (u, mn, mx) => [0, (mx > 0 ? mx : 1) * st.head] },
        },
        series: [xSeries(o.xLabel || "", (i) => st.labels[i])].concat(st.order.map((k) => {
          const s = o.series[k];
          return { label: s.label, stroke: s.color, fill: s.color, width: 0, paths: bars, points: { show: false },
            value: (u, v, si, idx) => { const w = idx == null ? null : st.o.series[k].values[idx]; return w == null ? "" : st.fmt(w); } };
        })),
        axes: st.horizontal ? [cat, Object.assign(axis(o.unit, o.yLabel, true), { side: 2, space: 80 })] : [cat, axis(o.unit, o.yLabel)],
        legend: { show: o.legend != null ? o.legend : !!o.stacked },
        cursor: { points: { show: false }, drag: { x: false, y: false } },
        hooks,
      },
      data: barData(st),
      update(u, o2) {
        if (barKind(o2) !== barKind(st.o)) return false;
        Object.assign(st, barState(o2));
        if (st.height && st.height !== u.height) u.setSize({ width: u.width, height: st.height });
        u.setData(barData(st));
        showTip(u);
        return true;
      },
    };
  }
  // a timeline of rows (a Gantt chart): rows [{label, start, end, color, tip, strong}] in seconds
  // since the start, each a bar on its own line (strong: outlined, its label marked ◆); hovering a
  // bar writes its tip under the chart. The element's data-rows and data-labels say what was drawn.
  function ganttSpec(rows, tEnd, width) {
    const n = rows.length, end = Math.max(tEnd || 0, ...rows.map((r) => r.end || 0), 1e-9);
    const labels = rows.map((r) => (r.strong ? String(r.label).replace(/^(\s*)/, "$1◆ ") : r.label));
    const left = catAxis(labels, 3, Math.round((width || 600) * 0.35));
    left.values = (u, splits) => {
      const out = splits.map((i) => (labels[i] == null ? "" : fitText(labels[i], left.size - 14)));
      u.root.parentNode.dataset.labels = JSON.stringify(out);
      return out;
    };
    let tip = null;
    const rowAt = (u) => {
      const i = Math.round(u.posToVal(u.cursor.top, "y")), t = u.posToVal(u.cursor.left, "x"), r = rows[i];
      return u.cursor.left >= 0 && r && t >= r.start - end * 0.005 && t <= r.end + end * 0.005 ? r : null;
    };
    return {
      height: 22 * n + 60,
      opts: {
        scales: { x: { time: false, range: () => [0, end] }, y: { dir: -1, range: () => [-0.5, n - 0.5] } },
        series: [xSeries("time", fmtS), { label: "rows", paths: () => null, points: { show: false } }],
        axes: [axis("seconds", "time since start", true), left],
        legend: { show: false },
        cursor: { y: false, points: { show: false }, drag: { x: false, y: false } },
        hooks: {
          ready: [(u) => {
            tip = root.document.createElement("div");
            tip.className = "chart-tip muted";
            u.root.after(tip);
            u.root.parentNode.dataset.rows = String(n);
          }],
          draw: [(u) => {
            const g = u.ctx, r = pxr(), h = (u.bbox.height / n) * 0.72;
            g.save();
            rows.forEach((row, i) => {
              const x0 = u.valToPos(Math.max(0, row.start), "x", true), x1 = u.valToPos(Math.max(row.start, row.end), "x", true);
              const y = u.valToPos(i, "y", true) - h / 2, w = Math.max(r, x1 - x0);
              g.fillStyle = row.color || P.unknown_phase_color;
              g.fillRect(x0, y, w, h);
              if (row.strong) { g.strokeStyle = "#c62828"; g.lineWidth = 2 * r; g.strokeRect(x0, y, w, h); }
            });
            g.restore();
          }],
          setCursor: [(u) => { const row = tip && rowAt(u); if (tip) tip.textContent = row ? row.tip : ""; }],
          destroy: [() => { if (tip) tip.remove(); tip = null; }],
        },
      },
      data: [[0, end], [null, null]],
    };
  }
  // lines over x values of their own (a sweep of settings): {x, xLabel, xUnit, xTicks (labels of the x
  // values, when given, the ticks), log, series: [{label, color, values, dash}], unit, yLabel}
  function lineSpec(o) {
    const ticks = o.xTicks, xa = axis(ticks ? "" : o.xUnit || "count", o.xLabel, true);
    const at = (v) => { const k = o.x.findIndex((x) => Math.abs(x - v) <= Math.abs(v) * 1e-9); return k < 0 ? "" : ticks[k]; };
    if (ticks) { xa.space = 10; xa.splits = () => o.x.slice(); xa.filter = (u, splits) => splits; xa.values = (u, splits) => splits.map(at); }
    // a little room beside the first and the last value (a factor on a log scale)
    const pad = (u, mn, mx) => (o.log ? [mn / 1.6, mx * 1.6] : mx > mn ? [mn - (mx - mn) * 0.05, mx + (mx - mn) * 0.05] : [mn - 1, mx + 1]);
    const fmt = unitFmt(o.unit);
    return {
      opts: {
        scales: { x: { time: false, distr: o.log ? 3 : 1, range: pad }, y: { range: fromZero } },
        series: [xSeries(o.xLabel || "", (v) => (ticks ? at(v) : unitFmt(o.xUnit)(v)))].concat(o.series.map((s) => ({
          label: s.label, stroke: s.color, width: 2, dash: s.dash, spanGaps: true, points: { show: true, size: 6, fill: s.color },
          value: (u, v) => (v == null ? "" : fmt(v)),
        }))),
        axes: [xa, axis(o.unit, o.yLabel)],
      },
      data: [o.x].concat(o.series.map((s) => s.values)),
    };
  }

  // --- the rank × step heatmap (report.stragglers.heatmap): one row per rank, one column per step (or
  // bin of consecutive steps), the colour the value of the chosen map, from a pale tint to its colour
  function hexRgb(c) { const n = parseInt(String(c).slice(1), 16); return [(n >> 16) & 255, (n >> 8) & 255, n & 255]; }
  function heatColor(rgb, f) {
    const lo = [244, 246, 250], t = Math.max(0, Math.min(1, f));
    return "rgb(" + lo.map((l, i) => Math.round(l + (rgb[i] - l) * t)).join(",") + ")";
  }
  function heatmapMaps(heat) { return (P.heatmap_maps || []).filter((m) => Array.isArray(heat[m.key])); }
  function heatmapMax(rows) {
    let mx = 0;
    rows.forEach((r) => r.forEach((v) => { if (v != null && v > mx) mx = v; }));
    return mx;
  }
  function heatmapCell(heat, i, j) {
    const a = heat.steps[j], b = j + 1 < heat.steps.length ? heat.steps[j + 1] - 1 : heat.last_step;
    return "rank " + heat.ranks[i] + (heat.hosts ? " (" + heat.hosts[i] + ")" : "") + ", " + (b > a ? "steps " + a + "–" + b : "step " + a);
  }
  // draws into el: a choice of map, the canvas and a scale; el.dataset says what is drawn
  function heatmap(el, heat, key) {
    const maps = heatmapMaps(heat || {});
    if (!maps.length || !heat.ranks.length) { el.innerHTML = '<div class="empty">No steps per rank.</div>'; return; }
    const map = maps.find((m) => m.key === key) || maps[0];
    const rows = heat[map.key], nr = rows.length, nc = heat.steps.length;
    const mx = heatmapMax(rows) || 1, rgb = hexRgb(map.color);
    el.innerHTML = `<div class="hm-bar"><label>colour: <select class="hm-map">${maps.map((m) => `<option value="${esc(m.key)}"${m.key === map.key ? " selected" : ""}>${esc(m.label)}</option>`).join("")}</select></label>
      <span class="hm-scale"><span>0</span><span class="hm-grad" style="background:linear-gradient(90deg,${heatColor(rgb, 0)},${heatColor(rgb, 1)})"></span><span>${esc(fmtS(mx))}</span></span>
      <span class="hm-tip muted"></span></div><canvas class="hm-canvas"></canvas>`;
    const left = 64, top = 4, bottom = 22;
    const width = Math.max(280, el.clientWidth || 600), rowH = Math.max(3, Math.min(28, Math.floor(420 / nr)));
    const cellW = (width - left - 8) / nc, height = top + nr * rowH + bottom;
    const cv = el.querySelector("canvas"), dpr = root.devicePixelRatio || 1;
    cv.width = Math.round(width * dpr); cv.height = Math.round(height * dpr);
    cv.style.width = width + "px"; cv.style.height = height + "px";
    const g = cv.getContext("2d");
    g.scale(dpr, dpr);
    g.font = "11px system-ui, sans-serif"; g.textBaseline = "middle";
    const every = Math.max(1, Math.ceil(12 / rowH));
    for (let i = 0; i < nr; i++) {
      g.fillStyle = "#6b7385";
      if (i % every === 0) g.fillText("rank " + heat.ranks[i], 4, top + (i + 0.5) * rowH);
      for (let j = 0; j < nc; j++) {
        const v = rows[i][j];
        g.fillStyle = v == null ? "#ffffff" : heatColor(rgb, v / mx);
        g.fillRect(left + j * cellW, top + i * rowH, Math.ceil(cellW), rowH - (rowH > 6 ? 1 : 0));
      }
    }
    g.fillStyle = "#6b7385"; g.textBaseline = "top";
    const tickEvery = Math.max(1, Math.ceil(60 / cellW));
    for (let j = 0; j < nc; j += tickEvery) g.fillText(String(heat.steps[j]), left + j * cellW, top + nr * rowH + 5);
    const tip = el.querySelector(".hm-tip");
    cv.addEventListener("mousemove", (ev) => {
      const r = cv.getBoundingClientRect(), j = Math.floor((ev.clientX - r.left - left) / cellW), i = Math.floor((ev.clientY - r.top - top) / rowH);
      tip.textContent = i >= 0 && i < nr && j >= 0 && j < nc ? heatmapCell(heat, i, j) + ": " + map.label + " " + fmtS(rows[i][j]) : "";
    });
    el.querySelector("select").addEventListener("change", (ev) => heatmap(el, heat, ev.target.value));
    el.dataset.ranks = String(nr);
    el.dataset.columns = String(nc);
    el.dataset.map = map.key;
  }

  root.HoloViews = {
    P, esc, fmtS, fmtBytes, fmtRate, fmtPct, fmtNum, fmtMfu, unitFmt, phaseColor, phaseLabel, phasesOf, phasesPresent,
    phasePerStep, phaseBarHtml, gainLabel, evidenceLabel, evidenceValue, evidenceHtml, findingsHtml,
    axis, stepSpec, phaseSpec, rankSpec, resourceSpecs, seriesLabel, draw, heatmap, barSpec, ganttSpec, lineSpec, textWidth,
  };
})(window);
