"""The HTML report: one self-contained file (inline CSS and SVG, no script, no network) that renders a
``holoprof.report/1`` document; computes nothing.

Charts are SVG drawn here: step time over steps, the phase breakdown over steps (stacked), resources
over time, a Gantt chart of stages and processes, the I/O access-size histogram and top files, memory
categories. Every string from the run (paths, commands, names, evidence) is escaped. The document is
already downsampled (the step timeline holds at most ~120 points, resource series ~60), so the file
stays small for long runs; charts say so when they show downsampled data.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from holoprof.analyze.findings import gain_label
from holoprof.errors import HoloprofError
from holoprof.present.summary import at_most, more_label, top_rows, total, tree_parent
from holoprof.present.terminal import fmt_phase_per_step, host_clock_text
from holoprof.present.text import printable

PHASE_COLORS = {
    "data_wait": "#d62728",
    "forward": "#2ca02c",
    "backward": "#1f77b4",
    "optimizer": "#9467bd",
    "compute": "#98df8a",
    "compile": "#ff7f0e",
    "communication": "#e6b800",
    "checkpoint": "#17becf",
    "eval": "#8c8c8c",
    "other": "#c7c7c7",
}
KIND_COLORS = {
    "train": "#2ca02c",
    "evaluate": "#7f7f7f",
    "checkpoint": "#17becf",
    "prepare": "#ff7f0e",
    "other": "#aec7e8",
}
SEVERITY_COLORS = {"high": "#c62828", "medium": "#e08a00", "low": "#1565c0"}
MEMORY_COLORS = {
    "weights": "#1f77b4",
    "gradients": "#ff7f0e",
    "optimizer_state": "#9467bd",
    "activations": "#2ca02c",
    "other": "#c7c7c7",
}

CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;
background:#f6f7f9;color:#1d2330;font-size:14px;line-height:1.45}
main{max-width:1100px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:0 0 10px}
section{background:#fff;border:1px solid #e2e5ea;border-radius:8px;padding:16px 20px;margin:0 0 16px}
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:4px 8px;border-bottom:1px solid #eef0f3;
vertical-align:top}th{font-weight:600;color:#56607a;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px}.kv div:nth-child(odd){color:#56607a}
.tiles{display:flex;gap:12px;flex-wrap:wrap;margin-top:12px}.tile{background:#f3f5f8;border-radius:6px;
padding:8px 14px;min-width:110px}.tile b{display:block;font-size:18px}.tile span{color:#56607a;font-size:12px}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px;word-break:break-all}
.muted{color:#6b7489;font-size:12px}.finding{border-left:4px solid #999;padding:6px 12px;margin:10px 0;
background:#fafbfc}.finding h3{font-size:15px;margin:0 0 4px}.sev{font-size:11px;font-weight:700;
text-transform:uppercase;color:#fff;border-radius:3px;padding:1px 6px;margin-right:6px}
.legend{display:flex;gap:14px;flex-wrap:wrap;font-size:12px;margin:6px 0}.legend i{display:inline-block;
width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:middle}
.note{color:#8a5a00;background:#fff8e6;border:1px solid #f1dca8;border-radius:6px;padding:6px 10px;margin:6px 0}
svg{display:block;max-width:100%;height:auto}svg text{font-family:inherit;font-size:11px;fill:#56607a}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(330px,1fr));gap:12px}
.crit{color:#c62828;font-weight:700}
"""


# --- formatting --------------------------------------------------------------------------------------
def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def fmt_s(s: float) -> str:
    s = float(s)
    if s == 0:
        return "0 s"
    if abs(s) >= 100:
        return f"{s:.0f} s"
    if abs(s) >= 1:
        return f"{s:.2f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.0f} µs"


def fmt_bytes(b: float) -> str:
    b = float(b)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} TiB"


def fmt_pct(f: float) -> str:
    return f"{100 * float(f):.1f}%"


def fmt_num(x: float) -> str:
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 1e9:
        return f"{x / 1e9:.1f} G"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.1f} M"
    if abs(x) >= 1e3:
        return f"{x / 1e3:.1f} k"
    if abs(x) >= 10:
        return f"{x:.0f}"
    return f"{x:.2g}"


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, dict)):
        return json.dumps(v, default=str)
    return str(v)


