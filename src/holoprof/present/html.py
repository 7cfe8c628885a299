"""The HTML report: one self-contained file (inline CSS and script, nothing from the network) that
renders a ``holoprof.report/1`` document; computes nothing.

It speaks the dashboard's visual language: the same palette and phase list
(:mod:`holoprof.present.palette`), the same shared view code (``assets/charts.js``) and chart library
(uPlot, inlined), the same first screen: the headline numbers, then where a step goes (or, for a run
without steps, its reads and writes) beside the findings. Every chart is drawn with uPlot by the
shared code: step time over steps, the phases over steps (stacked), each rank's step and its phases,
resources over time, the Gantt chart of stages and processes, the read-size histogram and the memory
categories. Tables, findings and notes are HTML, readable without script (the charts without script
have their numbers in tables). Every string from the run (paths, commands, names,
evidence) is escaped. The document is already downsampled (the step timeline holds at most ~120
points, resource series ~60), so the file stays small for long runs; charts say so when they show
downsampled data.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from holoprof import model
from holoprof.analyze.findings import gain_label
from holoprof.errors import HoloprofError
from holoprof.present import charts, palette
from holoprof.present.hosts import hosts_html
from holoprof.present.palette import (
    KIND_COLORS,
    MEMORY_COLORS,
    evidence_label,
    evidence_value,
    fmt_flops,
    fmt_mfu,
)
from holoprof.present.stragglers import stragglers_html
from holoprof.present.summary import (
    at_most,
    collapse_ranks,
    more_files,
    more_label,
    top_rows,
    total,
    tree_parent,
)
from holoprof.present.terminal import fmt_phase_per_step, host_clock_lines
from holoprof.present.text import printable

CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;
background:#f4f6f9;color:#1d2433;font-size:14px;line-height:1.45}
main{max-width:1280px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:0 0 10px}h3{font-size:14px;margin:14px 0 6px}
section,.card{background:#fff;border-radius:10px;box-shadow:0 1px 2px rgba(20,30,60,.06),0 0 0 1px #e3e7ee;
padding:16px 20px;margin:0 0 16px;min-width:0}
.first{display:grid;grid-template-columns:1fr 1fr;gap:16px;align-items:start}.first>.card{margin:0 0 16px}
@media (max-width:900px){.first{grid-template-columns:1fr}}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f3;
vertical-align:top}th{font-weight:600;color:#56607a;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin-bottom:12px}
.kv div:nth-child(odd){color:#56607a}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px;word-break:break-all}
.muted{color:#6b7489;font-size:12px}
.note{color:#8a5a00;background:#fff8e6;border:1px solid #f1dca8;border-radius:6px;padding:6px 10px;margin:6px 0}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:16px}
.charts>div{min-width:0}
.crit{color:#c62828;font-weight:700}
.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:middle}
.io-files td.mono{overflow-wrap:anywhere}
"""


# --- formatting --------------------------------------------------------------------------------------
def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


#: Numbers as the dashboard writes them (one set of formatters for both views).
fmt_s = palette.fmt_seconds
fmt_bytes = palette.fmt_bytes
fmt_pct = palette.fmt_pct
fmt_num = palette.fmt_number


def fmt_rate(b: float) -> str:
    return fmt_bytes(b) + "/s"


# --- chart helpers ---------------------------------------------------------------------------------
def legend(items: Sequence[tuple[str, str]]) -> str:
    return (
        '<div class="legend">'
        + "".join(f'<span><i style="background:{c}"></i>{esc(k)}</span>' for k, c in items)
        + "</div>"
    )


# --- sections ----------------------------------------------------------------------------------------
def _header(doc: dict[str, Any]) -> str:
    """The run's name, status and command, and its headline numbers (the dashboard's)."""
    run = doc.get("run", {})
    cmd = " ".join(str(c) for c in (run.get("command") or []))
    status = str(run.get("status", "?"))
    code = run.get("exit_code")
    status_txt = status + (f" (exit {code})" if code not in (None, 0) else "")
    kv = [
        ("run", f'<span class="mono">{esc(run.get("dir", ""))}</span>'),
        ("command", f"<code>{esc(cmd)}</code>"),
        ("hosts", esc(", ".join(str(h) for h in run.get("hosts", [])))),
    ]
    clocks = run.get("host_clocks") or []
    if len(clocks) > 1:  # each host's clock alignment, under the hosts
        kv[-1] = ("hosts", "<br>".join(esc(line) for line in host_clock_lines(clocks)))
    kpis = _io_kpis(doc) if _io_first(doc) else _step_kpis(doc)
    return (
        f"<h1>{esc(run.get('name') or 'holoprof report')} <span class='badge {esc(status)}'>"
        f"{esc(status_txt)}</span></h1>"
        '<div class="kv">'
        + "".join(f"<div>{k}</div><div>{v}</div>" for k, v in kv)
        + "</div>"
        + _kpi_tiles(kpis, "kpis")
    )


