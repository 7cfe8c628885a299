"""``holoprof whatif RUN``: predicted data-parallel scaling as a table, JSON, or a self-contained plot
(an HTML page drawn with uPlot by the views' shared chart code, inline).

Renders :class:`holoprof.analyze.whatif.WhatIf`; the numbers come from the analysis.
"""

from __future__ import annotations

import html
from typing import IO, Any

from rich import box
from rich.table import Table
from rich.text import Text

from holoprof.analyze import whatif as wi
from holoprof.present import charts, palette
from holoprof.present.terminal import make_console


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.3f} s"


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"


def render(r: wi.WhatIf, file: IO[str] | None = None) -> None:
    con = make_console(file)
    bs = f", batch {r.batch_size} per worker" if r.batch_size else ""
    con.print(Text("what-if: data parallelism", style="bold"), Text(f"from {r.run}"))
    con.print(
        f"measured: step {_fmt_s(r.step_s)}, backward {_fmt_s(r.backward_s)}, gradients "
        f"{_fmt_bytes(r.grad_bytes)} in {r.params} tensors{bs}; {len(r.buckets)} bucket(s) of at most "
        f"{r.bucket_mb:g} MB; latency {r.latency_s * 1e6:.0f} µs"
    )
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for c in ("workers", "bandwidth", "step", "allreduce", "exposed", "throughput", "speedup", "eff."):
        t.add_column(c, justify="right", no_wrap=True)
    t.add_row("1", "-", _fmt_s(r.step_s), "-", "-", _thr(r, r.step_s, 1), "1.00x", "100%")
    for p in r.predictions:
        if p.workers == 1:
            continue
        t.add_row(
            str(p.workers),
            p.bandwidth,
            _fmt_s(p.step_s),
            _fmt_s(p.comm_s),
            _fmt_s(p.exposed_comm_s),
            f"{p.throughput:.1f} {p.throughput_unit.replace('samples', 'smp')}",
            f"{p.speedup:.2f}x",
            f"{100 * p.scaling_efficiency:.0f}%",
        )
    con.print(t)
    if r.min_bandwidth:
        m = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title="bandwidth needed")
        m.add_column("workers", justify="right")
        m.add_column("to beat 1 worker", justify="right")
        m.add_column("for 90% efficiency", justify="right")
        for mb in r.min_bandwidth:
            m.add_row(str(mb.workers), mb.beats_one, mb.efficiency_90)
        con.print(m)


def _thr(r: wi.WhatIf, step: float, n: int) -> str:
    if r.batch_size:
        return f"{n * r.batch_size / step:.1f} smp/s"
    return f"{1 / step:.1f} steps/s"


def chart_data(r: wi.WhatIf) -> dict[str, Any]:
    """What the plot draws: throughput against bandwidth per worker (log scale), one line per worker
    count, one worker as a dashed baseline."""
    bws = sorted({p.bandwidth_bytes_per_s for p in r.predictions})
    by_workers: dict[int, dict[float, float]] = {}
    for p in r.predictions:
        if p.workers != 1:
            by_workers.setdefault(p.workers, {})[p.bandwidth_bytes_per_s] = p.throughput
    base = (r.batch_size / r.step_s) if r.batch_size else 1 / r.step_s
    colors = palette.SERIES_COLORS
    series = [{"label": "1 worker", "color": "#1d2433", "dash": [6, 4], "values": [base for _ in bws]}]
    series += [
        {"label": f"{n} workers", "color": colors[i % len(colors)], "values": [pts.get(bw) for bw in bws]}
        for i, (n, pts) in enumerate(sorted(by_workers.items()))
    ]
    return {
        "x": bws,
        "x_ticks": [wi.format_bandwidth(bw) for bw in bws],
        "unit": "samples/s" if r.batch_size else "steps/s",
        "series": series,
    }


DRAW_JS = """
(function () {
  var H = window.HoloViews, R = window.HOLOPROF_REPORT, el = document.querySelector("[data-chart=whatif]");
  if (!H || !window.uPlot || !el) return;
  H.draw(el, H.lineSpec({ x: R.x, xTicks: R.x_ticks, log: R.x.length > 1, xLabel: "bandwidth per worker",
    series: R.series, unit: "number", yLabel: "throughput (" + R.unit + ")" }), 360);
})();
"""


def render_html(r: wi.WhatIf) -> str:
    rows = "".join(
        f"<tr><td>{p.workers}</td><td>{html.escape(p.bandwidth)}</td><td>{_fmt_s(p.step_s)}</td>"
        f"<td>{_fmt_s(p.exposed_comm_s)}</td><td>{p.throughput:.1f} {p.throughput_unit}</td>"
        f"<td>{100 * p.scaling_efficiency:.0f}%</td></tr>"
        for p in r.predictions
    )
    mins = "".join(
        f"<li>{m.workers} workers beat one above {html.escape(m.beats_one)}; 90% efficiency from "
        f"{html.escape(m.efficiency_90)}</li>"
        for m in r.min_bandwidth
    )
    assumptions = "".join(f"<li>{html.escape(a)}</li>" for a in r.assumptions)
    return (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{charts.csp_meta()}"
        f"<title>holoprof what-if</title><style>{charts.styles()}"
        "body{font-family:sans-serif;margin:2em;color:#1d2433}table{border-collapse:collapse}"
        "td,th{padding:2px 10px;border-bottom:1px solid #ddd;text-align:right}.chart{max-width:960px}</style></head><body>"
        f"<h1>What-if: data parallelism</h1><p>from {html.escape(r.run)}: step {_fmt_s(r.step_s)}, "
        f"backward {_fmt_s(r.backward_s)}, gradients {_fmt_bytes(r.grad_bytes)}, {len(r.buckets)} bucket(s), "
        f"latency {r.latency_s * 1e6:.0f} µs</p>"
        "<div class='chart' data-chart='whatif' role='img' aria-label='throughput against bandwidth'></div>"
        f"<ul>{mins}</ul>"
        "<table><tr><th>workers</th><th>bandwidth</th><th>step</th><th>exposed</th><th>throughput</th>"
        f"<th>efficiency</th></tr>{rows}</table><h2>Assumptions</h2><ul>{assumptions}</ul>"
        f"{charts.scripts(chart_data(r), DRAW_JS)}</body></html>\n"
    )
