"""Renders a ``holoprof.sweep/1`` document: a terminal table and a self-contained HTML plot.

The plot follows the TBD suite's figure: throughput per configuration as bars, and beside it the
peak memory of each configuration stacked by category. Inline SVG, no script, no network.
"""

from __future__ import annotations

import html
from typing import IO, Any

from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from holoprof.analyze.sweep import step_of
from holoprof.present.terminal import fmt_bytes, fmt_s, keep_whole, make_console

CATEGORIES = ("weights", "gradients", "optimizer_state", "activations", "other")
COLORS = {
    "weights": "#4e79a7",
    "gradients": "#f28e2b",
    "optimizer_state": "#e15759",
    "activations": "#59a14f",
    "other": "#bab0ac",
}
STATUS_STYLE = {"ok": "green", "timeout": "yellow", "oom": "bold red", "failed": "red"}


SHORT = {
    "weights": "weights",
    "gradients": "grads",
    "optimizer_state": "optim",
    "activations": "activ",
    "other": "other",
}


def _num(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.2f}"


def _applied(r: dict[str, Any]) -> str:
    """What the job really had: the DataLoader's own values for loader knobs, counts for the others."""
    out = []
    loader = r.get("loader") or {}
    applied = (r.get("applied") or {}).get("applied") or {}
    for k in r.get("knobs") or {}:
        if k in loader:
            out.append(f"{k}={str(loader[k]).lower() if isinstance(loader[k], bool) else loader[k]}")
        elif k in applied:
            notes = applied[k]
            out.append(f"{k}: " + ", ".join(f"{n} ×{c}" if n == "applied" else n for n, c in notes.items()))
        else:
            out.append(f"{k}: not applied (nothing to apply it to)")
    return "; ".join(out)


def render(doc: dict[str, Any], file: IO[str] | None = None) -> None:
    console = make_console(file)  # the command, labels and errors come from the job: never markup
    rows = doc["rows"]
    names = list(doc["params"])
    knobs_only = bool(doc.get("knobs")) and set(names) == set(doc.get("knobs") or {})
    unit = next((r["throughput_unit"] for r in rows if r["throughput"] > 0), "samples/s")
    t = Table(title=Text(f"holoprof sweep: {' '.join(doc['command'])}"), title_justify="left")
    for n in names:
        t.add_column(n)
    t.add_column("status", no_wrap=True)
    for c in ("steps", "mean step", "95% CI", unit, "peak"):
        t.add_column(c, justify="right", no_wrap=True)
    cats_shown = () if knobs_only else CATEGORIES  # loader knobs do not move the tensors' memory
    for c in cats_shown:
        t.add_column(SHORT[c], justify="right", no_wrap=True)
    best = doc.get("recommended_index")
    for i, r in enumerate(rows):
        ok = r["steps"] > 0
        cats = r.get("categories") or {}
        values = [str(r["params"].get(n, "")) for n in names]
        if i == best:
            values[0] += " ★"
        ci = r.get("step_ci_s") or []
        t.add_row(
            *[Text(v) for v in values],
            Text(r["status"], style=STATUS_STYLE.get(r["status"], "white")),
            str(r["steps"]),
            fmt_s(step_of(r)) if ok else "-",
            f"{fmt_s(ci[0])}–{fmt_s(ci[1])}" if ok and len(ci) == 2 else "-",
            _num(r["throughput"]) if ok else "-",
            fmt_bytes(r["peak_bytes"]) if r["peak_bytes"] else "-",
            *[fmt_bytes(cats[c]) if c in cats else "-" for c in cats_shown],
        )
    # never cut a number: the number columns keep their width, and a table wider than the terminal
    # even so is printed at its own width
    keep_whole(t)
    need = Measurement.get(console, console.options, t).maximum
    if need > console.width:
        console = make_console(console.file, width=need)
    console.print(t)
    for r in rows:
        if r.get("knobs") and r["steps"] > 0:
            console.print(Text(f"{r['label']}: the job had {_applied(r)}"))
    for r in rows:
        if r["status"] in ("oom", "failed") and r["error"]:
            console.print(
                Text.assemble((f"{r['label']}: {r['status']}", "red"), f": {r['error']}  (log: {r['log']})")
            )
    console.print(Text.assemble(("recommendation", "bold"), f": {doc['reason']}"))
    console.print(Text(f"runs in {doc['out_dir']}"))