def _kpi_tiles(kpis: list[tuple[str, str, str]], element_id: str = "") -> str:
    """Headline numbers as tiles: (label, value, hint)."""
    ident = f' id="{element_id}"' if element_id else ""
    return (
        f'<div class="kpis"{ident}>'
        + "".join(
            f"<div class='kpi'><div class='l'>{esc(label)}</div><div class='v'>{esc(v)}</div>"
            + (f"<div class='h'>{esc(hint)}</div>" if hint else "")
            + "</div>"
            for label, v, hint in kpis
        )
        + "</div>"
    )


def _io_first(doc: dict[str, Any]) -> bool:
    """A run without training steps whose I/O was recorded (an imported Darshan log, a data
    preparation job): its first screen is its I/O."""
    return not (doc.get("steps") or {}).get("count") and bool(doc.get("io"))


def _processes_kpi(run: dict[str, Any]) -> tuple[str, str, str]:
    ranks, procs = int(run.get("ranks") or 0), int(run.get("processes") or 0)
    if ranks and ranks == procs:
        return ("ranks", fmt_num(ranks), "")
    return ("processes", fmt_num(procs), f"{fmt_num(ranks)} ranks" if ranks else "")


def _step_kpis(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    run, st = doc.get("run", {}), doc.get("steps", {})
    per_s = float(st.get("per_s", 0) or 0)
    out = [
        ("steps", fmt_num(int(st.get("count", 0) or 0)), ""),
        ("median step", fmt_s(st.get("median_s", 0) or 0), ""),
        ("p90 step", fmt_s(st.get("p90_s", 0) or 0), ""),
        ("throughput", f"{per_s:.{2 if per_s < 10 else 1}f} steps/s" if per_s else "–", ""),
        ("epochs", "unknown" if st.get("epochs") is None else fmt_num(st["epochs"]), ""),
        ("duration", fmt_s(run.get("duration_s", 0) or 0), ""),
        _processes_kpi(run),
    ]
    if run.get("dropped_events"):
        out.append(("dropped events", fmt_num(run["dropped_events"]), ""))
    return out


def _io_kpis(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    run, io = doc.get("run", {}), doc.get("io") or {}
    return [
        ("read", fmt_bytes(io.get("bytes_read", 0) or 0), f"{fmt_num(io.get('reads', 0) or 0)} read calls"),
        ("written", fmt_bytes(io.get("bytes_written", 0) or 0), f"{fmt_num(io.get('writes', 0) or 0)} write calls"),
        ("read bandwidth", fmt_rate(io.get("bandwidth_read_wall_bytes_per_s", 0) or 0), "over the run"),
        ("write bandwidth", fmt_rate(io.get("bandwidth_write_wall_bytes_per_s", 0) or 0), "over the run"),
        ("files", fmt_num(io.get("files", 0) or 0), ""),
        ("duration", fmt_s(run.get("duration_s", 0) or 0), ""),
        _processes_kpi(run),
    ]  # fmt: skip


def _first_screen(doc: dict[str, Any]) -> str:
    """Where a step goes (or, without steps, the run's reads and writes) beside the findings."""
    if (doc.get("steps") or {}).get("count"):
        left = "<h2>Where a step goes</h2>" + _phase_table(doc)
    elif _io_first(doc):
        left = "<h2>I/O</h2>" + _io_summary(doc.get("io") or {}, 8, compact=True)
    else:
        left = (
            "<h2>Steps</h2><p class='muted'>No training steps detected. Steps come from "
            "optimizer.step() (PyTorch); loops without one can call holoprof.step() once per iteration."
            "</p>"
        )
    return (
        "<div class='first'><div class='card' id='headline'>" + left + "</div>"
        "<div class='card' id='findings'><h2>Findings</h2>" + _findings(doc) + "</div></div>"
    )


def _phase_table(doc: dict[str, Any]) -> str:
    """The phase bar and table: every phase of the data model that the run has, in its order."""
    phases = doc.get("phases", {})
    st = doc.get("steps", {})
    items = [
        (p, v)
        for p, v in phases.items()
        if float(v.get("fraction", 0) or 0) > 0 or float(v.get("total_s", 0) or 0) > 0
    ]
    bar = "".join(
        f"<div title='{esc(palette.phase_label(p))} {esc(fmt_pct(v.get('fraction', 0)))}' "
        f"style='width:{100 * float(v.get('fraction', 0) or 0):.3f}%;background:{palette.phase_color(p)}'></div>"
        for p, v in items
    )
    rows = "".join(
        f"<tr data-phase='{esc(p)}'><td><span class='sw' style='background:{palette.phase_color(p)}'></span>"
        f"{esc(palette.phase_label(p))}</td><td class='num'>{esc(fmt_pct(v.get('fraction', 0)))}</td>"
        f"<td class='num'>{esc(fmt_phase_per_step(v, fmt_s))}</td>"
        f"<td class='num'>{esc(fmt_s(v.get('total_s', 0)))}</td></tr>"
        for p, v in items
    )
    outside = doc.get("outside_steps") or {}
    out_txt = ""
    if float(outside.get("total_s", 0) or 0) > 0:
        out_items = ", ".join(
            f"{esc(palette.phase_label(k))} {esc(fmt_s(v))}"
            for k, v in outside.get("phases", {}).items()
            if v > 0
        )
        out_txt = f"<p class='muted'>Outside training steps: {out_items}</p>"
    return (
        f"<div class='phasebar'>{bar}</div><table class='phase-table'><thead><tr><th>phase</th>"
        "<th class='num'>share of step time</th><th class='num'>median per step</th><th class='num'>total</th>"
        f"</tr></thead><tbody>{rows}</tbody></table>"
        f"<p class='muted'>Shares are of the main loop's total step time ({esc(fmt_s(st.get('total_s', 0) or 0))} "
        f"over {esc(fmt_num(int(st.get('count', 0) or 0)))} steps).</p>" + out_txt
    )


def _charts(doc: dict[str, Any]) -> str:
    """The uPlot charts (drawn by the inline script from the data embedded in the page)."""
    st = doc.get("steps", {})
    tl = st.get("timeline") or []
    parts = []
    if st.get("count") and tl:
        downsampled = len(tl) < int(st.get("count", 0))
        note = (
            f"<p class='muted'>downsampled: {len(tl)} points, each the mean of about "
            f"{math.ceil(int(st['count']) / max(1, len(tl)))} consecutive steps of {int(st['count'])}</p>"
            if downsampled
            else ""
        )
        parts.append(
            "<section><div class='charts'>"
            f"<div><h2>Step time</h2><div class='chart' data-chart='step'></div>{note}</div>"
            f"<div><h2>Phases over steps</h2><div class='chart' data-chart='phases'></div>{note}</div>"
            "</div></section>"
        )
    if len(st.get("per_rank") or []) > 1:
        parts.append(
            "<section><h2>Step time per rank</h2><p class='muted'>median step of each rank, split into its "
            "phases</p><div class='chart' data-chart='ranks'></div></section>"
        )
    if any(len(v or []) >= 2 for v in ((doc.get("resources") or {}).get("series") or {}).values()):
        hosts = int(((doc.get("resources") or {}).get("hosts_combined") or {}).get("hosts") or 0)
        combined = (
            f"; over {hosts} hosts: the job's lines are its total (the sum over the hosts), the host "
            "lines the mean over the hosts"
            if hosts >= 2
            else ""
        )
        parts.append(
            "<section><h2>Resources over time</h2><p class='muted'>downsampled: means over equal time "
            f"buckets of the job-wide samples{combined}; host lines (dashed) start hidden: click a legend "
            "entry to show or hide a line</p><div class='charts' data-chart='resources'></div></section>"
        )
    return "".join(parts)


#: What the inline script draws: the parts of the report that the charts read.
def _chart_data(doc: dict[str, Any]) -> dict[str, Any]:
    st = doc.get("steps", {})
    return {
        "phases": doc.get("phases", {}),
        "steps": {"count": st.get("count", 0), "timeline": st.get("timeline") or [], "per_rank": st.get("per_rank") or []},
        "resources": {"series": (doc.get("resources") or {}).get("series") or {}},
        "stragglers": {"heatmap": (doc.get("stragglers") or {}).get("heatmap") or {}},
        "gantt": _gantt_data(doc),
        "read_sizes": _read_sizes(doc.get("io") or {}),
        "memory": _memory_categories(doc.get("memory") or {}),
    }  # fmt: skip


DRAW_JS = """
(function () {
  var H = window.HoloViews, R = window.HOLOPROF_REPORT;
  if (!H || !window.uPlot) return;
  document.querySelectorAll("[data-chart]").forEach(function (el) {
    var kind = el.getAttribute("data-chart");
    if (kind === "resources") {
      H.resourceSpecs(R.resources.series).forEach(function (g) {
        var cell = document.createElement("div");
        cell.innerHTML = "<h3>" + H.esc(g.title) + "</h3><div class='chart'></div>";
        el.appendChild(cell);
        H.draw(cell.querySelector(".chart"), g.spec);
      });
      return;
    }
    if (kind === "rank-heatmap") { H.heatmap(el, R.stragglers.heatmap); return; }
    var w = el.clientWidth || 600;
    if (kind === "gantt") { H.draw(el, H.ganttSpec(R.gantt.rows, R.gantt.t_end, w)); return; }
    if (kind === "read-sizes") {
      H.draw(el, H.barSpec({ labels: R.read_sizes.map(function (x) { return x[0]; }), horizontal: true, unit: "count",
        width: w, xLabel: "read size", yLabel: "reads", series: [{ label: "reads", color: H.P.series_colors[2],
        values: R.read_sizes.map(function (x) { return x[1]; }) }] }));
      return;
    }
    if (kind === "memory") {
      var cats = R.memory;
      H.draw(el, H.barSpec({ labels: cats.map(function (c) { return c.label; }), horizontal: true, unit: "bytes",
        width: w, xLabel: "category", yLabel: "bytes",
        series: cats.map(function (c, i) {
          return { label: c.label, color: c.color, values: cats.map(function (d, j) { return i === j ? c.bytes : null; }) };
        }) }));
      return;
    }
    var phases = H.phasesOf(R);
    var spec = kind === "step" ? H.stepSpec(R.steps.timeline)
      : kind === "phases" ? H.phaseSpec(R.steps.timeline, phases)
      : kind === "ranks" ? H.rankSpec(R.steps.per_rank, phases) : null;
    if (spec) H.draw(el, spec, kind === "ranks" ? 260 : 220);
  });
})();
"""


def _gantt_rows(
    doc: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[dict[str, Any], float, float]], int]:
    """The stages and processes of the Gantt chart: (stages shown, stages left out, processes shown
    with their start and end, how many processes were left out)."""
    every = doc.get("stages") or []
    all_stages = collapse_ranks(every)  # 2,048 ranks of one command: one row
    stages, rest = top_rows(
        all_stages,
        lambda st: float(st.get("wall_s") or 0),
        parent=tree_parent([int(st.get("depth", 0)) for st in all_stages]),
    )
    run = doc.get("run", {})
    duration = float(run.get("duration_s", 0) or 0)
    spans, hidden = top_rows(  # the longest processes
        _process_spans(doc, every, run.get("start_ns") or 0, duration), lambda x: x[2] - x[1]
    )
    return stages, rest, spans, len(hidden)


def _gantt_data(doc: dict[str, Any]) -> dict[str, Any]:
    """What the Gantt chart draws: its rows (label, start, end, colour, tip, critical) and its end."""
    stages, _rest, spans, _hidden = _gantt_rows(doc)
    rows = [_stage_bar(st) for st in stages] + [_process_bar(p, s, e) for p, s, e in spans]
    keys = ("label", "start", "end", "color", "tip", "strong")
    duration = float((doc.get("run") or {}).get("duration_s", 0) or 0)
    return {"rows": [dict(zip(keys, r, strict=True)) for r in rows], "t_end": duration}


def _gantt(doc: dict[str, Any]) -> str:
    stages, rest, spans, hidden = _gantt_rows(doc)
    if not stages and not spans:
        return ""
    chart = (
        "<div class='chart fit' data-chart='gantt' role='img' aria-label='stages and processes over time'>"
        "</div>"
    )
    if rest or hidden:
        cut = [f"{len(rest)} more stages" if rest else "", f"{hidden} more processes" if hidden else ""]
        chart += (
            f"<p class='muted'>The chart shows the {len(stages)} longest stages and {len(spans)} longest "
            f"processes; {' and '.join(c for c in cut if c)} are in the JSON report.</p>"
        )
    return (
        "<section><h2>Workflow: stages and processes</h2>"
        + legend([*((k, c) for k, c in KIND_COLORS.items()), ("process (traced)", "#c5cbe0")])
        + chart
        + _stage_table(stages, rest)
        + _process_table(spans)
        + "</section>"
    )


def _process_table(spans: list[tuple[dict[str, Any], float, float]]) -> str:
    """The processes of the Gantt chart as a table, for a reader without script ("" without any)."""
    if not spans:
        return ""
    trs = "".join(
        f"<tr><td class='num'>{esc(p.get('pid'))}</td><td class='mono'>{esc(_process_bar(p, s, e)[0])}</td>"
        f"<td class='num'>{esc(fmt_s(max(0.0, s)))}</td><td class='num'>{esc(fmt_s(max(0.0, e)))}</td></tr>"
        for p, s, e in spans
    )
    return (
        "<noscript><h3>Processes</h3><table><tr><th class='num'>pid</th><th>process</th>"
        f"<th class='num'>start</th><th class='num'>end</th></tr>{trs}</table></noscript>"
    )


def _stage_bar(st: dict[str, Any]) -> tuple[str, float, float, str, str, bool]:
    """A stage's bar in the Gantt chart: (label, start, end, color, tooltip, critical)."""
    label = "  " * int(st.get("depth", 0)) + str(st.get("name", "?"))
    tip = (
        f"{st.get('name')} ({st.get('kind')}): {fmt_s(st.get('start_s', 0))} → {fmt_s(st.get('end_s', 0))}, "
        f"{fmt_pct(st.get('share', 0))} of the run" + (", on the critical path" if st.get("critical") else "")
    )
    return (
        label,
        float(st.get("start_s", 0)),
        float(st.get("end_s", 0)),
        KIND_COLORS.get(str(st.get("kind")), "#aec7e8"),
        tip,
        bool(st.get("critical")),
    )


def _process_spans(
    doc: dict[str, Any], all_stages: list[dict[str, Any]], t0: Any, duration: float
) -> list[tuple[dict[str, Any], float, float]]:
    """Every process but the launcher, with its start and end in seconds of the run (a process
    without an end ends with its stage, else with the run)."""
    end_by_pid = {(st.get("host"), st.get("pid")): float(st.get("end_s", 0)) for st in all_stages}
    spans: list[tuple[dict[str, Any], float, float]] = []
    for p in doc.get("processes") or []:
        if p.get("role") == "launcher" or not p.get("start_ns"):
            continue
        s = (int(p["start_ns"]) - int(t0)) / 1e9 if t0 else 0.0
        e_ns = int(p.get("end_ns") or 0)
        e = (e_ns - int(t0)) / 1e9 if e_ns and t0 else end_by_pid.get((p.get("host"), p.get("pid")), duration)
        spans.append((p, s, e))
    return spans


def _process_bar(p: dict[str, Any], s: float, e: float) -> tuple[str, float, float, str, str, bool]:
    """A process's bar in the Gantt chart: (label, start, end, color, tooltip, critical)."""
    argv = " ".join(str(a) for a in (p.get("argv") or []))
    name = os.path.basename(str((p.get("argv") or ["?"])[0]))
    return (
        f"pid {p.get('pid')} {name}"[:34],
        max(0.0, s),
        max(0.0, e),
        "#c5cbe0" if p.get("traced") else "#e3e6ee",
        f"pid {p.get('pid')} ({p.get('role')}{', traced' if p.get('traced') else ', sampled'}): {argv}",
        False,
    )


def _stage_table(stages: list[dict[str, Any]], rest: list[dict[str, Any]]) -> str:
    """The table of the stages shown, with a row for the rest ("" without stages)."""
    if not stages:
        return ""
    trs = "".join(
        "<tr>"
        f"<td>{'&nbsp;&nbsp;' * int(st.get('depth', 0))}"
        f"{'<span class=crit>◆</span> ' if st.get('critical') else ''}{esc(st.get('name'))}</td>"
        f"<td>{esc(st.get('kind'))}</td><td class='num'>{esc(fmt_s(st.get('wall_s', 0)))}</td>"
        f"<td class='num'>{esc(fmt_pct(st.get('share', 0)))}</td><td class='num'>{esc(st.get('steps', 0))}</td>"
        f"<td class='num'>{esc(fmt_s(st.get('cpu_s', 0)))}</td>"
        f"<td class='num'>{esc(fmt_bytes(st.get('max_rss_bytes', 0)))}</td>"
        f"<td class='num'>{esc(fmt_bytes(st.get('read_bytes', 0)))}</td>"
        f"<td class='num'>{esc(fmt_bytes(st.get('write_bytes', 0)))}</td>"
        f"<td class='num'>{esc('—' if st.get('gpu_s') is None else fmt_s(st['gpu_s']))}</td></tr>"
        for st in stages
    )
    if rest:
        rss = max(float(st.get("max_rss_bytes") or 0) for st in rest)
        trs += (
            f"<tr class='more'><td>{esc(more_label(rest, 'stages'))}</td><td></td>"
            f"<td class='num'>{esc(at_most(rest, 'wall_s', fmt_s))}</td><td></td>"
            f"<td class='num'>{esc(int(total(rest, 'steps')))}</td>"
            f"<td class='num'>{esc(fmt_s(total(rest, 'cpu_s')))}</td><td class='num'>{esc(fmt_bytes(rss))}</td>"
            f"<td class='num'>{esc(fmt_bytes(total(rest, 'read_bytes')))}</td>"
            f"<td class='num'>{esc(fmt_bytes(total(rest, 'write_bytes')))}</td><td></td></tr>"
        )
    return (
        "<table><tr><th>stage</th><th>kind</th><th class='num'>wall</th><th class='num'>share</th>"
        "<th class='num'>steps</th><th class='num'>CPU</th><th class='num'>max RSS</th>"
        "<th class='num'>read</th><th class='num'>written</th><th class='num'>GPU</th></tr>"
        + trs
        + "</table><p class='muted'><span class='crit'>◆</span> on the critical path: the stages the "
        "end-to-end time waited on</p>"
    )


def _io_summary(io: dict[str, Any], limit: int, compact: bool = False) -> str:
    """Reads and writes: totals, bandwidth over the run and inside the calls, the top files and a row
    for the rest (counted from the run's totals, not from the files listed in the report)."""
    trs = "".join(
        f"<tr><td>{label}</td><td class='num'>{esc(fmt_bytes(io.get(b, 0) or 0))}</td>"
        f"<td class='num'>{esc(fmt_num(io.get(n, 0) or 0))}</td><td class='num'>{esc(fmt_s(io.get(t, 0) or 0))}</td>"
        f"<td class='num'>{esc(fmt_rate(io.get(wall, 0) or 0))}</td><td class='num'>{esc(fmt_rate(io.get(inside, 0) or 0))}</td></tr>"
        for label, b, n, t, wall, inside in (
            ("read", "bytes_read", "reads", "read_time_s", "bandwidth_read_wall_bytes_per_s", "bandwidth_read_bytes_per_s"),
            ("written", "bytes_written", "writes", "write_time_s", "bandwidth_write_wall_bytes_per_s", "bandwidth_write_bytes_per_s"),
        )
    )  # fmt: skip
    out = (
        "<table class='io-totals'><thead><tr><th></th><th class='num'>bytes</th><th class='num'>calls</th>"
        "<th class='num' title='summed over the processes'>time in calls</th><th class='num'>over the run</th>"
        f"<th class='num' title='bytes over the time in calls summed over the processes'>per process in calls</th>"
        f"</tr></thead><tbody>{trs}</tbody></table>"
    )
    files = io.get("files_detail") or []
    shown = files[:limit]
    if not shown:
        return out
    head = "<th>file</th><th class='num'>read</th><th class='num'>written</th>"
    head += "<th class='num'>reads</th><th class='num'>writes</th>"
    if not compact:
        head += "<th class='num'>mapped</th><th class='num'>opens</th><th class='num'>sequential</th><th class='num'>read time</th>"
    rows = ""
    for f in shown:
        rows += (
            f"<tr><td class='mono'>{esc(f.get('path', ''))}</td><td class='num'>{esc(fmt_bytes(f.get('bytes_read', 0) or 0))}</td>"
            f"<td class='num'>{esc(fmt_bytes(f.get('bytes_written', 0) or 0))}</td>"
            f"<td class='num'>{esc(fmt_num(f.get('reads', 0) or 0))}</td><td class='num'>{esc(fmt_num(f.get('writes', 0) or 0))}</td>"
        )  # fmt: skip
        if not compact:
            rows += (
                f"<td class='num'>{esc(fmt_bytes(f.get('bytes_mapped', 0) or 0) if f.get('mmaps') else '–')}</td>"
                f"<td class='num'>{esc(fmt_num(f.get('opens', 0) or 0))}</td>"
                f"<td class='num'>{esc(fmt_pct(f.get('seq_read_fraction', 0) or 0) if f.get('reads') else '–')}</td>"
                f"<td class='num'>{esc(fmt_s(f.get('read_time_s', 0) or 0))}</td>"
            )
        rows += "</tr>"
    rows += _more_files_row(io, shown, 5 if compact else 9)
    return out + f"<table class='io-files'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _more_files_row(io: dict[str, Any], shown: list[dict[str, Any]], columns: int) -> str:
    """ "… and 2,043 more files: 1.58 MiB read, 510 GiB written" from the run's totals ("" if none)."""
    more, read, _reads, written = more_files(io, shown)
    if not more:
        return ""
    what = ", ".join(
        x
        for x in (
            f"{fmt_bytes(read)} read" if read else "",
            f"{fmt_bytes(written)} written" if written else "",
        )
        if x
    )
    return f"<tr class='more'><td colspan='{columns}'>… and {fmt_num(more)} more files{': ' + what if what else ''}</td></tr>"


def _io(doc: dict[str, Any]) -> str:
    io = doc.get("io") or {}
    if not io:
        return ""
    items = _read_sizes(io)
    hchart = (
        "<div class='chart fit' data-chart='read-sizes' role='img' aria-label='read sizes'></div>"
        + _noscript_table(("read size", "reads"), [(k, fmt_num(v)) for k, v in items])
        if items
        else ""
    )
    return (
        "<section><h2>I/O</h2>"
        + _io_summary(io, 20)
        + (f"<h3>Read sizes (Darshan buckets)</h3>{hchart}" if hchart else "")
        + "</section>"
    )


def _bucket_label(name: str) -> str:
    """A Darshan size bucket for people: ``100_1K`` -> "100 B–1 KiB", ``1G_PLUS`` -> "≥ 1 GiB"."""
    for key, lo, hi in model.DARSHAN_SIZE_BUCKETS:
        if key == name:
            return f"≥ {fmt_bytes(lo)}" if hi >= 2**62 else f"{fmt_bytes(lo)}–{fmt_bytes(hi)}"
    return name


def _read_sizes(io: dict[str, Any]) -> list[tuple[str, float]]:
    """The read-size histogram's buckets (named for people), without empty ones at either end (as
    the terminal)."""
    hist = io.get("read_size_histogram") or {}
    items = [(_bucket_label(str(k)), float(v or 0)) for k, v in hist.items()]
    while items and not items[-1][1]:
        items.pop()
    while items and not items[0][1]:
        items.pop(0)
    return items


def _noscript_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A chart's numbers as a table for a reader without script."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head[:1]) + "".join(
        f"<th class='num'>{esc(h)}</th>" for h in head[1:]
    )
    trs = "".join(
        "<tr>" + f"<td>{esc(r[0])}</td>" + "".join(f"<td class='num'>{esc(c)}</td>" for c in r[1:]) + "</tr>"
        for r in rows
    )
    return f"<noscript><table><tr>{th}</tr>{trs}</table></noscript>"


