"""`holoprof iobench` rendered: a terminal table and a self-contained HTML chart of read bandwidth
(drawn with uPlot by the views' shared chart code, inline)."""

from __future__ import annotations

import html
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from holoprof.bench.iobench import IoBenchResult, fmt_bytes, fmt_rate
from holoprof.present import charts, palette
from holoprof.present.terminal import keep_whole


def render_terminal(result: IoBenchResult, console: Console) -> None:
    """A rich table of the rows, the recommendation and the warnings."""
    console.print(
        Text(
            f"iobench {result.path}: {result.files} file(s), {fmt_bytes(result.total_bytes)}",
            overflow="fold",
        )
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("threads", "procs", "block", "prefetch", "read", "s", "MB/s", "IOPS", "cache"):
        table.add_column(col, justify="left" if col == "cache" else "right", no_wrap=True)
    best = max((r.bandwidth_bytes_per_s for r in result.rows), default=0.0)
    for r in result.rows:
        style = "bold green" if r.bandwidth_bytes_per_s == best and best > 0 else None
        table.add_row(
            str(r.threads),
            str(r.processes),
            fmt_bytes(r.block_size),
            str(r.prefetch),
            fmt_bytes(r.bytes) + ("" if r.complete else "*"),
            f"{r.seconds:.3f}",
            f"{r.bandwidth_bytes_per_s / 1e6:,.1f}",
            f"{r.iops:,.0f}",
            r.cache,
            style=style,
        )
    console.print(keep_whole(table))
    rec = result.recommendation
    if rec is not None:
        console.print(
            Text("Recommendation:", style="bold"),
            Text(
                f"DataLoader(num_workers={rec.dataloader_num_workers}, "
                f"prefetch_factor={rec.dataloader_prefetch_factor}); "
                f"tf.data num_parallel_calls={rec.tf_num_parallel_calls}; read blocks of {fmt_bytes(rec.block_size)}."
            ),
        )
        console.print(Text(f"  why: {rec.reason}"))
    for w in result.warnings:
        console.print(Text("warning:", style="yellow"), Text(w))


def chart_data(result: IoBenchResult) -> dict[str, Any]:
    """What the chart draws: read bandwidth (MB/s, as the table) against readers, one line per block
    size, prefetch depth and processes."""
    readers = sorted({r.readers for r in result.rows})
    lines: dict[tuple[int, int, int], dict[int, float]] = {}
    for r in result.rows:
        lines.setdefault((r.block_size, r.prefetch, r.processes), {})[r.readers] = (
            r.bandwidth_bytes_per_s / 1e6
        )
    colors = palette.SERIES_COLORS
    return {
        "x": readers,
        "series": [
            {
                "label": f"block {fmt_bytes(key[0])}, prefetch {key[1]}, {key[2]} proc",
                "color": colors[i % len(colors)],
                "values": [pts.get(n) for n in readers],
            }
            for i, (key, pts) in enumerate(sorted(lines.items()))
        ],
    }


DRAW_JS = """
(function () {
  var H = window.HoloViews, R = window.HOLOPROF_REPORT, el = document.querySelector("[data-chart=iobench]");
  if (!H || !window.uPlot || !el) return;
  H.draw(el, H.lineSpec({ x: R.x, xTicks: R.x.map(String), xLabel: "readers (threads × processes)",
    series: R.series, unit: "number", yLabel: "bandwidth (MB/s)" }), 360);
})();
"""


def render_html(result: IoBenchResult) -> str:
    """A self-contained HTML page with the chart (uPlot and the views' chart code, inline; nothing from
    the network) and the table."""
    esc = html.escape
    rows_html = "\n".join(
        "<tr>"
        + "".join(
            f"<td>{esc(str(c))}</td>"
            for c in (
                r.threads,
                r.processes,
                fmt_bytes(r.block_size),
                r.prefetch,
                fmt_bytes(r.bytes) + ("" if r.complete else " (partial)"),
                f"{r.seconds:.3f}",
                fmt_rate(r.bandwidth_bytes_per_s),
                f"{r.iops:,.0f}",
                r.cache,
            )
        )
        + "</tr>"
        for r in result.rows
    )
    rec = result.recommendation
    rec_html = (
        "<p>No recommendation: nothing was read.</p>"
        if rec is None
        else (
            f"<p><b>Recommendation:</b> <code>DataLoader(num_workers={rec.dataloader_num_workers}, "
            f"prefetch_factor={rec.dataloader_prefetch_factor})</code>; tf.data "
            f"<code>num_parallel_calls={rec.tf_num_parallel_calls}</code>; blocks of "
            f"{esc(fmt_bytes(rec.block_size))}.<br>Why: {esc(rec.reason)}</p>"
        )
    )
    warn_html = "".join(f'<p class="warn">warning: {esc(w)}</p>' for w in result.warnings)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">{charts.csp_meta()}
<title>holoprof iobench: {esc(result.path)}</title>
<style>{charts.styles()}
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
.warn {{ color: #a60; }} .chart {{ max-width: 960px; }}
</style></head><body>
<h1>holoprof iobench</h1>
<p>{esc(result.path)}: {result.files} file(s), {esc(fmt_bytes(result.total_bytes))};
cache requested: {esc(result.cache_requested)}; at most {result.max_seconds:g} s per configuration.</p>
<h2>Read bandwidth against readers</h2>
<div class="chart" data-chart="iobench" role="img" aria-label="read bandwidth against readers"></div>
{rec_html}
{warn_html}
<table>
<tr><th>threads</th><th>processes</th><th>block</th><th>prefetch</th><th>read</th><th>seconds</th>
<th>bandwidth</th><th>IOPS</th><th>cache</th></tr>
{rows_html}
</table>
{charts.scripts(chart_data(result), DRAW_JS)}
</body></html>
"""
