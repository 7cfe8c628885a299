"""Renders a ``holoprof.sweep/1`` document: a terminal table and a self-contained HTML plot.

The plot follows the TBD suite's figure: throughput per configuration as bars, and beside it the
peak memory of each configuration stacked by category. Drawn with uPlot by the views' shared chart
code (inline, nothing from the network), in the palette's colours; the table has every number.
"""

from __future__ import annotations

import html
from typing import IO, Any

from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from holoprof.analyze.sweep import step_of
from holoprof.present import charts, palette
from holoprof.present.terminal import fmt_bytes, fmt_s, keep_whole, make_console

CATEGORIES = ("weights", "gradients", "optimizer_state", "activations", "other")
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


# --- HTML ----------------------------------------------------------------------------------------------
def _stacked(r: dict[str, Any]) -> tuple[str, ...]:
    """Categories drawn in the stack: on the CPU, `other` (libraries and the interpreter, hundreds of
    MiB) would flatten the tensors, so it is written above the bar instead."""
    return CATEGORIES if str(r.get("device", "")).startswith("cuda") else CATEGORIES[:-1]


FAILED_COLOR = palette.SEVERITY_COLORS["high"]


def chart_data(doc: dict[str, Any]) -> dict[str, Any]:
    """What the page's charts draw: per configuration its throughput (the recommended one apart) and
    its memory at the peak step by category, and the text over each bar."""
    rows = doc["rows"]
    best = doc.get("recommended_index")
    unit = next((r["throughput_unit"] for r in rows if r["throughput"] > 0), "samples/s")
    failed = [{"text": r["status"].upper(), "color": FAILED_COLOR} for r in rows]

    def thr(pick: bool) -> list[float | None]:
        return [
            r["throughput"] if r["steps"] > 0 and (i == best) == pick else None for i, r in enumerate(rows)
        ]

    memory, mem_texts = [], []
    for c in CATEGORIES:
        values = [(r.get("categories") or {}).get(c) if c in _stacked(r) else None for r in rows]
        if any(v for v in values):
            memory.append({"label": c.replace("_", " "), "color": palette.MEMORY_COLORS[c], "values": values})
    for r, fail in zip(rows, failed, strict=True):
        cats = r.get("categories") or {}
        drawn = sum(cats.get(c, 0) for c in _stacked(r))
        other = f"+ other {fmt_bytes(cats.get('other', 0))}\n" if cats and "other" not in _stacked(r) else ""
        mem_texts.append({"text": other + fmt_bytes(drawn)} if cats else fail)
    return {
        "labels": [r["label"] for r in rows],
        "unit": unit,
        "throughput": [
            {"label": "throughput", "color": palette.SERIES_COLORS[0], "values": thr(False)},
            {"label": "recommended ★", "color": palette.PHASE_COLORS["optimizer"], "values": thr(True)},
        ],
        "throughput_texts": [{"text": _num(r["throughput"])} if r["steps"] > 0 else f for r, f in zip(rows, failed, strict=True)],
        "memory": memory,
        "memory_texts": mem_texts,
    }  # fmt: skip


DRAW_JS = """
(function () {
  var H = window.HoloViews, R = window.HOLOPROF_REPORT;
  if (!H || !window.uPlot) return;
  var t = document.querySelector("[data-chart=throughput]"), m = document.querySelector("[data-chart=memory]");
  H.draw(t, H.barSpec({ labels: R.labels, series: R.throughput, texts: R.throughput_texts, unit: "number",
    xLabel: "configuration", yLabel: "throughput (" + R.unit + ")", legend: true, width: t.clientWidth }), 300);
  if (m && R.memory.length) {
    H.draw(m, H.barSpec({ labels: R.labels, series: R.memory, texts: R.memory_texts, unit: "bytes", stacked: true,
      xLabel: "configuration", yLabel: "memory at the peak step", width: m.clientWidth }), 300);
  }
})();
"""

CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:24px;
color:#1d2433;font-size:14px}td,th{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left}
table{border-collapse:collapse}.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));
gap:24px;max-width:1280px}.plots>div{min-width:0}h2{font-size:15px;margin:0 0 6px}.muted{color:#6b7489;font-size:12px}
"""


def to_html(doc: dict[str, Any]) -> str:
    """The sweep as one self-contained page: throughput and memory per configuration (uPlot, inline),
    the recommendation and the table (readable without script)."""
    rows = doc["rows"]
    best = doc.get("recommended_index")
    cpu_other = any(r.get("categories") and "other" not in _stacked(r) for r in rows)
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
                *(fmt_bytes((r.get("categories") or {})[c]) if c in (r.get("categories") or {}) else "-" for c in CATEGORIES),
                r["error"],
            )
        )
        + "</tr>"
        for i, r in enumerate(rows)
    )  # fmt: skip
    cat_heads = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in CATEGORIES)
    note = (
        "<p class='muted'>on the CPU, other (interpreter, libraries) is written above each bar, not drawn</p>"
        if cpu_other
        else ""
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">{charts.csp_meta()}<title>holoprof sweep</title>
<style>{charts.styles()}{CSS}</style></head>
<body><h1>holoprof sweep</h1><p><code>{html.escape(" ".join(doc["command"]))}</code></p>
<div class="plots"><div><h2>Throughput</h2><div class="chart" data-chart="throughput"></div></div>
<div><h2>Memory at the peak step, by category</h2><div class="chart" data-chart="memory"></div>{note}</div></div>
<noscript><p class="muted">The charts need JavaScript; the table below does not.</p></noscript>
<p><b>recommendation</b>: {html.escape(doc["reason"])}</p>
<table><tr><th>configuration</th><th>status</th><th>steps</th><th>step (steady mean)</th><th>95% CI</th><th>throughput</th>
<th>peak memory</th>{cat_heads}<th>error</th></tr>{table_rows}</table>
<p class="muted">charts by uPlot (MIT)</p>
{charts.scripts(chart_data(doc), DRAW_JS)}</body></html>
"""


def write_html(doc: dict[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_html(doc))
