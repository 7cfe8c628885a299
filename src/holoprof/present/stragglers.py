"""The ranks of a multi-rank job side by side (renders the report's ``stragglers`` section): a compact
table per rank for the terminal and the HTML report (its mean step, its busy time and how far that
exceeds the median rank's, split into compute / data wait / other, and the share of steps in which it
was the slowest), and the place of the rank × step heatmap (drawn by ``assets/charts.js`` from the
section's ``heatmap``). Nothing is shown for fewer than two ranks."""

from __future__ import annotations

import html
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from holoprof.present.palette import fmt_seconds
from holoprof.present.summary import MAX_ROWS, natural_key, top_rows
from holoprof.present.terminal import keep_whole

_PARTS = ("compute", "data_wait", "other")
#: The HTML report's table shows this many ranks at most (the heatmap above it shows every rank).
HTML_ROWS = 12


def _ranks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows = (doc.get("stragglers") or {}).get("per_rank") or []
    return rows if len(rows) >= 2 else []


def _signed(s: float) -> str:
    return ("+" if s > 0 else "−" if s < 0 else "") + fmt_seconds(abs(s))


def _cells(r: dict[str, Any]) -> list[str]:
    ex = r.get("excess_by_phase") or {}
    return [
        fmt_seconds(float(r.get("step_median_s") or 0)),
        fmt_seconds(float(r.get("busy_s") or 0)),
        _signed(float(r.get("excess_s") or 0)),
        *(_signed(float(ex.get(p) or 0)) for p in _PARTS),
        f"{100 * float(r.get('slowest_fraction') or 0):.0f}%",
    ]


_HEAD = ("median step", "busy", "excess", "compute", "data wait", "other", "slowest in")


def _shown(
    rows: list[dict[str, Any]], limit: int = MAX_ROWS
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ranks in rank order; of many, those of the largest excess."""
    ordered = sorted(rows, key=lambda r: natural_key(r["rank"]))
    return top_rows(ordered, lambda r: float(r.get("excess_s") or 0), limit)


def stragglers_group(doc: dict[str, Any]) -> Group | None:
    """The terminal's table of the ranks (None for fewer than two)."""
    rows = _ranks(doc)
    if not rows:
        return None
    s = doc["stragglers"]
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("rank", justify="right", no_wrap=True)
    for col in _HEAD:
        t.add_column(col, justify="right", no_wrap=True)
    shown, rest = _shown(rows)
    for r in shown:
        t.add_row(str(r["rank"]), *_cells(r))
    parts: list[Any] = [
        Text(
            f"over the {s.get('steps', 0)} steady steps every rank ran; busy: the step less its exposed "
            f"communication; excess: busy time above the median rank's (rank {s.get('median_rank')}), split "
            "into compute / data wait / other",
            style="dim",
        ),
        keep_whole(t),
    ]
    if rest:
        parts.append(
            Text(
                f"… and {len(rest)} more ranks (those of the largest excess are shown; all in --json)",
                style="dim",
            )
        )
    return Group(*parts)


def _esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def stragglers_html(doc: dict[str, Any]) -> str:
    """The HTML report's section: the heatmap's place and the table of the ranks ("" for fewer than
    two)."""
    rows = _ranks(doc)
    if not rows:
        return ""
    s = doc["stragglers"]
    heat = s.get("heatmap") or {}
    n = len(heat.get("steps") or [])
    binned = (
        f" Each column is the mean of {int(heat.get('bin_steps') or 1)} consecutive steps ({n} columns)."
        if heat.get("binned")
        else ""
    )
    shown, rest = _shown(rows, HTML_ROWS)
    hosts = len({r.get("host") for r in rows}) > 1
    trs = "".join(
        f"<tr><td>{_esc(r['rank'])}</td>"
        + (f"<td class='mono'>{_esc(r.get('host', ''))}</td>" if hosts else "")
        + "".join(f"<td>{_esc(c)}</td>" for c in _cells(r))
        + "</tr>"
        for r in shown
    )
    if rest:
        trs += (
            f"<tr><td colspan='{len(_HEAD) + 1 + hosts}' class='muted'>… and {len(rest)} more ranks "
            "(those of the largest excess are shown; every rank is in the JSON report)</td></tr>"
        )
    return (
        "<section id='stragglers'><h2>Ranks × steps</h2>"
        "<p class='muted'>One row per rank, one column per step; the colour is the step time, or the "
        "part of it chosen (a fast rank's exposed communication is mostly waiting for the slowest)."
        f"{binned}</p><div class='heatmap' data-chart='rank-heatmap'></div>"
        f"<p class='muted'>Over the {_esc(s.get('steps', 0))} steady steps every rank ran: busy is the "
        "step less its exposed communication; excess is busy time above the median rank's "
        f"(rank {_esc(s.get('median_rank'))}), split into compute, data wait and other.</p>"
        "<table class='ranks-table'><tr><th>rank</th>"
        + ("<th>host</th>" if hosts else "")
        + "".join(f"<th>{_esc(h)}</th>" for h in _HEAD)
        + "</tr>"
        + trs
        + "</table></section>"
    )
