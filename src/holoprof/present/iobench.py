"""`holoprof iobench` rendered: a terminal table and a self-contained HTML chart of read bandwidth."""

from __future__ import annotations

import html
import math

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from holoprof.bench.iobench import IoBenchResult, IoBenchRow, fmt_bytes, fmt_rate
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


_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def render_svg(result: IoBenchResult, width: int = 780, height: int = 420) -> str:
    """An SVG line chart: bandwidth against readers, one line per block size / prefetch / processes."""
    left, right, top, bottom = 80, 240, 40, 60
    pw, ph = width - left - right, height - top - bottom
    readers = sorted({r.readers for r in result.rows})
    ymax = max((r.bandwidth_bytes_per_s for r in result.rows), default=1.0) or 1.0
    ystep = _nice_step(ymax / 1e6 / 5)
    ytop = math.ceil(ymax / 1e6 / ystep) * ystep

    def x_of(n: int) -> float:
        if len(readers) == 1:
            return left + pw / 2
        return left + pw * readers.index(n) / (len(readers) - 1)

    def y_of(bps: float) -> float:
        return top + ph - ph * (bps / 1e6) / ytop

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<text x="{left}" y="22" font-size="14" font-weight="bold">Read bandwidth against readers</text>',
    ]
    v = 0.0
    while v <= ytop + 1e-9:
        y = y_of(v * 1e6)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
        v += ystep
    for n in readers:
        x = x_of(n)
        out.append(f'<line x1="{x:.1f}" y1="{top + ph}" x2="{x:.1f}" y2="{top + ph + 5}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{top + ph + 20}" text-anchor="middle">{n}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 15}" text-anchor="middle">readers (threads × processes)</text>'
    )
    out.append(
        f'<text transform="translate(20 {top + ph / 2}) rotate(-90)" text-anchor="middle">bandwidth (MB/s)</text>'
    )
    series: dict[tuple[int, int, int], list[IoBenchRow]] = {}
    for r in result.rows:
        series.setdefault((r.block_size, r.prefetch, r.processes), []).append(r)
    for i, (key, rows) in enumerate(sorted(series.items())):
        color = _PALETTE[i % len(_PALETTE)]
        pts = sorted(rows, key=lambda r: r.readers)
        path = " ".join(f"{x_of(r.readers):.1f},{y_of(r.bandwidth_bytes_per_s):.1f}" for r in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for r in pts:
            tip = html.escape(
                f"{r.threads} threads × {r.processes} processes, block {fmt_bytes(r.block_size)}, "
                f"prefetch {r.prefetch}: {fmt_rate(r.bandwidth_bytes_per_s)}, {r.iops:,.0f} IOPS ({r.cache})"
            )
            out.append(
                f'<circle cx="{x_of(r.readers):.1f}" cy="{y_of(r.bandwidth_bytes_per_s):.1f}" r="4" '
                f'fill="{color}"><title>{tip}</title></circle>'
            )
        ly = top + 10 + 18 * i
        label = html.escape(f"block {fmt_bytes(key[0])}, prefetch {key[1]}, {key[2]} proc")
        out.append(
            f'<line x1="{left + pw + 12}" y1="{ly}" x2="{left + pw + 32}" y2="{ly}" stroke="{color}" stroke-width="2"/>'
        )
        out.append(f'<text x="{left + pw + 36}" y="{ly + 4}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def render_html(result: IoBenchResult) -> str:
    """A self-contained HTML page (inline SVG, no scripts, no network) with the chart and the table."""
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
<html lang="en"><head><meta charset="utf-8">
<title>holoprof iobench: {esc(result.path)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
.warn {{ color: #a60; }}
</style></head><body>
<h1>holoprof iobench</h1>
<p>{esc(result.path)}: {result.files} file(s), {esc(fmt_bytes(result.total_bytes))};
cache requested: {esc(result.cache_requested)}; at most {result.max_seconds:g} s per configuration.</p>
{render_svg(result)}
{rec_html}
{warn_html}
<table>
<tr><th>threads</th><th>processes</th><th>block</th><th>prefetch</th><th>read</th><th>seconds</th>
<th>bandwidth</th><th>IOPS</th><th>cache</th></tr>
{rows_html}
</table>
</body></html>
"""