# --- SVG primitives ----------------------------------------------------------------------------------
W, H = 680, 220
PAD_L, PAD_R, PAD_T, PAD_B = 62, 14, 12, 30


def _nice_max(v: float) -> float:
    if v <= 0 or not math.isfinite(v):
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def _axes(
    x0: float, x1: float, ymax: float, yfmt: Callable[[float], str], xfmt: Callable[[float], str],
    w: int = W, h: int = H, xlabel: str = "",
) -> list[str]:  # fmt: skip
    out = []
    pw, ph = w - PAD_L - PAD_R, h - PAD_T - PAD_B
    for i in range(5):
        y = PAD_T + ph - ph * i / 4
        out.append(f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{w - PAD_R}" y2="{y:.1f}" stroke="#eef0f3"/>')
        out.append(
            f'<text x="{PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(yfmt(ymax * i / 4))}</text>'
        )
    for i in range(5):
        x = PAD_L + pw * i / 4
        out.append(
            f'<text x="{x:.1f}" y="{h - PAD_B + 16}" text-anchor="middle">'
            f"{esc(xfmt(x0 + (x1 - x0) * i / 4))}</text>"
        )
    out.append(f'<line x1="{PAD_L}" y1="{PAD_T + ph}" x2="{w - PAD_R}" y2="{PAD_T + ph}" stroke="#b8bfcc"/>')
    if xlabel:
        out.append(f'<text x="{w - PAD_R}" y="{h - 2}" text-anchor="end">{esc(xlabel)}</text>')
    return out


def line_chart(
    points: Sequence[tuple[float, float]],
    yfmt: Callable[[float], str],
    xfmt: Callable[[float], str],
    xlabel: str,
    color: str = "#1f77b4",
    title: str = "",
    w: int = W,
    h: int = H,
) -> str:
    if not points:
        return ""
    xs = [float(p[0]) for p in points]
    ys = [float(p[1]) for p in points]
    x0, x1 = min(xs), max(xs)
    if x1 <= x0:
        x1 = x0 + 1
    ymax = _nice_max(max(ys) if ys else 1.0)
    pw, ph = w - PAD_L - PAD_R, h - PAD_T - PAD_B

    def px(x: float) -> float:
        return PAD_L + pw * (x - x0) / (x1 - x0)

    def py(y: float) -> float:
        return PAD_T + ph - ph * max(0.0, y) / ymax

    parts = [f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{esc(title)}">']
    if title:
        parts.append(f"<title>{esc(title)}</title>")
    parts += _axes(x0, x1, ymax, yfmt, xfmt, w, h, xlabel)
    coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=True))
    area = f"{px(xs[0]):.1f},{py(0):.1f} {coords} {px(xs[-1]):.1f},{py(0):.1f}"
    parts.append(f'<polygon points="{area}" fill="{color}" fill-opacity="0.12" stroke="none"/>')
    parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.8"/>')
    if len(xs) <= 40:
        for x, y in zip(xs, ys, strict=True):
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.2" fill="{color}">'
                f"<title>{esc(xfmt(x))}: {esc(yfmt(y))}</title></circle>"
            )
    parts.append("</svg>")
    return "".join(parts)


