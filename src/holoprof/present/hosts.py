"""Each host's resources (the report's ``resources.hosts`` and ``resources.host_spread``), for the
terminal and the HTML report; renders, computes nothing.

Shown for runs of two hosts or more. Up to :data:`MAX_HOSTS` hosts, every host in name order; beyond
that, the busiest and the idlest hosts (by the machine's CPU, else the job's), one row that gives the
range of the others, and a line per figure with the spread over all hosts (smallest, median,
largest, and where). The JSON report keeps every host. The terminal shows fewer columns (the
means, the CPU's 90th percentile and the memory peaks) than the HTML report.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from holoprof.present.summary import natural_key
from holoprof.present.terminal import fmt_bytes, keep_whole

#: The most host rows a table shows (the busiest half and the idlest half when there are more).
MAX_HOSTS = 8

#: (column, figure of resources.hosts, which statistic, format)
Fmt = Callable[[float], str]


def _pct(v: float) -> str:
    return f"{v:.0f}%"


def _rate(v: float) -> str:
    return fmt_bytes(v) + "/s"


COLUMNS: list[tuple[str, str, str, Fmt]] = [
    ("CPU mean", "cpu_percent", "mean", _pct),
    ("CPU p90", "cpu_percent", "p90", _pct),
    ("memory mean", "memory_used_bytes", "mean", fmt_bytes),
    ("memory peak", "memory_used_bytes", "max", fmt_bytes),
    ("net in mean", "net_recv_bytes_per_s", "mean", _rate),
    ("net in peak", "net_recv_bytes_per_s", "max", _rate),
    ("net out mean", "net_sent_bytes_per_s", "mean", _rate),
    ("net out peak", "net_sent_bytes_per_s", "max", _rate),
    ("job CPU", "job_cpu_percent", "mean", _pct),
    ("job RSS peak", "job_rss_bytes", "max", fmt_bytes),
    ("GPU util", "gpu_util_percent", "mean", _pct),
]
#: the terminal's columns (it is narrower): the means, the CPU's p90 and the memory peaks
TERMINAL_COLUMNS: list[tuple[str, str, str, Fmt]] = [
    ("CPU", "cpu_percent", "mean", _pct),
    ("CPU p90", "cpu_percent", "p90", _pct),
    ("mem peak", "memory_used_bytes", "max", fmt_bytes),
    ("net in", "net_recv_bytes_per_s", "mean", _rate),
    ("net out", "net_sent_bytes_per_s", "mean", _rate),
    ("job CPU", "job_cpu_percent", "mean", _pct),
    ("job RSS peak", "job_rss_bytes", "max", fmt_bytes),
    ("GPU", "gpu_util_percent", "mean", _pct),
]
#: what each figure of host_spread is called on its line
SPREAD_LABELS: dict[str, tuple[str, Fmt]] = {
    "cpu_percent": ("CPU (machine, 100% = all cores)", _pct),
    "memory_used_bytes": ("memory used", fmt_bytes),
    "net_recv_bytes_per_s": ("network in", _rate),
    "net_sent_bytes_per_s": ("network out", _rate),
    "job_cpu_percent": ("job CPU (100% = 1 core)", _pct),
    "job_rss_bytes": ("job RSS", fmt_bytes),
    "gpu_util_percent": ("GPU utilization", _pct),
}


def _value(h: dict[str, Any], key: str, stat: str) -> float | None:
    fig = h.get(key)
    return float(fig[stat]) if isinstance(fig, dict) and fig.get(stat) is not None else None


def _busy(h: dict[str, Any]) -> float:
    v = _value(h, "cpu_percent", "mean")
    return v if v is not None else (_value(h, "job_cpu_percent", "mean") or 0.0)


def host_table(
    doc: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """``(top, rest, bottom)``: the host rows to show above the summary row, the hosts that row
    stands for, and the rows to show below it. Every host (in name order) when they fit."""
    hosts = sorted((doc.get("resources") or {}).get("hosts") or [], key=lambda h: natural_key(h.get("host")))
    if len(hosts) <= MAX_HOSTS:
        return hosts, [], []
    by_busy = sorted(hosts, key=lambda h: -_busy(h))  # stable: ties in name order
    half = MAX_HOSTS // 2
    return by_busy[:half], by_busy[half:-half], by_busy[-half:]


def columns(
    hosts: list[dict[str, Any]], of: list[tuple[str, str, str, Fmt]] = COLUMNS
) -> list[tuple[str, str, str, Fmt]]:
    """The columns (of ``of``) some host has a figure for."""
    return [c for c in of if any(_value(h, c[1], c[2]) is not None for h in hosts)]


def ranks_text(ranks: list[int]) -> str:
    if not ranks:
        return "–"
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks[:4]) + (f" (+{len(ranks) - 4})" if len(ranks) > 4 else "")


def cell(h: dict[str, Any], key: str, stat: str, fmt: Fmt) -> str:
    v = _value(h, key, stat)
    return "–" if v is None else fmt(v)


def span(rest: list[dict[str, Any]], key: str, stat: str, fmt: Fmt) -> str:
    """The range of a column over the hosts of the summary row."""
    vs = [v for v in (_value(h, key, stat) for h in rest) if v is not None]
    if not vs:
        return "–"
    lo, hi = min(vs), max(vs)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)}"


def spread_lines(doc: dict[str, Any]) -> list[str]:
    """One line per figure: how the hosts' means spread (smallest, median, largest, which hosts)."""
    spread = (doc.get("resources") or {}).get("host_spread") or {}
    out = []
    for key, (label, fmt) in SPREAD_LABELS.items():
        s = spread.get(key)
        if s:
            out.append(
                f"{label}: {fmt(s['min'])} ({s['min_host']}) · median {fmt(s['median'])} · "
                f"{fmt(s['max'])} ({s['max_host']}) over {s['hosts']} hosts"
            )
    return out


