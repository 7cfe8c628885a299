"""The memory block of the terminal report (renders the report's `memory` section)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from holoprof.present.terminal import keep_whole

CATEGORY_COLORS = {
    "weights": "blue",
    "gradients": "magenta",
    "optimizer_state": "yellow",
    "activations": "green",
    "other": "grey50",
}


def _bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} TiB"


def memory_group(doc: dict[str, Any]) -> Group | None:
    m = doc.get("memory") or {}
    if not m or not m.get("categories"):
        return None
    cats: dict[str, float] = m["categories"]
    total = sum(cats.values()) or 1
    head = f"peak {_bytes(m.get('peak_bytes', 0))} on {m.get('device', '?')}"
    if m.get("step") is not None:
        head += f" at step {m['step']}" + (f" ({m['phase']})" if m.get("phase") else "")
    if m.get("limit_bytes"):
        head += f"; limit {_bytes(m['limit_bytes'])} ({m.get('limit_source', '')})"
    parts: list[Any] = [Text(head)]
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("category", no_wrap=True)
    t.add_column("bytes", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    t.add_column("", no_wrap=True, overflow="crop")
    for name, b in cats.items():
        color = CATEGORY_COLORS.get(name, "white")
        t.add_row(
            Text(name, style=color),
            _bytes(b),
            f"{100 * b / total:.1f}%",
            Text("█" * round(30 * b / total), style=color),
        )
    parts.append(keep_whole(t))
    if m.get("other_note"):
        parts.append(Text(m["other_note"], style="dim"))
    un = m.get("activations_unmeasured")
    if un:
        steps = ", ".join(str(s) for s in un["steps"][:8]) + (" ..." if len(un["steps"]) > 8 else "")
        parts.append(Text(f"activations not measured on step(s) {steps}: {un['why']}", style="yellow"))
    tu = m.get("tensors_unmeasured")
    if tu:
        parts.append(Text(f"some tensors not measured: {tu['why']}", style="yellow"))
    layers = m.get("per_layer") or []
    if layers:
        lt = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        lt.add_column("layer (largest first)", overflow="fold")
        lt.add_column("activations", justify="right", no_wrap=True)
        lt.add_column("parameters", justify="right", no_wrap=True)
        for row in layers[:8]:
            lt.add_row(
                Text(str(row["name"])), _bytes(row["activation_bytes"]), _bytes(row["parameter_bytes"])
            )
        parts.append(keep_whole(lt))
    return Group(*parts)