def stacked_bars(
    rows: Sequence[dict[str, float]],
    keys: Sequence[str],
    colors: dict[str, str],
    xkey: str,
    yfmt: Callable[[float], str],
    title: str,
    w: int = W,
    h: int = H,
) -> str:
    if not rows:
        return ""
    totals = [sum(float(r.get(k, 0) or 0) for k in keys) for r in rows]
    ymax = _nice_max(max(totals) if totals else 1.0)
    pw, ph = w - PAD_L - PAD_R, h - PAD_T - PAD_B
    n = len(rows)
    bw = pw / n
    x0, x1 = float(rows[0].get(xkey, 0)), float(rows[-1].get(xkey, 0))
    parts = [f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{esc(title)}">']
    parts.append(f"<title>{esc(title)}</title>")
    parts += _axes(x0, x1 if x1 > x0 else x0 + 1, ymax, yfmt, lambda v: f"{v:.0f}", w, h, "step")
    for i, r in enumerate(rows):
        y: float = PAD_T + ph
        x = PAD_L + i * bw
        for k in keys:
            v = float(r.get(k, 0) or 0)
            if v <= 0:
                continue
            hh = ph * v / ymax
            y -= hh
            parts.append(
                f'<rect x="{x + bw * 0.08:.2f}" y="{y:.2f}" width="{max(0.5, bw * 0.84):.2f}" '
                f'height="{hh:.2f}" fill="{colors.get(k, "#999")}">'
                f"<title>step {esc(f'{float(r.get(xkey, 0)):.0f}')} {esc(k)}: {esc(yfmt(v))}</title></rect>"
            )
    parts.append("</svg>")
    return "".join(parts)


def hbars(
    items: Sequence[tuple[str, float]], vfmt: Callable[[float], str], color: str, w: int = W, title: str = ""
) -> str:
    if not items:
        return ""
    row_h = 22
    label_w = 150
    h = row_h * len(items) + 8
    vmax = max((v for _, v in items), default=0) or 1.0
    bar_w = w - label_w - 90
    parts = [f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{esc(title)}">']
    if title:
        parts.append(f"<title>{esc(title)}</title>")
    for i, (label, v) in enumerate(items):
        y = 4 + i * row_h
        bw = bar_w * max(0.0, v) / vmax
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{esc(label)}</text>')
        parts.append(
            f'<rect x="{label_w}" y="{y + 3}" width="{bw:.1f}" height="{row_h - 8}" fill="{color}" rx="2"/>'
        )
        parts.append(f'<text x="{label_w + bw + 6:.1f}" y="{y + 15}">{esc(vfmt(v))}</text>')
    parts.append("</svg>")
    return "".join(parts)


def gantt(
    rows: Sequence[tuple[str, float, float, str, str, bool]], t_end: float, w: int = W + 240, title: str = ""
) -> str:
    """rows: (label, start_s, end_s, color, tooltip, emphasized)."""
    if not rows:
        return ""
    row_h = 20
    label_w = 230
    h = row_h * len(rows) + 34
    t_end = max(t_end, max((r[2] for r in rows), default=0.0), 1e-9)
    pw = w - label_w - PAD_R

    def px(t: float) -> float:
        return label_w + pw * max(0.0, t) / t_end

    parts = [f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{esc(title)}">']
    if title:
        parts.append(f"<title>{esc(title)}</title>")
    for i in range(5):
        x = label_w + pw * i / 4
        parts.append(f'<line x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{h - 26}" stroke="#eef0f3"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{h - 10}" text-anchor="middle">{esc(fmt_s(t_end * i / 4))}</text>'
        )
    for i, (label, s, e, color, tip, strong) in enumerate(rows):
        y = 4 + i * row_h
        x0, x1 = px(s), px(e)
        weight = ' font-weight="700"' if strong else ""
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end"{weight}>{esc(label)}</text>')
        stroke = ' stroke="#c62828" stroke-width="2"' if strong else ""
        parts.append(
            f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(1.0, x1 - x0):.1f}" height="{row_h - 6}" '
            f'fill="{color}" rx="2"{stroke}><title>{esc(tip)}</title></rect>'
        )
    parts.append("</svg>")
    return "".join(parts)


def legend(items: Sequence[tuple[str, str]]) -> str:
    return (
        '<div class="legend">'
        + "".join(f'<span><i style="background:{c}"></i>{esc(k)}</span>' for k, c in items)
        + "</div>"
    )


# --- sections ----------------------------------------------------------------------------------------
def _header(doc: dict[str, Any]) -> str:
    run = doc.get("run", {})
    st = doc.get("steps", {})
    cmd = " ".join(str(c) for c in (run.get("command") or []))
    status = str(run.get("status", "?"))
    code = run.get("exit_code")
    status_txt = status + (f" (exit {code})" if code not in (None, 0) else "")
    kv = [
        ("run", f'<span class="mono">{esc(run.get("dir", ""))}</span>'),
        ("command", f"<code>{esc(cmd)}</code>"),
        ("status", esc(status_txt)),
        ("hosts", esc(", ".join(str(h) for h in run.get("hosts", [])))),
    ]
    clocks = run.get("host_clocks") or []
    if len(clocks) > 1:  # each host's clock alignment, under the hosts
        kv[-1] = ("hosts", "<br>".join(esc(host_clock_text(h)) for h in clocks))
    tiles = [
        (fmt_s(run.get("duration_s", 0) or 0), "duration"),
        (f"{run.get('processes', 0)} ({run.get('traced_processes', 0)} traced)", "processes"),
        (str(st.get("count", 0)), "steps"),
        ("unknown" if st.get("epochs") is None else str(st["epochs"]), "epochs"),
        (fmt_s(st.get("median_s", 0) or 0), "median step"),
        (fmt_s(st.get("p90_s", 0) or 0), "p90 step"),
        (f"{float(st.get('per_s', 0) or 0):.2f}", "steps/s"),
    ]
    if run.get("ranks"):
        tiles.append((str(run["ranks"]), "ranks"))
    return (
        f"<section><h1>holoprof report{(' — ' + esc(run['name'])) if run.get('name') else ''}</h1>"
        '<div class="kv">' + "".join(f"<div>{k}</div><div>{v}</div>" for k, v in kv) + "</div>"
        '<div class="tiles">'
        + "".join(f"<div class='tile'><b>{esc(v)}</b><span>{esc(k)}</span></div>" for v, k in tiles)
        + "</div></section>"
    )


def _steps(doc: dict[str, Any]) -> str:
    st = doc.get("steps", {})
    tl = st.get("timeline") or []
    if not st.get("count"):
        return (
            "<section><h2>Steps</h2><p class='muted'>No training steps detected. Steps come from "
            "optimizer.step() (PyTorch); loops without one can call holoprof.step() once per iteration."
            "</p></section>"
        )
    downsampled = len(tl) < int(st.get("count", 0))
    note = (
        f"<p class='muted'>downsampled: {len(tl)} points, each the mean of about "
        f"{math.ceil(int(st['count']) / max(1, len(tl)))} consecutive steps of {int(st['count'])}</p>"
        if downsampled
        else ""
    )
    chart = line_chart(
        [(r["step"], r["step_s"]) for r in tl],
        fmt_s,
        lambda v: f"{v:.0f}",
        "step",
        title="step time over steps",
    )
    phases = doc.get("phases", {})
    names = [p for p in PHASE_COLORS] + [k for k in (tl[0] if tl else {}) if k not in PHASE_COLORS]
    keys = [p for p in names if p not in ("step", "step_s") and any(float(r.get(p, 0) or 0) > 0 for r in tl)]
    stacked = stacked_bars(tl, keys, PHASE_COLORS, "step", fmt_s, "phase breakdown over steps")
    rows = "".join(
        f"<tr><td><i style='display:inline-block;width:10px;height:10px;background:{PHASE_COLORS.get(p, '#999')}'>"
        f"</i> {esc(p)}</td><td class='num'>{fmt_pct(v.get('fraction', 0))}</td>"
        f"<td class='num'>{esc(fmt_phase_per_step(v, fmt_s))}</td><td class='num'>{esc(fmt_s(v.get('total_s', 0)))}</td></tr>"
        for p, v in phases.items()
        if float(v.get("fraction", 0) or 0) > 0 or float(v.get("total_s", 0) or 0) > 0
    )
    outside = doc.get("outside_steps") or {}
    out_txt = ""
    if float(outside.get("total_s", 0) or 0) > 0:
        items = ", ".join(f"{esc(k)} {esc(fmt_s(v))}" for k, v in outside.get("phases", {}).items() if v > 0)
        out_txt = f"<p class='muted'>outside training steps: {items}</p>"
    return (
        "<section><h2>Step time over steps</h2>" + chart + note + "</section>"
        "<section><h2>Where each step's time goes</h2>"
        + legend([(k, PHASE_COLORS.get(k, "#999")) for k in keys])
        + stacked
        + note
        + "<table><tr><th>phase</th><th class='num'>share</th><th class='num'>median/step</th>"
        "<th class='num'>total</th></tr>" + rows + "</table>" + out_txt + "</section>"
    )


_RESOURCE_CHARTS: tuple[tuple[str, str, Callable[[float], str], str], ...] = (
    ("job.cpu_percent", "CPU of the job (100% = one core)", lambda v: f"{v:.0f}%", "#1f77b4"),
    ("job.rss_bytes", "memory RSS of the job", fmt_bytes, "#9467bd"),
    ("job.read_bytes_per_s", "storage reads", lambda v: fmt_bytes(v) + "/s", "#2ca02c"),
    ("job.write_bytes_per_s", "storage writes", lambda v: fmt_bytes(v) + "/s", "#d62728"),
    ("host.net_recv_bytes_per_s", "network in (host)", lambda v: fmt_bytes(v) + "/s", "#17becf"),
    ("host.net_sent_bytes_per_s", "network out (host)", lambda v: fmt_bytes(v) + "/s", "#bcbd22"),
)


def _resources(doc: dict[str, Any]) -> str:
    res = doc.get("resources", {})
    series = res.get("series", {})
    summary = res.get("summary", {})
    charts: list[tuple[str, str, Callable[[float], str], str]] = list(_RESOURCE_CHARTS)
    for g in doc.get("run", {}).get("gpus", []) or []:
        charts += [
            (f"gpu.{g}.util_percent", f"GPU {g} utilization", lambda v: f"{v:.0f}%", "#ff7f0e"),
            (f"gpu.{g}.mem_used_bytes", f"GPU {g} memory", fmt_bytes, "#8c564b"),
            (f"gpu.{g}.power_w", f"GPU {g} power", lambda v: f"{v:.0f} W", "#e377c2"),
        ]
    cells = []
    for key, label, f, color in charts:
        pts = series.get(key) or []
        if len(pts) < 2:
            continue
        s = summary.get(key, {})
        chart = line_chart(pts, f, lambda v: f"{v:.0f} s", "seconds", color, label, w=420, h=180)
        cells.append(
            f"<div><b>{esc(label)}</b> <span class='muted'>mean {esc(f(s.get('mean', 0)))}, "
            f"max {esc(f(s.get('max', 0)))}</span>{chart}</div>"
        )
    if not cells:
        return ""
    return (
        "<section><h2>Resources over time</h2><p class='muted'>downsampled: means over equal time "
        "buckets of the job-wide samples</p><div class='grid'>" + "".join(cells) + "</div></section>"
    )


def _gantt(doc: dict[str, Any]) -> str:
    all_stages = doc.get("stages") or []
    stages, rest = top_rows(
        all_stages,
        lambda st: float(st.get("wall_s") or 0),
        parent=tree_parent([int(st.get("depth", 0)) for st in all_stages]),
    )
    run = doc.get("run", {})
    duration = float(run.get("duration_s", 0) or 0)
    spans, hidden = top_rows(  # the longest processes
        _process_spans(doc, all_stages, run.get("start_ns") or 0, duration), lambda x: x[2] - x[1]
    )
    rows = [_stage_bar(st) for st in stages] + [_process_bar(p, s, e) for p, s, e in spans]
    if not rows:
        return ""
    chart = gantt(rows, duration, title="stages and processes over time")
    if rest or hidden:
        chart += (
            f"<p class='muted'>The chart shows the {len(stages)} longest stages and {len(spans)} longest "
            f"processes; {len(rest)} more stages and {len(hidden)} more processes are in the JSON report.</p>"
        )
    return (
        "<section><h2>Workflow: stages and processes</h2>"
        + legend([*((k, c) for k, c in KIND_COLORS.items()), ("process (traced)", "#c5cbe0")])
        + chart
        + _stage_table(stages, rest)
        + "</section>"
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


def _io(doc: dict[str, Any]) -> str:
    io = doc.get("io") or {}
    if not io:
        return ""
    tiles = []
    for key, label, f in (
        ("bytes_read", "read", fmt_bytes),
        ("bytes_written", "written", fmt_bytes),
        ("files", "files", fmt_num),
        ("reads", "read calls", fmt_num),
        ("writes", "write calls", fmt_num),
        ("bandwidth_read_bytes_per_s", "read bandwidth", lambda v: fmt_bytes(v) + "/s"),
    ):
        if key in io and io[key] is not None:
            tiles.append(f"<div class='tile'><b>{esc(f(io[key]))}</b><span>{esc(label)}</span></div>")
    hist = io.get("read_size_histogram") or {}
    hchart = hbars([(str(k), float(v or 0)) for k, v in hist.items()], fmt_num, "#2ca02c", title="read sizes")
    files = io.get("files_detail") or []
    shown = files[:20]
    trs = "".join(
        f"<tr><td class='mono'>{esc(f.get('path', ''))}</td><td class='num'>{esc(fmt_bytes(f.get('bytes_read', 0) or 0))}</td>"
        f"<td class='num'>{esc(fmt_bytes(f.get('bytes_written', 0) or 0))}</td>"
        f"<td class='num'>{esc(fmt_bytes(f.get('bytes_mapped', 0) or 0) if f.get('mmaps') else '-')}</td>"
        f"<td class='num'>{esc(fmt_num(f.get('reads', 0) or 0))}</td><td class='num'>{esc(fmt_num(f.get('writes', 0) or 0))}</td>"
        f"<td class='num'>{esc(fmt_num(f.get('opens', 0) or 0))}</td>"
        f"<td class='num'>{esc(fmt_pct(f.get('seq_read_fraction', 0) or 0))}</td>"
        f"<td class='num'>{esc(fmt_s(f.get('read_time_s', 0) or 0))}</td></tr>"
        for f in shown
    )
    more = (
        f"<p class='muted'>{len(files) - len(shown)} more files not shown</p>"
        if len(files) > len(shown)
        else ""
    )
    table = (
        (
            "<h3>Top files</h3><table><tr><th>path</th><th class='num'>read</th><th class='num'>written</th>"
            "<th class='num'>mapped</th>"
            "<th class='num'>reads</th><th class='num'>writes</th><th class='num'>opens</th>"
            "<th class='num'>sequential</th><th class='num'>read time</th></tr>" + trs + "</table>" + more
        )
        if shown
        else ""
    )
    return (
        "<section><h2>I/O</h2><div class='tiles'>"
        + "".join(tiles)
        + "</div>"
        + (f"<h3>Read sizes (Darshan buckets)</h3>{hchart}" if hchart else "")
        + table
        + "</section>"
    )


def _memory(doc: dict[str, Any]) -> str:
    mem = doc.get("memory") or {}
    cats = mem.get("categories") or {}
    if not mem:
        return ""
    parts = ["<section><h2>Memory</h2><div class='tiles'>"]
    if mem.get("peak_bytes") is not None:
        parts.append(f"<div class='tile'><b>{esc(fmt_bytes(mem['peak_bytes']))}</b><span>peak</span></div>")
    if mem.get("device"):
        parts.append(f"<div class='tile'><b>{esc(mem['device'])}</b><span>device</span></div>")
    parts.append("</div>")
    if cats:
        items = [(str(k), float(v or 0)) for k, v in cats.items()]
        total = sum(v for _, v in items) or 1.0
        bar = ['<svg viewBox="0 0 680 28" width="680" height="28" role="img" aria-label="memory categories">']
        x = 0.0
        for k, v in items:
            wv = 680 * v / total
            bar.append(
                f'<rect x="{x:.1f}" y="2" width="{wv:.1f}" height="24" fill="{MEMORY_COLORS.get(k, "#999")}">'
                f"<title>{esc(k)}: {esc(fmt_bytes(v))}</title></rect>"
            )
            x += wv
        bar.append("</svg>")
        parts.append("<h3>Categories at the step with the peak</h3>")
        parts.append(legend([(f"{k} {fmt_bytes(v)}", MEMORY_COLORS.get(k, "#999")) for k, v in items]))
        parts.append("".join(bar))
    un = mem.get("activations_unmeasured")
    if un:
        steps = ", ".join(str(s) for s in un["steps"][:8]) + (" ..." if len(un["steps"]) > 8 else "")
        parts.append(
            f"<p class='note'>Activations not measured on step(s) {esc(steps)}: {esc(un['why'])}</p>"
        )
    tu = mem.get("tensors_unmeasured")
    if tu:
        parts.append(f"<p class='note'>Some tensors not measured: {esc(tu['why'])}</p>")
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


def fmt_flops(x: Any, unit: str = "FLOP") -> str:
    if x is None:
        return "n/a"
    x = float(x)
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= scale:
            return f"{x / scale:.1f} {prefix}{unit}"
    return f"{x:.0f} {unit}"


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
            (fmt_flops(c.get("flops_per_step")), f"per step ({c.get('dtype') or '?'})"),
            (fmt_flops(c.get("achieved_flops_per_s"), "FLOP/s"), "achieved"),
            (fmt_flops(c.get("peak_flops_per_s"), "FLOP/s"), "peak"),
            (fmt_pct(c["mfu"]) if c.get("mfu") is not None else "n/a", "MFU"),
        ]
        parts.append(
            "<div class='tiles'>"
            + "".join(f"<div class='tile'><b>{esc(v)}</b><span>{esc(k)}</span></div>" for v, k in tiles)
            + "</div>"
        )
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


def _findings(doc: dict[str, Any]) -> str:
    found = doc.get("findings") or []
    if not found:
        return "<section><h2>Findings</h2><p>No findings: nothing crossed a threshold.</p></section>"
    items = []
    for f in found:
        sev = str(f.get("severity", "low"))
        color = SEVERITY_COLORS.get(sev, "#666")
        ev = "".join(
            f"<tr><td>{esc(k)}</td><td class='mono'>{esc(_fmt_value(v))}</td></tr>"
            for k, v in (f.get("evidence") or {}).items()
        )
        thr = f.get("threshold") or {}
        thr_txt = ", ".join(f"{k} {_fmt_value(v)}" for k, v in thr.items())
        items.append(
            f"<div class='finding' style='border-left-color:{color}'>"
            f"<h3><span class='sev' style='background:{color}'>{esc(sev)}</span>{esc(f.get('title', ''))} "
            f"<span class='muted'>({esc(f.get('id', ''))})</span></h3>"
            f"<p><b>Fix:</b> {esc(f.get('recommendation', ''))}</p>"
            + (f"<p><b>Expected gain:</b> {esc(gain_label(f))}</p>" if gain_label(f) else "")
            + (f"<p class='muted'>threshold: {esc(thr_txt)}</p>" if thr_txt else "")
            + f"<table><tr><th>evidence</th><th>value</th></tr>{ev}</table></div>"
        )
    return "<section><h2>Findings</h2>" + "".join(items) + "</section>"


def _notes(doc: dict[str, Any]) -> str:
    run = doc.get("run", {})
    notes = []
    warnings = [str(w) for w in run.get("warnings", []) or []]
    if run.get("dropped_events") and not any("events were dropped" in w for w in warnings):
        # a report of an earlier version, whose warnings do not say it yet
        notes.append(
            f"{run['dropped_events']} events were dropped (buffer full or disk unwritable); totals may be low"
        )
    notes += [f"collector turned off: {e}" for e in run.get("errors", []) or []]
    notes += warnings
    if not notes:
        return ""
    return (
        "<section><h2>Notes</h2>" + "".join(f"<div class='note'>{esc(n)}</div>" for n in notes) + "</section>"
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
            _findings(doc),
            _steps(doc),
            _compute(doc),
            _goodput(doc),
            _gantt(doc),
            _resources(doc),
            _io(doc),
            _memory(doc),
            _notes(doc),
        )
        if part
    )
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
        'img-src data:">'
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>{body}"
        f"<p class='muted'>{esc(doc.get('schema', ''))} · generated by holoprof</p></main></body></html>\n"
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