def hosts_group(doc: dict[str, Any]) -> Group | None:
    """The terminal's per-host table (runs of two hosts or more)."""
    all_hosts = (doc.get("resources") or {}).get("hosts") or []
    if len(all_hosts) < 2:
        return None
    top, rest, bottom = host_table(doc)
    cols = columns(all_hosts, TERMINAL_COLUMNS)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("host", no_wrap=True)
    t.add_column("ranks", no_wrap=True)
    for name, *_ in cols:
        t.add_column(name, justify="right", no_wrap=True)
    for h in top:
        t.add_row(
            Text(str(h.get("host"))), ranks_text(h.get("ranks") or []), *(cell(h, *c[1:]) for c in cols)
        )
    if rest:  # their range is in the lines under the table (a range is too wide for a column)
        t.add_row(Text(f"… {len(rest)} more hosts", style="dim"), "", *("" for _ in cols), style="dim")
    for h in bottom:
        t.add_row(
            Text(str(h.get("host"))), ranks_text(h.get("ranks") or []), *(cell(h, *c[1:]) for c in cols)
        )
    parts: list[Any] = [keep_whole(t)]
    if rest:
        parts.append(Text("(the busiest and the idlest hosts by CPU; every host is in --json)", style="dim"))
        parts += [Text(line, style="dim") for line in spread_lines(doc)]
    return Group(*parts)


def hosts_html(doc: dict[str, Any]) -> str:
    """The HTML report's per-host section (runs of two hosts or more); "" otherwise."""
    all_hosts = (doc.get("resources") or {}).get("hosts") or []
    if len(all_hosts) < 2:
        return ""
    esc = html.escape
    top, rest, bottom = host_table(doc)
    cols = columns(all_hosts)

    def row(h: dict[str, Any]) -> str:
        return (
            f"<tr data-host='{esc(str(h.get('host')))}'><td class='mono'>{esc(str(h.get('host')))}</td>"
            f"<td>{esc(ranks_text(h.get('ranks') or []))}</td>"
            + "".join(f"<td class='num'>{esc(cell(h, *c[1:]))}</td>" for c in cols)
            + "</tr>"
        )

    body = "".join(row(h) for h in top)
    if rest:
        body += (
            f"<tr class='more'><td>… {len(rest)} more hosts</td><td></td>"
            + "".join(f"<td class='num'>{esc(span(rest, *c[1:]))}</td>" for c in cols)
            + "</tr>"
        )
    body += "".join(row(h) for h in bottom)
    head = "<th>host</th><th>ranks</th>" + "".join(f"<th class='num'>{esc(c[0])}</th>" for c in cols)
    notes = ""
    if rest:
        notes = (
            "<p class='muted'>the busiest and the idlest hosts by CPU; every host is in the JSON report</p>"
        )
        notes += "".join(f"<p class='muted spread'>{esc(line)}</p>" for line in spread_lines(doc))
    return (
        f"<section id='hosts'><h2>Resources per host ({len(all_hosts)} hosts)</h2>"
        "<p class='muted'>each host's launcher samples its machine (CPU: 100% = every core) and the job's "
        "processes on it (job CPU: 100% = one core); times are on the reference host's clock</p>"
        f"<table class='hosts'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{notes}</section>"
    )
