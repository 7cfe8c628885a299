"""The workflow in the terminal: the stage tree with share bars, the critical path marked.

Renders the ``stages`` section of a ``holoprof.report/1`` document; computes nothing.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from holoprof.present.summary import at_most, collapse_ranks, more_label, top_rows, total, tree_parent
from holoprof.present.terminal import fmt_bytes, fmt_s, keep_whole

KIND_COLORS = {
    "train": "green",
    "evaluate": "bright_white",
    "checkpoint": "cyan",
    "prepare": "yellow",
    "other": "grey62",
}
CRITICAL_MARK = "◆"
BAR_WIDTH = 10


def _bar(share: float, critical: bool) -> Text:
    """The share in figures, then as a bar (cut first on a narrow terminal)."""
    n = share * BAR_WIDTH
    full = int(n)
    half = n - full >= 0.5
    t = Text(f"{100 * share:5.1f}% ", style="bold" if critical else "")
    t.append("█" * full + ("▌" if half else ""), style="red" if critical else "blue")
    return t


def _secs(s: float) -> str:
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 0.1 or s == 0:
        return f"{s:.2f} s"
    return fmt_s(s)


def _io(st: dict[str, Any]) -> str:
    total = float(st.get("read_bytes") or 0) + float(st.get("write_bytes") or 0)
    return fmt_bytes(total) if total else ""


def _prefixes(stages: list[dict[str, Any]]) -> list[str]:
    """Tree guides (├─ └─ │) from each stage's depth and its position among its siblings."""
    out: list[str] = []
    n = len(stages)
    for i, st in enumerate(stages):
        depth = int(st.get("depth", 0))
        if depth == 0:
            out.append("")
            continue
        parts = []
        for level in range(1, depth + 1):
            # is there a later stage at this level before the tree climbs above it?
            more = False
            for j in range(i + 1, n):
                d = int(stages[j].get("depth", 0))
                if d < level:
                    break
                if d == level:
                    more = True
                    break
            if level == depth:
                parts.append("├─ " if more else "└─ ")
            else:
                parts.append("│  " if more else "   ")
        out.append("".join(parts))
    return out


def stages_table(doc: dict[str, Any]) -> Table | None:
    stages = collapse_ranks(doc.get("stages") or [])
    if not stages:
        return None
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    t.add_column("stage", no_wrap=True, overflow="ellipsis", max_width=32)
    t.add_column("kind", no_wrap=True)
    for col in ("start", "wall"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("share", no_wrap=True, overflow="crop", min_width=6)
    for col in ("steps", "CPU", "max RSS", "I/O"):
        t.add_column(col, justify="right", no_wrap=True)
    shown, rest = top_rows(
        stages,
        lambda st: float(st.get("wall_s") or 0),
        parent=tree_parent([int(st.get("depth", 0)) for st in stages]),
    )
    for prefix, st in zip(_prefixes(shown), shown, strict=True):
        crit = bool(st.get("critical"))
        name = Text(prefix, style="dim")
        name.append(f"{CRITICAL_MARK} " if crit else "  ", style="bold red")
        name.append(str(st["name"]), style="bold" if crit else "")
        kind = str(st.get("kind", "other"))
        t.add_row(
            name,
            Text(kind, style=KIND_COLORS.get(kind, "white")),
            _secs(float(st.get("start_s", 0.0))),
            _secs(float(st.get("wall_s", 0.0))),
            _bar(float(st.get("share", 0.0)), crit),
            str(st.get("steps", 0) or ""),
            _secs(float(st["cpu_s"])) if st.get("cpu_s") else "",
            fmt_bytes(float(st["max_rss_bytes"])) if st.get("max_rss_bytes") else "",
            _io(st),
        )
    if rest:
        cpu, rss = total(rest, "cpu_s"), max(float(st.get("max_rss_bytes") or 0) for st in rest)
        t.add_row(
            Text(more_label(rest, "stages"), style="dim"),
            "",
            "",
            at_most(rest, "wall_s", _secs),
            "",
            str(int(total(rest, "steps")) or ""),
            _secs(cpu) if cpu else "",
            fmt_bytes(rss) if rss else "",
            _io({"read_bytes": total(rest, "read_bytes"), "write_bytes": total(rest, "write_bytes")}),
            style="dim",
        )
    return keep_whole(t)


def stages_group(doc: dict[str, Any]) -> Group | None:
    """The stage tree and a one-line legend, or None when the run has fewer than two stages (a
    single process is the whole report already)."""
    if len(doc.get("stages") or []) < 2:
        return None
    table = stages_table(doc)
    if table is None:
        return None
    path = [s["name"] for s in doc["stages"] if s.get("critical") and s.get("depth", 0) > 0]
    legend = Text(f"{CRITICAL_MARK} critical path", style="red")
    if path:
        legend.append(": " + " → ".join(str(p) for p in path), style="dim")
    return Group(table, legend)


def render_stages(doc: dict[str, Any], console: Console) -> None:
    """Print the workflow's stage tree (nothing when the run has fewer than two stages)."""
    group = stages_group(doc)
    if group is None:
        return
    console.print(Text("Workflow stages", style="bold underline"))
    console.print(group)
