"""The compute section (FLOPs, MFU, torch.compile) and the goodput table in the terminal report.
Renders the report document; computes nothing."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from holoprof.present.palette import fmt_flops, fmt_mfu
from holoprof.present.terminal import fmt_s, keep_whole


def compute_lines(c: dict[str, Any]) -> list[Text]:
    """The FLOPs and MFU in a few lines (the short report shows them too)."""
    if not c:
        return []
    if c.get("why"):
        return [Text(f"FLOPs not counted: {c['why']}", style="dim")]
    phases = ", ".join(f"{k} {fmt_flops(v)}" for k, v in (c.get("flops_by_phase") or {}).items() if v)
    lines = [
        Text(
            f"{fmt_flops(c.get('flops_per_step'))} per step ({phases or 'none'}; {c.get('dtype') or '?'}, "
            f"counted on step {c.get('counted_step')}) · achieved {fmt_flops(c.get('achieved_flops_per_s'), 'FLOP/s')} "
            f"over a mean step of {fmt_s(float(c.get('mean_step_s') or 0))}"
        )
    ]
    mfu = c.get("mfu")
    if mfu is not None:
        head = Text()
        head.append(f"MFU {fmt_mfu(float(mfu))}", style="bold")
        head.append(f" of {fmt_flops(c.get('peak_flops_per_s'), 'FLOP/s')} peak")
        lines.append(head)
    lines.append(Text(f"peak: {c.get('peak_source')}", style="dim", overflow="fold"))
    for n in c.get("notes") or []:
        lines.append(Text(n, style="yellow"))
    return lines


def compile_lines(comp: dict[str, Any]) -> list[Any]:
    """torch.compile: its time, graph breaks and recompilations."""
    if not comp:
        return []
    out: list[Any] = [
        Text(
            f"torch.compile: {fmt_s(float(comp.get('total_s') or 0))} compiling "
            f"({comp.get('compiles', 0)} compilations), {sum(int(g.get('count') or 0) for g in comp.get('graph_breaks') or [])} "
            f"graph breaks, {sum(int(r.get('count') or 0) for r in comp.get('recompiles') or [])} recompilations"
        )
    ]
    rows = [("graph break", g) for g in comp.get("graph_breaks") or []]
    rows += [("recompile", r) for r in comp.get("recompiles") or []]
    if rows:
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        t.add_column("what", no_wrap=True)
        t.add_column("count", justify="right", no_wrap=True)
        t.add_column("where", overflow="fold")
        t.add_column("reason", overflow="fold", ratio=1)
        for what, r in rows[:20]:
            t.add_row(
                what, str(r.get("count")), Text(str(r.get("location") or "?")), Text(str(r.get("reason")))
            )
        out.append(keep_whole(t))
    return out


def compute_group(doc: dict[str, Any]) -> Any:
    c = doc.get("compute") or {}
    parts: list[Any] = [*compute_lines(c), *compile_lines(c.get("compile") or {})]
    return Group(*parts) if parts else None


def goodput_group(doc: dict[str, Any]) -> Any:
    g = doc.get("goodput") or {}
    cats = g.get("categories") or {}
    wall = float(g.get("wall_s") or 0)
    if not cats or wall <= 0:
        return None
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("where the job's wall time went", no_wrap=True)
    t.add_column("time", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    for name, s in cats.items():
        if s <= 0:
            continue
        t.add_row(name, fmt_s(float(s)), f"{100 * float(s) / wall:.1f}%")
    t.add_row(Text("wall time", style="bold"), fmt_s(wall), "100.0%")
    head = Text()
    head.append(f"goodput {100 * float(g.get('fraction') or 0):.1f}%", style="bold")
    head.append(" (productive step compute / wall time)")
    parts: list[Any] = [head, keep_whole(t)]
    ranks = g.get("per_rank") or []
    if len(ranks) > 1:
        parts.append(
            Text(
                "per rank: "
                + ", ".join(
                    f"rank {r.get('rank')} {100 * float(r.get('fraction') or 0):.1f}%" for r in ranks[:16]
                )
                + (" …" if len(ranks) > 16 else ""),
                style="dim",
            )
        )
    return Group(*parts)