def render_measured(finding: dict[str, Any], file: IO[str] | None = None) -> None:
    """The input_bound finding after a sweep: what the model predicted, what was measured."""
    console = make_console(file)
    basis = finding.get("gain_basis") or {}
    if finding.get("gain_kind") != "measured":
        console.print("measured: the sweep has no run of the current configuration to compare with")
        return
    lo, hi = (basis.get("best_interval_s") or [0, 0])[:2]
    clo, chi = (basis.get("this_interval_s") or [0, 0])[:2]
    pred = ((finding.get("evidence") or {}).get("model") or {}).get("predicted_step_s") or {}
    console.print(
        Text.assemble(("measured best", "bold"), ": ")
        + Text(
            f"{basis['best']}: step {fmt_s(basis['best_step_s'])} (95% CI {fmt_s(lo)}–{fmt_s(hi)}) "
            f"against {fmt_s(basis['this_step_s'])} (95% CI {fmt_s(clo)}–{fmt_s(chi)}) with {basis['this']} "
            f"— {basis['verdict'] or 'not compared'}"
        )
    )
    if basis.get("gain"):
        console.print(f"measured gain: {100 * basis['gain']:.0f}% of step time (significant)")
    else:
        console.print("measured gain: none significant — keep the current configuration")
    if pred:
        console.print(
            "predicted by the model: "
            + ", ".join(f"num_workers={k}: {fmt_s(float(v))}" for k, v in pred.items())
        )


# --- HTML / SVG ----------------------------------------------------------------------------------------
def _bars_svg(rows: list[dict[str, Any]], best: int | None, w: int = 520, h: int = 300) -> str:
    unit = next((r["throughput_unit"] for r in rows if r["throughput"] > 0), "samples/s")
    top = max((r["throughput"] for r in rows), default=0.0) or 1.0
    left, bottom, plot_h = 60, 60, h - 90
    bw = (w - left - 20) / max(1, len(rows))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img">']
    out.append(
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">throughput ({html.escape(unit)})</text>'
    )
    for i, r in enumerate(rows):
        x = left + i * bw + bw * 0.15
        bh = plot_h * r["throughput"] / top
        y = h - bottom - bh
        color = "#2f7d32" if i == best else "#4e79a7"
        if r["steps"] > 0:
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw * 0.7:.1f}" height="{bh:.1f}" fill="{color}">'
                f"<title>{html.escape(r['label'])}: {r['throughput']:.1f} {html.escape(unit)}</title></rect>"
            )
            out.append(
                f'<text x="{x + bw * 0.35:.1f}" y="{y - 4:.1f}" font-size="11" text-anchor="middle">'
                f"{r['throughput']:.0f}</text>"
            )
        else:
            out.append(
                f'<text x="{x + bw * 0.35:.1f}" y="{h - bottom - 6}" font-size="12" fill="#c00" '
                f'text-anchor="middle">{html.escape(r["status"].upper())}</text>'
            )
        out.append(
            f'<text x="{x + bw * 0.35:.1f}" y="{h - bottom + 16}" font-size="11" text-anchor="middle">'
            f"{html.escape(r['label'])}</text>"
        )
    out.append(f'<line x1="{left}" y1="{h - bottom}" x2="{w - 10}" y2="{h - bottom}" stroke="#333"/>')
    out.append("</svg>")
    return "".join(out)


def _stacked(r: dict[str, Any]) -> tuple[str, ...]:
    """Categories drawn in the stack: on the CPU, `other` (libraries and the interpreter, hundreds of
    MiB) would flatten the tensors, so it is written above the bar instead."""
    return CATEGORIES if str(r.get("device", "")).startswith("cuda") else CATEGORIES[:-1]