def _memory_categories(mem: dict[str, Any]) -> list[dict[str, Any]]:
    """The memory categories at the step with the peak: label, bytes, colour."""
    return [
        {"key": str(k), "label": str(k).replace("_", " "), "bytes": float(v or 0), "color": MEMORY_COLORS.get(str(k), "#999")}
        for k, v in (mem.get("categories") or {}).items()
    ]  # fmt: skip


def _memory(doc: dict[str, Any]) -> str:
    mem = doc.get("memory") or {}
    cats = mem.get("categories") or {}
    if not mem:
        return ""
    tiles = []
    if mem.get("peak_bytes") is not None:
        tiles.append(("peak", fmt_bytes(mem["peak_bytes"]), ""))
    if mem.get("device"):
        tiles.append(("device", str(mem["device"]), ""))
    parts = ["<section><h2>Memory</h2>", _kpi_tiles(tiles)]
    if cats:
        items = _memory_categories(mem)
        parts.append("<h3>Categories at the step with the peak</h3>")
        parts.append(
            "<div class='chart fit' data-chart='memory' role='img' aria-label='memory categories'></div>"
        )
        parts.append(
            _noscript_table(("category", "bytes"), [(c["label"], fmt_bytes(c["bytes"])) for c in items])
        )
    un = mem.get("activations_unmeasured")
    if un:
        steps = ", ".join(str(s) for s in un["steps"][:8]) + (" ..." if len(un["steps"]) > 8 else "")
        parts.append(
            f"<p class='note'>Activations not measured on step(s) {esc(steps)}: {esc(un['why'])}</p>"
        )
    layers = mem.get("per_layer") or []
    if layers:
        trs = "".join(
            f"<tr><td class='mono'>{esc(layer.get('name', ''))}</td>"
            f"<td class='num'>{esc(fmt_bytes(layer.get('activation_bytes', 0) or 0))}</td>"
            f"<td class='num'>{esc(fmt_bytes(layer.get('parameter_bytes', 0) or 0))}</td></tr>"
            for layer in layers[:30]
        )
        parts.append(
            "<h3>Per layer</h3><table><tr><th>layer</th><th class='num'>activations</th>"
            "<th class='num'>parameters</th></tr>" + trs + "</table>"
        )
    parts.append("</section>")
    return "".join(parts)


