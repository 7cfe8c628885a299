"""The terminal report (rich). Renders a ``holoprof.report/1`` document; computes nothing.

Text from the job (paths, commands, names, finding texts) is data: it goes to rich as ``Text`` or
through a console made by :func:`make_console`, which reads no markup, so ``[/x]`` in a path is
printed as it is. The report follows the terminal's width (``COLUMNS`` included); numbers are never
cut, paths are folded or shortened in the middle.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import IO, Any

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from holoprof.analyze.findings import gain_label
from holoprof.present.palette import evidence_label, evidence_value
from holoprof.present.summary import top_rows
from holoprof.present.text import printable

PHASE_COLORS = {
    "data_wait": "red",
    "forward": "green",
    "backward": "blue",
    "optimizer": "magenta",
    "compute": "bright_green",
    "compile": "bright_red",
    "communication": "yellow",
    "checkpoint": "cyan",
    "eval": "bright_white",
    "other": "grey50",
}
SEVERITY_COLORS = {"high": "bold red", "medium": "yellow", "low": "cyan"}
_SPARK = "▁▂▃▄▅▆▇█"


#: The width of a report written to a file or a pipe when COLUMNS does not say.
DEFAULT_WIDTH = 110


def make_console(file: IO[str] | None = None, width: int | None = None) -> Console:
    """A console for reports on ``file`` (stdout by default): markup and highlighting off (the text
    it prints is data), ``width`` columns, or else the terminal's width (``COLUMNS`` wins), or
    :data:`DEFAULT_WIDTH` on a file or pipe."""
    out = file or sys.stdout
    if width is None and not os.environ.get("COLUMNS", "").strip().isdigit():
        isatty = getattr(out, "isatty", None)
        try:
            tty = bool(isatty and isatty())
        except (OSError, ValueError):
            tty = False
        if not tty:
            width = DEFAULT_WIDTH
    return Console(file=out, width=width, markup=False, highlight=False, emoji=False, soft_wrap=False)


def middle_ellipsis(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, its middle replaced by "…" when too long (both ends
    of a path say the most: the mount point and the file name)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def keep_whole(table: Table) -> Table:
    """``table`` with every column that is not to be wrapped (``no_wrap``: numbers, short labels) as
    wide as its widest cell, so that a narrow terminal folds the other columns (paths, names) rather
    than cutting a number to "43…". Columns that may be shortened say so: a ``max_width``, or
    ``overflow="crop"`` (bars and sparklines)."""
    for column in table.columns:
        if column.no_wrap and column.max_width is None and column.overflow != "crop":
            cells = [column.header, *column.cells]
            column.min_width = max(
                (
                    c.cell_len if isinstance(c, Text) else cell_len(c)
                    for c in cells
                    if isinstance(c, (str, Text))
                ),
                default=0,
            )
    return table


class NamedRows:
    """A table of rows that each start with a long name (a path, a command) followed by numbers.

    Where the terminal is wide enough, one table with the name first (folded over lines when long);
    where it is not, the numbers keep their columns and the names move under the table, numbered.
    Numbers are never cut."""

    def __init__(self, name: str, columns: list[str], rows: list[tuple[Text | str, list[str]]]) -> None:
        self.name, self.columns, self.rows = name, columns, rows

    def _table(self, first: str | None) -> Table:
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        if first is not None:
            t.add_column(first, overflow="fold", ratio=1)
        for c in self.columns:
            t.add_column(c, justify="right", no_wrap=True)
        return t

    def __rich_console__(self, console: Console, options: Any) -> Any:
        numbers = self._table(None)
        for _, cells in self.rows:
            numbers.add_row(*cells)
        keep_whole(numbers)
        need = sum(c.min_width or 0 for c in numbers.columns) + 2 * len(self.columns)
        if options.max_width - need >= 24:
            t = self._table(self.name)
            for name, cells in self.rows:
                t.add_row(name if isinstance(name, Text) else Text(name, overflow="fold"), *cells)
            yield keep_whole(t)
            return
        t = self._table("#")
        t.padding, t.collapse_padding = (0, 1), True
        for i, (_, cells) in enumerate(self.rows, 1):
            t.add_row(str(i), *cells)
        yield keep_whole(t)
        names = Table.grid(padding=(0, 1))
        names.add_column(justify="right", no_wrap=True, style="dim")
        names.add_column(overflow="fold")
        for i, (name, _) in enumerate(self.rows, 1):
            names.add_row(str(i), name if isinstance(name, Text) else Text(name))
        yield names


def fmt_s(s: float) -> str:
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.0f} µs"


def fmt_phase_per_step(v: dict[str, Any], fmt: Callable[[float], str] = fmt_s) -> str:
    """A phase's time per step: its median, or, for a phase that occurs in a few steps only (eval,
    checkpoint: a median of 0), its time per step where it occurs and in how many steps."""
    n = int(v.get("steps") or 0)
    if float(v.get("median_s") or 0) <= 0 < float(v.get("total_s") or 0) and n:
        return f"{fmt(float(v.get('per_occurrence_s') or 0))} in {n} step{'' if n == 1 else 's'}"
    return fmt(float(v.get("median_s") or 0))


def fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} TiB"


def sparkline(values: list[float], width: int = 60) -> str:
    if not values:
        return ""
    if len(values) > width:
        k = len(values) / width
        values = [max(values[int(i * k) : max(int(i * k) + 1, int((i + 1) * k))]) for i in range(width)]
    lo, hi = min(values), max(values)
    span = hi - lo
    return "".join(_SPARK[0 if span <= 0 else min(7, int((v - lo) / span * 7.999))] for v in values)


def _phase_bar(phases: dict[str, Any], width: int = 60) -> Text:
    bar = Text()
    used = 0
    items = [(p, v["fraction"]) for p, v in phases.items() if v["fraction"] > 0]
    for i, (p, f) in enumerate(items):
        n = width - used if i == len(items) - 1 else round(f * width)
        n = max(0, min(n, width - used))
        bar.append("█" * n, style=PHASE_COLORS.get(p, "white"))
        used += n
    return bar


def _header(doc: dict[str, Any]) -> Table:
    run = doc["run"]
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    status = run["status"]
    style = {"finished": "green", "crashed": "bold red", "running": "yellow"}.get(status, "white")
    cmd = " ".join(run.get("command") or [])
    t.add_row("run", Text(str(run["dir"]), overflow="fold"))
    if cmd:
        t.add_row("command", Text(cmd, overflow="fold"))
    knobs = run.get("knobs") or {}
    if knobs:
        t.add_row(
            "knobs",
            Text(", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in knobs.items())),
        )
    code = run.get("exit_code")
    t.add_row(
        "status",
        Text(status + (f" (exit {code})" if code not in (None, 0) else ""), style=style),
    )
    t.add_row(
        "duration",
        Text(
            f"{fmt_s(run['duration_s'])}  ·  {run['processes']} process{'' if run['processes'] == 1 else 'es'} ({run['traced_processes']} traced)"
            + (f"  ·  {run['ranks']} ranks" if run["ranks"] else "")
        ),
    )
    clocks = run.get("host_clocks") or []
    if len(clocks) > 1:
        t.add_row("hosts", Text("\n".join(host_clock_lines(clocks)), overflow="fold"))
    return t


#: The most lines the hosts' clocks take in a report's header.
MAX_CLOCK_LINES = 8


def host_clock_lines(clocks: list[dict[str, Any]], limit: int = MAX_CLOCK_LINES) -> list[str]:
    """A line per host of ``run.host_clocks``; with more hosts than ``limit``, the reference host and
    the hosts whose clocks are furthest off (or unknown), in their order, then "… and N more"."""
    if len(clocks) <= limit:
        return [host_clock_text(h) for h in clocks]

    def cost(h: dict[str, Any]) -> float:
        if h.get("clock_source") == "reference":
            return float("inf")
        if h.get("clock_uncertainty_s") is None:
            return 1e9  # not aligned: worth a line
        return abs(float(h.get("clock_offset_s") or 0))

    shown, rest = top_rows(clocks, cost, limit)
    within = ""
    if all(h.get("clock_uncertainty_s") is not None for h in rest):
        off = max(abs(float(h.get("clock_offset_s") or 0)) for h in rest)
        within = f", clocks within {fmt_offset(off)} of the reference"
    return [host_clock_text(h) for h in shown] + [
        f"… and {len(rest)} more hosts{within} (every host in --json)"
    ]


def fmt_offset(s: float) -> str:
    """A clock offset or uncertainty in s, ms or µs."""
    a = abs(s)
    if a >= 1:
        return f"{s:.3f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def host_clock_text(h: dict[str, Any]) -> str:
    """One host of ``run.host_clocks``: its ranks and how its clock was aligned."""
    ranks = h.get("ranks") or []
    which = (
        f"ranks {ranks[0]}-{ranks[-1]}"
        if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1))
        else (
            f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)}" if ranks else "no rank"
        )
    )
    source, unc = h.get("clock_source"), h.get("clock_uncertainty_s")
    if source == "reference":
        clock = "reference clock"
    elif unc is None:
        clock = "clock offset unknown (as recorded)"
    else:
        off = float(h.get("clock_offset_s") or 0)
        basis = "collectives" if source == "collectives" else "file-server readings"
        clock = f"clock {'+' if off >= 0 else '-'}{fmt_offset(abs(off))} ± {fmt_offset(unc)} ({h.get('clock_samples')} {basis})"
    return f"{printable(str(h.get('host')))} ({which}, {clock})"


def _steps(doc: dict[str, Any]) -> Table | Text:
    st = doc["steps"]
    if not st["count"]:
        return Text(
            "No training steps detected. Steps come from optimizer.step() (PyTorch); for other loops call "
            "holoprof.step() once per iteration.",
            style="yellow",
        )
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for c in ("steps", "median", "p90", "steps/s", "epochs"):
        t.add_column(c, justify="right", no_wrap=True)
    t.add_row(
        str(st["count"]),
        fmt_s(st["median_s"]),
        fmt_s(st["p90_s"]),
        f"{st['per_s']:.2f}",
        "unknown" if st.get("epochs") is None else str(st["epochs"]),
    )
    return keep_whole(t)


def _phases(doc: dict[str, Any], width: int = 60) -> Group:
    phases = doc["phases"]
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("phase", no_wrap=True)
    for c in ("share", "median/step", "total"):
        t.add_column(c, justify="right", no_wrap=True)
    t.add_column("", overflow="crop", no_wrap=True)
    for p, v in phases.items():
        if v["fraction"] <= 0 and v["total_s"] <= 0:
            continue
        n = round(v["fraction"] * min(30, width // 2))
        t.add_row(
            Text(p, style=PHASE_COLORS.get(p, "white")),
            f"{100 * v['fraction']:.1f}%",
            fmt_phase_per_step(v),
            fmt_s(v["total_s"]),
            Text("█" * n, style=PHASE_COLORS.get(p, "white")),
        )
    keep_whole(t)
    parts: list[Any] = [_phase_bar(phases, width), t]
    tl = doc["steps"].get("timeline") or []
    if len(tl) > 1:
        spark = sparkline([r["step_s"] for r in tl], max(10, width - 24))
        parts.append(Text(f"step time over the run  {spark}", style="dim"))
    out = doc.get("outside_steps") or {}
    if out.get("total_s", 0) > 0:
        items = ", ".join(f"{k} {fmt_s(v)}" for k, v in out["phases"].items() if v > 0)
        parts.append(Text(f"outside training steps: {items}", style="dim"))
    return Group(*parts)


def _resources(doc: dict[str, Any]) -> Table | None:
    s = doc["resources"]["summary"]
    series = doc["resources"]["series"]
    if not s:
        return None
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("resource")
    t.add_column("mean", justify="right", no_wrap=True)
    t.add_column("max", justify="right", no_wrap=True)
    t.add_column("over time", no_wrap=True, overflow="crop")

    hosts = int((doc["resources"].get("hosts_combined") or {}).get("hosts") or 0)

    def row(label: str, key: str, fmt: Any) -> None:
        if hosts >= 2:  # say how the hosts are combined: the job's total, a machine's mean
            how = f"sum of {hosts} hosts" if key.startswith("job.") else f"mean of {hosts} hosts"
            label = f"{label[:-1]}, {how})" if label.endswith(")") else f"{label} ({how})"
        if key in s:
            spark = sparkline([v for _, v in series.get(key, [])], 40)
            t.add_row(label, fmt(s[key]["mean"]), fmt(s[key]["max"]), Text(spark, style="cyan"))

    row("CPU (job, 100% = 1 core)", "job.cpu_percent", lambda v: f"{v:.0f}%")
    row("memory RSS (job)", "job.rss_bytes", fmt_bytes)
    row("disk read", "job.read_bytes_per_s", lambda v: fmt_bytes(v) + "/s")
    row("disk write", "job.write_bytes_per_s", lambda v: fmt_bytes(v) + "/s")
    row("network in (host)", "host.net_recv_bytes_per_s", lambda v: fmt_bytes(v) + "/s")
    row("network out (host)", "host.net_sent_bytes_per_s", lambda v: fmt_bytes(v) + "/s")
    for g in doc["run"].get("gpus", []):
        row(f"GPU {g} utilization", f"gpu.{g}.util_percent", lambda v: f"{v:.0f}%")
        row(f"GPU {g} memory", f"gpu.{g}.mem_used_bytes", fmt_bytes)
        row(f"GPU {g} power", f"gpu.{g}.power_w", lambda v: f"{v:.0f} W")
    return keep_whole(t)


def _findings(doc: dict[str, Any]) -> Group:
    items: list[Any] = []
    if not doc["findings"]:
        items.append(Text("No findings: nothing crossed a threshold.", style="green"))
    for f in doc["findings"]:
        head = Text()
        head.append(f"[{f['severity']}] ", style=SEVERITY_COLORS.get(f["severity"], "white"))
        head.append(f["title"], style="bold")
        gain = gain_label(f)
        if gain:
            head.append(f"  ({gain})", style="dim")
        scalars = {k: v for k, v in f["evidence"].items() if not isinstance(v, (dict, list))}
        nested = [k for k, v in f["evidence"].items() if isinstance(v, (dict, list))]
        # named numbers with their units, as the HTML report and the dashboard write them
        ev = "; ".join(f"{evidence_label(k)} {evidence_value(k, v)}" for k, v in scalars.items())
        if nested:
            ev += f" (and {', '.join(nested)}: see --json)"
        # indented as a block: a line that wraps keeps the indent
        items += [
            head,
            Padding(Text(f"evidence: {ev}", style="dim"), (0, 0, 0, 4)),
            Padding(Text(f"fix: {f['recommendation']}"), (0, 0, 0, 4)),
            Text(""),
        ]
    return Group(*items)


def _notes(doc: dict[str, Any]) -> list[Text]:
    run = doc["run"]
    notes = []
    if run["dropped_events"] and not any("events were dropped" in str(w) for w in run["warnings"]):
        # a report of an earlier version, whose warnings do not say it yet
        notes.append(
            Text(
                f"{run['dropped_events']} events were dropped (buffer full or disk unwritable); totals may be low",
                style="yellow",
            )
        )
    for e in run["errors"]:
        notes.append(Text(f"collector turned off: {e}", style="yellow"))
    for w in run["warnings"]:
        notes.append(Text(w, style="yellow"))
    return notes


#: Sections rendered by their own modules: (title, "module:function"); the function takes the report
#: document and returns a rich renderable, or None when the section has nothing to show.
_SECTION_RENDERERS: list[tuple[str, str]] = [
    ("Resources per host", "holoprof.present.hosts:hosts_group"),
    ("Goodput: the job's wall time", "holoprof.present.compute:goodput_group"),
    ("Workflow stages", "holoprof.present.stages:stages_group"),
    ("Memory", "holoprof.present.memory:memory_group"),
    ("Communication", "holoprof.present.comm:comm_group"),
    ("Ranks: who is slow, and where", "holoprof.present.stragglers:stragglers_group"),
    ("I/O", "holoprof.present.io:io_group"),
    ("Device time (imported trace)", "holoprof.present.terminal:device_group"),
]


def device_group(doc: dict[str, Any]) -> Any:
    """One line per rank: the imported trace's device time, idle / compute / non-compute."""
    rows = (doc.get("device") or {}).get("temporal_breakdown") or []
    if not rows:
        return None
    lines = [
        Text(
            f"rank {r.get('rank')}: {1e3 * float(r.get('kernel_time_s', 0)):.1f} ms from first to last kernel; "
            f"idle {100 * float(r.get('idle_fraction', 0)):.1f}%, compute {100 * float(r.get('compute_fraction', 0)):.1f}%, "
            f"non-compute {100 * float(r.get('non_compute_fraction', 0)):.1f}%"
        )
        for r in rows
    ]
    return Group(*lines)