def _memory_svg(rows: list[dict[str, Any]], w: int = 560, h: int = 300) -> str:
    top = max((sum((r.get("categories") or {}).get(c, 0) for c in _stacked(r)) for r in rows), default=0) or 1
    left, bottom, plot_h = 60, 60, h - 140
    bw = (w - left - 20) / max(1, len(rows))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img">']
    out.append(
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">memory at the peak step, by category</text>'
    )
    for j, c in enumerate(CATEGORIES):
        out.append(
            f'<rect x="{left + j * 98}" y="26" width="10" height="10" fill="{COLORS[c]}"/>'
            f'<text x="{left + j * 98 + 14}" y="35" font-size="10">{c.replace("_", " ")}</text>'
        )
    for i, r in enumerate(rows):
        x = left + i * bw + bw * 0.15
        y = float(h - bottom)
        cats = r.get("categories") or {}
        drawn = _stacked(r)
        for c in drawn:
            v = cats.get(c, 0)
            if v <= 0:
                continue
            bh = plot_h * v / top
            y -= bh
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw * 0.7:.1f}" height="{bh:.1f}" fill="{COLORS[c]}">'
                f"<title>{html.escape(r['label'])}: {c} {fmt_bytes(v)}</title></rect>"
            )
        cx = x + bw * 0.35
        if cats:
            out.append(
                f'<text x="{cx:.1f}" y="{y - 4:.1f}" font-size="11" text-anchor="middle">'
                f"{fmt_bytes(sum(cats.get(c, 0) for c in drawn))}</text>"
            )
            if "other" not in drawn:
                out.append(
                    f'<text x="{cx:.1f}" y="{y - 17:.1f}" font-size="10" fill="#777" text-anchor="middle">'
                    f"+ other {fmt_bytes(cats.get('other', 0))}</text>"
                )
        else:
            out.append(
                f'<text x="{cx:.1f}" y="{y - 6:.1f}" font-size="12" fill="#c00" text-anchor="middle">'
                f"{html.escape(r['status'].upper())}</text>"
            )
        out.append(
            f'<text x="{cx:.1f}" y="{h - bottom + 16}" font-size="11" text-anchor="middle">'
            f"{html.escape(r['label'])}</text>"
        )
    out.append(f'<line x1="{left}" y1="{h - bottom}" x2="{w - 10}" y2="{h - bottom}" stroke="#333"/>')
    note = "on the CPU, other (interpreter, libraries) is written above each bar, not drawn"
    if any("other" not in _stacked(r) for r in rows):
        out.append(f'<text x="{left}" y="{h - 12}" font-size="10" fill="#777">{note}</text>')
    out.append("</svg>")
    return "".join(out)


def to_html(doc: dict[str, Any]) -> str:
    rows = doc["rows"]
    best = doc.get("recommended_index")
    table_rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>"
            for v in (
                r["label"] + (" ★" if i == best else ""),
                r["status"],
                r["steps"],
                fmt_s(step_of(r)) if r["steps"] else "-",
                "–".join(fmt_s(v) for v in r.get("step_ci_s") or []) if r["steps"] else "-",
                f"{r['throughput']:.1f} {r['throughput_unit']}" if r["steps"] else "-",
                fmt_bytes(r["peak_bytes"]) if r["peak_bytes"] else "-",
                r["error"],
            )
        )
        + "</tr>"
        for i, r in enumerate(rows)
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>holoprof sweep</title>
<style>body{{font-family:sans-serif;margin:24px;color:#222}}td,th{{padding:4px 10px;border-bottom:1px solid #ddd;
text-align:left}}table{{border-collapse:collapse}}.plots{{display:flex;gap:24px;flex-wrap:wrap}}</style></head>
<body><h1>holoprof sweep</h1><p><code>{html.escape(" ".join(doc["command"]))}</code></p>
<div class="plots">{_bars_svg(rows, best)}{_memory_svg(rows)}</div>
<p><b>recommendation</b>: {html.escape(doc["reason"])}</p>
<table><tr><th>configuration</th><th>status</th><th>steps</th><th>step (steady mean)</th><th>95% CI</th><th>throughput</th>
<th>peak memory</th><th>error</th></tr>{table_rows}</table>
</body></html>
"""


def write_html(doc: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_html(doc))