def _evidence(ev: dict[str, Any]) -> str:
    """Evidence as a short table of named numbers; nested evidence (per rank, per file, a model's
    inputs) as a small table inside a details element."""
    scalars = [(k, v) for k, v in ev.items() if not isinstance(v, (dict, list))]
    nested = [(k, v) for k, v in ev.items() if isinstance(v, (dict, list)) and v]
    out = ""
    if scalars:
        out += "<table class='ev'><tbody>" + "".join(
            f"<tr><th>{esc(evidence_label(k))}</th><td>{esc(evidence_value(k, v))}</td></tr>" for k, v in scalars
        ) + "</tbody></table>"  # fmt: skip
    for k, v in nested:
        out += f"<details class='ev-details'><summary>{esc(evidence_label(k))} ({len(v)})</summary>{_nested(k, v)}</details>"
    return out


def _nested(key: str, v: dict[str, Any] | list[Any], limit: int = 8) -> str:
    def cell(k: str, x: Any) -> str:
        return esc(json.dumps(x, default=str) if isinstance(x, (dict, list)) else evidence_value(k, x))

    if isinstance(v, dict):
        return "<table class='ev-nested'><tbody>" + "".join(
            f"<tr><th>{esc(evidence_label(k))}</th><td>{cell(k, x)}</td></tr>" for k, x in v.items()
        ) + "</tbody></table>"  # fmt: skip
    if not all(isinstance(x, dict) for x in v):
        return f"<div class='ev-list'>{esc(', '.join(cell(key, x) for x in v))}</div>"
    cols = list(dict.fromkeys(k for x in v for k in x))
    rows = "".join(
        "<tr>" + "".join(f"<td>{cell(c, x.get(c))}</td>" for c in cols) + "</tr>" for x in v[:limit]
    )
    if len(v) > limit:
        rows += f"<tr class='more'><td colspan='{len(cols)}'>… and {len(v) - limit} more</td></tr>"
    head = "".join(f"<th>{esc(evidence_label(c))}</th>" for c in cols)
    return f"<table class='ev-nested'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _findings(doc: dict[str, Any]) -> str:
    """Each finding: its headline, its predicted or measured gain, its evidence, its fix."""
    found = doc.get("findings") or []
    if not found:
        return "<div class='empty' id='no-findings'>No findings: nothing crossed a threshold.</div>"
    items = []
    for f in found:
        sev = str(f.get("severity", "low"))
        gain = gain_label(f)
        thr = f.get("threshold") or {}
        thr_txt = ", ".join(f"{evidence_label(k)} {evidence_value(k, v)}" for k, v in thr.items())
        items.append(
            f"<div class='finding {esc(sev)}' data-finding='{esc(f.get('id', ''))}'>"
            f"<div class='fh'><span class='badge {esc(sev)}'>{esc(sev)}</span> "
            f"<span class='t'>{esc(f.get('title', ''))}</span></div>"
            + (f"<div class='gain'>{esc(gain)}</div>" if gain else "")
            + _evidence(f.get("evidence") or {})
            + f"<div class='fix'><strong>Fix:</strong> {esc(f.get('recommendation', ''))}</div>"
            + (f"<div class='muted'>threshold: {esc(thr_txt)}</div>" if thr_txt else "")
            + f"<div class='fid mono'>{esc(f.get('id', ''))}</div></div>"
        )
    return "".join(items)


