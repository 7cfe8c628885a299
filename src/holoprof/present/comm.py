"""The communication block of the terminal report (renders the report's `communication` section)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from holoprof.present.summary import at_most, natural_key, top_rows, total
from holoprof.present.terminal import keep_whole


def _s(v: float) -> str:
    return f"{v * 1e3:.2f} ms" if v < 1 else f"{v:.2f} s"


def _bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"


def comm_group(doc: dict[str, Any]) -> Group | None:
    c = doc.get("communication") or {}
    if not c:
        return None
    parts: list[Any] = []
    if c.get("first_failure"):
        parts.append(Text(c["first_failure"]["message"], style="bold red"))
    if c.get("bytes_per_step") or c.get("total_s_per_step"):
        parts.append(
            Text(
                f"{_bytes(c.get('bytes_per_step', 0))} per step; communication {_s(c.get('total_s_per_step', 0))} "
                f"per step, {_s(c.get('overlapped_s_per_step', 0))} hidden behind compute, "
                f"{_s(c.get('exposed_s_per_step', 0))} exposed ({100 * c.get('exposed_fraction', 0):.1f}% of the step)"
            )
        )
    ranks = c.get("per_rank") or []
    if ranks:
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for col in ("rank", "steps", "step median", "p90", "comm/step", "exposed/step", "waits for others"):
            t.add_column(col, justify="right", no_wrap=True)
        shown, rest = top_rows(
            sorted(ranks, key=lambda r: natural_key(r["rank"])), lambda r: r["step_median_s"]
        )
        for r in shown:
            t.add_row(
                str(r["rank"]),
                str(r["steps"]),
                _s(r["step_median_s"]),
                _s(r["step_p90_s"]),
                _s(r["comm_s"]),
                _s(r["exposed_s"]),
                _s(r["wait_s"]),
            )
        if rest:  # the slowest ranks are shown; the rest in one row, each column's range
            t.add_row(
                Text(f"… {len(rest)} more", style="dim"),
                str(int(total(rest, "steps"))),
                *(
                    at_most(rest, k, _s)
                    for k in ("step_median_s", "step_p90_s", "comm_s", "exposed_s", "wait_s")
                ),
                style="dim",
            )
        parts.append(keep_whole(t))
        if rest:
            parts.append(Text("(the slowest ranks by step median; every rank is in --json)", style="dim"))
    colls = c.get("collectives") or []
    if colls:
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        for col in ("collective", "count", "bytes", "time"):
            if col == "collective":
                t.add_column(col, overflow="fold")
            else:
                t.add_column(col, justify="right", no_wrap=True)
        for x in colls[:8]:
            t.add_row(Text(str(x["op"])), str(x["count"]), _bytes(x["bytes"]), _s(x["total_s"]))
        parts.append(keep_whole(t))
    return Group(*parts) if parts else None