def _section_group(target: str, doc: dict[str, Any]) -> Any:
    module_name, func = target.split(":")
    try:
        mod = importlib.import_module(module_name)
    except ImportError:
        return None
    return getattr(mod, func)(doc)


def render(
    doc: dict[str, Any], short: bool = False, file: IO[str] | None = None, width: int | None = None
) -> None:
    doc = printable(doc)
    console = make_console(file, width)
    inner = max(20, console.width - 4)  # inside the panel's borders and padding
    parts: list[Any] = [_header(doc), Text("")]
    # a run without steps whose I/O was recorded (an imported Darshan log, a data preparation job)
    # opens with its reads and writes, not with advice to mark training steps
    io_first = not doc["steps"]["count"] and bool(doc.get("io"))
    if io_first:
        parts += [Text("I/O", style="bold underline"), _section_group("holoprof.present.io:io_group", doc)]
    else:
        parts += [Text("Steps", style="bold underline"), _steps(doc)]
    if doc["steps"]["count"]:
        parts += [
            Text(""),
            Text("Where each step's time goes", style="bold underline"),
            _phases(doc, min(60, inner)),
        ]
    # the findings on the first screen, right after where the step's time goes; the details after
    parts += [Text(""), Text("Findings", style="bold underline"), _findings(doc)]
    try:
        compute = _section_group("holoprof.present.compute:compute_group", doc)
    except Exception as exc:  # a renderer bug must not hide the rest of the report
        compute = Text(f"(Compute could not be shown: {type(exc).__name__}: {exc})", style="yellow")
    if compute is not None:
        parts += [Text(""), Text("Compute: FLOPs and MFU", style="bold underline"), compute]
    res = _resources(doc)
    if res is not None and not short:
        parts += [Text("Resources", style="bold underline"), res]
    if not short:
        for title, section in _SECTION_RENDERERS:
            if io_first and title == "I/O":
                continue
            try:
                group = _section_group(section, doc)
            except Exception as exc:  # a renderer bug must not hide the rest of the report
                group = Text(f"({title} could not be shown: {type(exc).__name__}: {exc})", style="yellow")
            if group is not None:
                parts += [Text(""), Text(title, style="bold underline"), group]
    notes = _notes(doc)
    if notes:
        parts += [Text("Notes", style="bold underline"), *notes]
    console.print(Panel(Group(*parts), title="holoprof report", title_align="left", border_style="blue"))
