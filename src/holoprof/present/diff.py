"""`holoprof diff` in the terminal: two runs side by side. Renders a ``holoprof.diff/1`` document."""

from __future__ import annotations

from typing import IO, Any

from rich import box
from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from holoprof.present.terminal import PHASE_COLORS, SEVERITY_COLORS, fmt_bytes, fmt_s, make_console
from holoprof.present.text import printable


def _change(c: float | None, higher_is_worse: bool = True) -> Text:
    if c is None:
        return Text("")
    worse = c > 0 if higher_is_worse else c < 0
    style = "red" if worse and abs(c) >= 0.01 else ("green" if abs(c) >= 0.01 else "dim")
    return Text(f"{100 * c:+.1f}%", style=style)


def _table(*cols: str) -> Table:
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column(cols[0])
    for c in cols[1:]:
        t.add_column(c, justify="right", no_wrap=True)
    return t


def _steps(d: dict[str, Any]) -> Group:
    a, b, st = d["a"], d["b"], d["steps"]
    t = _table("", "A", "B", "change")
    t.add_row("steps", str(a["steps"]), str(b["steps"]), "")
    t.add_row("median step", fmt_s(a["median_s"]), fmt_s(b["median_s"]), _change(st["median_change"]))
    t.add_row("p90 step", fmt_s(a["p90_s"]), fmt_s(b["p90_s"]), _change(st["p90_change"]))
    t.add_row("mean step", fmt_s(a["mean_s"]), fmt_s(b["mean_s"]), "")
    steady = d.get("steady") or {}
    if steady.get("mean_change") is not None:
        t.add_row(
            "steady mean step (first 2 left out)",
            fmt_s(steady.get("mean_a_s") or 0),
            fmt_s(steady.get("mean_b_s") or 0),
            _change(steady["mean_change"]),
        )
    thr = d["throughput"]
    t.add_row("steps/s", f"{thr['a'] or 0:.2f}", f"{thr['b'] or 0:.2f}", _change(thr["change"], False))
    t.add_row("run duration", fmt_s(a["duration_s"]), fmt_s(b["duration_s"]), "")
    style = (
        "bold red" if st["direction"] == "slower" else ("bold green" if st["direction"] == "faster" else "")
    )
    verdict = Text(st["verdict"], style=style)
    detail = ""
    if st.get("p_value") is not None:
        detail = (
            f"Mann-Whitney U test on the step times: U={st['u']:.0f}, z={st['z']:.2f}, p={st['p_value']:.3g}, "
            f"P(B step > A step)={st['prob_b_longer']:.2f}; significant = p < {st['alpha']} and a median "
            f"change of at least {100 * st['min_effect']:.0f}%"
        )
    parts: list[RenderableType] = [t, verdict, Text(detail, style="dim")]
    if steady.get("verdict") and steady.get("direction") != st["direction"]:
        # the medians and the throughput disagree: say both, the throughput last
        parts.append(Text(f"steady mean step (the throughput): {steady['verdict']}", style="bold"))
    return Group(*parts)


def _phases(d: dict[str, Any]) -> Table:
    t = _table("phase", "share A", "share B", "Δ share", "median A", "median B")
    for p, v in d["phases"].items():
        if not v["a"] and not v["b"]:
            continue
        delta = v["delta"]
        t.add_row(
            Text(p, style=PHASE_COLORS.get(p, "white")),
            f"{100 * v['a']:.1f}%",
            f"{100 * v['b']:.1f}%",
            Text(
                f"{100 * delta:+.1f} pt",
                style="red" if delta > 0.01 else ("green" if delta < -0.01 else "dim"),
            ),
            fmt_s(v["median_s_a"]),
            fmt_s(v["median_s_b"]),
        )
    return t


def _pairs(section: dict[str, Any], title: str) -> Table | None:
    if not section:
        return None
    t = _table(title, "A", "B", "change")
    for k, v in section.items():
        fmt = fmt_bytes if "bytes" in k else (lambda x: f"{x:,.0f}")
        a = "" if v["a"] is None else fmt(v["a"])
        b = "" if v["b"] is None else fmt(v["b"])
        t.add_row(k, a, b, _change(v["change"]))
    return t


def _findings(d: dict[str, Any]) -> Table | Text:
    if not d["findings"]:
        return Text("No findings in either run.", style="green")
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for c in ("finding", "A", "B", ""):
        t.add_column(c)
    for f in d["findings"]:
        status = {"new": Text("new in B", style="red"), "resolved": Text("gone in B", style="green")}.get(
            f["status"], Text("in both", style="dim")
        )
        t.add_row(
            f["id"],
            Text(f["a"] or "—", style=SEVERITY_COLORS.get(f["a"] or "", "dim")),
            Text(f["b"] or "—", style=SEVERITY_COLORS.get(f["b"] or "", "dim")),
            status,
        )
    return t


def render_diff(d: dict[str, Any], file: IO[str] | None = None, width: int | None = None) -> None:
    d = printable(d)
    console = make_console(file, width)
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    for side in ("a", "b"):
        run = d[side]
        head.add_row(side.upper(), Text(f"{run['dir']}  ({' '.join(run['command'])})", overflow="fold"))
    parts: list[Any] = [head, Text("")]
    parts += [Text("Steps", style="bold underline"), _steps(d), Text("")]
    parts += [Text("Phase shares", style="bold underline"), _phases(d), Text("")]
    for key, title in (("io", "I/O"), ("memory", "memory")):
        t = _pairs(d.get(key) or {}, title)
        if t is not None:
            parts += [Text(title, style="bold underline"), t, Text("")]
    stages = d.get("stages") or []
    if stages:
        t = _table("stage", "wall A", "wall B", "change")
        for s in stages:
            t.add_row(
                Text(str(s["name"])),
                "" if s["wall_s_a"] is None else fmt_s(s["wall_s_a"]),
                "" if s["wall_s_b"] is None else fmt_s(s["wall_s_b"]),
                _change(s["change"]),
            )
        parts += [Text("Stages", style="bold underline"), t, Text("")]
    parts += [Text("Findings", style="bold underline"), _findings(d)]
    console.print(Panel(Group(*parts), title="holoprof diff", title_align="left", border_style="blue"))