def _notes(doc: dict[str, Any]) -> str:
    run = doc.get("run", {})
    notes = []
    if run.get("dropped_events"):
        notes.append(
            f"{run['dropped_events']} events were dropped (buffer full or disk unwritable); totals may be low"
        )
    notes += [f"collector turned off: {e}" for e in run.get("errors", []) or []]
    notes += [str(w) for w in run.get("warnings", []) or []]
    if not notes:
        return ""
    return (
        "<section><h2>Notes</h2>" + "".join(f"<div class='note'>{esc(n)}</div>" for n in notes) + "</section>"
    )


def _scripts(doc: dict[str, Any]) -> str:
    """uPlot, the palette, the shared view code and the chart data, inline."""
    return charts.scripts(_chart_data(doc), DRAW_JS)


def _compute(doc: dict[str, Any]) -> str:
    """FLOPs per step, achieved FLOP/s, MFU and its peak; torch.compile's time, breaks, recompiles."""
    c = doc.get("compute") or {}
    if not c:
        return ""
    parts = ["<section><h2>Compute: FLOPs and MFU</h2>"]
    if c.get("why"):
        parts.append(f"<p class='muted'>FLOPs not counted: {esc(c['why'])}</p>")
    else:
        tiles = [
            (f"FLOPs per step ({c.get('dtype') or '?'})", fmt_flops(c.get("flops_per_step")), ""),
            ("achieved", fmt_flops(c.get("achieved_flops_per_s"), "FLOP/s"), ""),
            ("peak", fmt_flops(c.get("peak_flops_per_s"), "FLOP/s"), ""),
            ("MFU", fmt_mfu(c["mfu"]) if c.get("mfu") is not None else "n/a", ""),
        ]
        parts.append(_kpi_tiles(tiles))
        by_phase = ", ".join(
            f"{esc(k)} {esc(fmt_flops(v))}" for k, v in (c.get("flops_by_phase") or {}).items() if v
        )
        parts.append(
            f"<p>counted on step {esc(c.get('counted_step'))}: {by_phase or 'none'}; mean step "
            f"{esc(fmt_s(c.get('mean_step_s') or 0))} over {esc(c.get('steps_in_mean'))} steps</p>"
            f"<p class='muted'>peak: {esc(c.get('peak_source'))}</p>"
        )
        parts += [f"<div class='note'>{esc(n)}</div>" for n in c.get("notes") or []]
    comp = c.get("compile") or {}
    if comp:
        parts.append(
            f"<h3>torch.compile</h3><p>{esc(fmt_s(comp.get('total_s') or 0))} compiling "
            f"({esc(comp.get('compiles'))} compilations)</p>"
        )
        rows = [("graph break", r) for r in comp.get("graph_breaks") or []]
        rows += [("recompile", r) for r in comp.get("recompiles") or []]
        if rows:
            trs = "".join(
                f"<tr><td>{esc(w)}</td><td class='num'>{esc(r.get('count'))}</td>"
                f"<td class='mono'>{esc(r.get('location'))}</td><td>{esc(r.get('reason'))}"
                + (
                    f"<br><span class='muted'>{esc((r.get('hints') or [''])[0])}</span>"
                    if r.get("hints")
                    else ""
                )
                + "</td></tr>"
                for w, r in rows[:30]
            )
            parts.append(
                "<table><tr><th>what</th><th class='num'>count</th><th>where</th><th>reason</th></tr>"
                + trs
                + "</table>"
            )
    parts.append("</section>")
    return "".join(parts)


