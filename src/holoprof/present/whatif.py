"""``holoprof whatif RUN``: predicted data-parallel scaling as a table, JSON, or a self-contained plot.

Renders :class:`holoprof.analyze.whatif.WhatIf`; the numbers come from the analysis.
"""

from __future__ import annotations

import html
import math
from typing import IO

from rich import box
from rich.table import Table
from rich.text import Text

from holoprof.analyze import whatif as wi
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


_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


def render_svg(r: wi.WhatIf, width: int = 720, height: int = 420) -> str:
    """Throughput against bandwidth (log scale), one line per worker count, 1 worker as a baseline."""
    left, right, top, bottom = 70, 150, 30, 50
    pw, ph = width - left - right, height - top - bottom
    bws = sorted({p.bandwidth_bytes_per_s for p in r.predictions})
    series: dict[int, list[tuple[float, float]]] = {}
    for p in r.predictions:
        series.setdefault(p.workers, []).append((p.bandwidth_bytes_per_s, p.throughput))
    base = (r.batch_size / r.step_s) if r.batch_size else 1 / r.step_s
    ymax = max([base, *(y for pts in series.values() for _, y in pts)]) * 1.1 or 1.0
    lo, hi = (math.log10(bws[0]), math.log10(bws[-1])) if bws else (0.0, 1.0)
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5

    def x(bw: float) -> float:
        return left + (math.log10(bw) - lo) / (hi - lo) * pw

    def y(v: float) -> float:
        return top + ph - v / ymax * ph

    unit = "samples/s" if r.batch_size else "steps/s"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>',
        f'<text x="{left + pw / 2}" y="{height - 10}" text-anchor="middle">bandwidth per worker (log)</text>',
        f'<text x="15" y="{top + ph / 2}" transform="rotate(-90 15 {top + ph / 2})" text-anchor="middle">'
        f"throughput ({unit})</text>",
    ]
    for bw in bws:
        out.append(
            f'<text x="{x(bw):.1f}" y="{top + ph + 16}" text-anchor="middle">'
            f"{html.escape(wi.format_bandwidth(bw))}</text>"
        )
    for i in range(5):
        v = ymax * i / 4
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>')
    out.append(
        f'<line x1="{left}" x2="{left + pw}" y1="{y(base):.1f}" y2="{y(base):.1f}" stroke="#000" '
        'stroke-dasharray="4 3"/>'
    )
    out.append(f'<text x="{left + pw + 8}" y="{y(base) + 4:.1f}">1 worker</text>')
    for i, (n, pts) in enumerate(sorted(series.items())):
        color = _COLORS[i % len(_COLORS)]
        pts.sort()
        path = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for a, b in pts:
            out.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{color}"/>')
        out.append(f'<text x="{left + pw + 8}" y="{top + 14 + 16 * i}" fill="{color}">{n} workers</text>')
    out.append("</svg>")
    return "\n".join(out)


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
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>holoprof what-if</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{padding:2px 10px;border-bottom:1px solid #ddd;text-align:right}</style></head><body>"
        f"<h1>What-if: data parallelism</h1><p>from {html.escape(r.run)}: step {_fmt_s(r.step_s)}, "
        f"backward {_fmt_s(r.backward_s)}, gradients {_fmt_bytes(r.grad_bytes)}, {len(r.buckets)} bucket(s), "
        f"latency {r.latency_s * 1e6:.0f} µs</p>"
        f"{render_svg(r)}<ul>{mins}</ul>"
        "<table><tr><th>workers</th><th>bandwidth</th><th>step</th><th>exposed</th><th>throughput</th>"
        f"<th>efficiency</th></tr>{rows}</table><h2>Assumptions</h2><ul>{assumptions}</ul></body></html>\n"
    )