def _goodput(doc: dict[str, Any]) -> str:
    g = doc.get("goodput") or {}
    wall = float(g.get("wall_s") or 0)
    if not g or wall <= 0:
        return ""
    trs = "".join(
        f"<tr><td>{esc(k)}</td><td class='num'>{esc(fmt_s(v))}</td><td class='num'>{fmt_pct(float(v) / wall)}</td></tr>"
        for k, v in (g.get("categories") or {}).items()
        if float(v) > 0
    )
    ranks = g.get("per_rank") or []
    per_rank = (
        "<p class='muted'>per rank: "
        + ", ".join(f"rank {esc(r.get('rank'))} {fmt_pct(r.get('fraction') or 0)}" for r in ranks[:64])
        + "</p>"
        if len(ranks) > 1
        else ""
    )
    return (
        f"<section><h2>Goodput {fmt_pct(g.get('fraction') or 0)}</h2>"
        "<p class='muted'>productive step compute over the training process's wall time</p>"
        "<table><tr><th>category</th><th class='num'>time</th><th class='num'>share</th></tr>"
        + trs
        + f"<tr><td><b>wall time</b></td><td class='num'><b>{esc(fmt_s(wall))}</b></td><td class='num'>100.0%</td></tr>"
        "</table>" + per_rank + "</section>"
    )


def render_html(doc: dict[str, Any]) -> str:
    """The whole report as one HTML document (a string)."""
    doc = printable(doc)
    run = doc.get("run", {})
    title = f"holoprof — {run.get('name') or os.path.basename(str(run.get('dir', 'run')))}"
    body = "".join(
        part
        for part in (
            _header(doc),
            _first_screen(doc),
            _charts(doc),
            hosts_html(doc),
            stragglers_html(doc),
            _compute(doc),
            _goodput(doc),
            _gantt(doc),
            _io(doc),
            _memory(doc),
            _notes(doc),
        )
        if part
    )
    styles = charts.styles() + CSS
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        + charts.csp_meta()
        + f"<title>{esc(title)}</title><style>{styles}</style></head><body><main>{body}"
        "<noscript><p class='muted'>The charts need JavaScript; the tables above do not.</p></noscript>"
        f"<p class='muted'>{esc(doc.get('schema', ''))} · generated by holoprof · charts by uPlot (MIT)</p>"
        f"</main>{_scripts(doc)}</body></html>\n"
    )


def write_html(doc: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write the report ``doc`` to ``path`` as one self-contained HTML file."""
    text = render_html(doc)
    p = os.fspath(path)
    try:
        tmp = p + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, p)
    except OSError as exc:
        raise HoloprofError(f"cannot write {p} ({exc.strerror or exc}); choose a writable path for --html")
