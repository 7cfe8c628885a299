"""The I/O section in the terminal: totals, bandwidth, the read-size histogram, top files, staging.

Renders the ``io`` section of a ``holoprof.report/1`` document; computes nothing but widths.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from holoprof.present import summary
from holoprof.present.terminal import NamedRows, fmt_bytes, fmt_s, middle_ellipsis

BAR_WIDTH = 30
TOP_FILES = 10


def _rate(b: float) -> str:
    return f"{fmt_bytes(b)}/s" if b > 0 else "-"


def _mapped_line(m: dict[str, Any]) -> str:
    line = f"{m['files']} files memory-mapped ({m['mmaps']} mappings, {fmt_bytes(m['bytes_mapped'])} mapped"
    if m.get("bytes_mapped_resident") is not None:
        line += f"; {fmt_bytes(m['bytes_brought_in'])} brought in"
        if not m.get("bytes_brought_in_exact", True):
            line += " (estimated: not every mapping was measured)"
    return line + "): their data is read through the mapping, not in read calls"


def _mapped_cell(f: dict[str, Any]) -> str:
    if not f.get("mmaps") and not f.get("bytes_brought_in"):
        return "-"
    cell = fmt_bytes(f.get("bytes_mapped", 0))
    brought = f.get("bytes_brought_in")
    return cell if brought is None else f"{cell} ({fmt_bytes(brought)} in)"


def io_group(doc: dict[str, Any]) -> Group | None:
    """The I/O section as a rich renderable, or None when the run has no I/O."""
    io = doc.get("io") or {}
    if not io:
        return None
    parts: list[Any] = _totals(io)
    parts += _read_sizes(io)
    parts += _top_files(io)
    parts += _staging(io)
    roles = io.get("by_role") or {}
    if len(roles) > 1 and io["bytes_read"]:
        line = ", ".join(f"{r} {fmt_bytes(v['bytes_read'])}" for r, v in roles.items())
        parts += [Text(""), Text(f"read by role: {line}", style="grey62")]
    parts += _training_data(io)
    return Group(*parts)


def _training_data(io: dict[str, Any]) -> list[Text]:
    """What the I/O findings took for the training's data, and the files they left out (not those
    only written or looked at)."""
    data = io.get("training_data") or {}
    left = {k: n for k, n in (data.get("left_out_files") or {}).items() if k != "not_read" and n}
    if not left:
        return []
    why = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in left.items())
    return [
        Text(
            f"I/O findings judge the data the training reads ({data.get('files_read', 0)} files); "
            f"files left out, per reason: {why}",
            style="grey62",
        )
    ]


def _totals(io: dict[str, Any]) -> list[Text]:
    """Bytes and operations, bandwidths, the modules side by side, mappings and the reference."""
    layers = ", ".join(io.get("layers", [])) or "?"
    parts = [
        Text(
            f"{fmt_bytes(io['bytes_read'])} read in {io['reads']} reads, {fmt_bytes(io['bytes_written'])} written "
            f"in {io['writes']} writes, {io['files']} files ({layers} layer)"
        ),
    ]
    meta = f"metadata {100 * io.get('meta_time_fraction', 0):.0f}% of I/O time"
    if io["bytes_read"]:
        parts.append(
            Text(
                f"read bandwidth {_rate(io['bandwidth_read_bytes_per_s'])} per process in read calls, "
                f"{_rate(io.get('bandwidth_read_window_bytes_per_s', 0))} while reading, "
                f"{_rate(io.get('bandwidth_read_wall_bytes_per_s', 0))} over the run; "
                f"{meta}, sequential reads {100 * io.get('seq_read_fraction', 0):.0f}%"
            )
        )
    if io["bytes_written"]:  # a write-only job (a checkpoint writer, IOR): its writes, not empty reads
        parts.append(
            Text(
                f"write bandwidth {_rate(io.get('bandwidth_write_bytes_per_s', 0))} per process in write calls, "
                f"{_rate(io.get('bandwidth_write_wall_bytes_per_s', 0))} over the run"
                + ("" if io["bytes_read"] else f"; {meta}")
            )
        )
    mods = {m: d for m, d in (io.get("by_module") or {}).items() if d["opens"] or d["reads"] or d["writes"]}
    if len(mods) > 1:  # layers of one another (MPI-IO over POSIX): shown side by side, never added
        parts.append(
            Text(
                "by module: "
                + "; ".join(
                    f"{m} {fmt_bytes(d['bytes_read'])} read in {d['reads']} reads, "
                    f"{fmt_bytes(d['bytes_written'])} written in {d['writes']} writes, {d['opens']} opens"
                    for m, d in mods.items()
                )
            )
        )
    mapped = io.get("mapped") or {}
    if mapped:
        parts.append(Text(_mapped_line(mapped)))
    ref = io.get("reference_bandwidth") or {}
    if ref:
        parts.append(Text(f"reference: {_rate(ref['bytes_per_s'])} ({ref['source']})", style="grey62"))
    return parts


def _read_sizes(io: dict[str, Any]) -> list[Any]:
    """The read-size histogram as bars ([] without reads)."""
    hist = io.get("read_size_histogram") or {}
    total = sum(hist.values())
    if not total:
        return []
    h = Table(box=None, show_header=False, pad_edge=False)
    h.add_column("size", style="grey62")
    h.add_column("bar")
    h.add_column("reads", justify="right", no_wrap=True)
    names = list(hist)
    used = [i for i, name in enumerate(names) if hist[name]]
    # the buckets from the smallest used to the largest used: no run of empty rows at either end
    for name in names[used[0] : used[-1] + 1]:
        n = hist[name]
        share = n / total
        h.add_row(name, Text("█" * round(share * BAR_WIDTH), style="blue"), f"{n} ({100 * share:.0f}%)")
    return [Text(""), Text("read sizes", style="bold"), h]


def _top_files(io: dict[str, Any]) -> list[Any]:
    """The :data:`TOP_FILES` largest files, and a line for the rest ([] without files)."""
    files = io.get("files_detail") or []
    if not files:
        return []
    any_mapped = any(f.get("mmaps") for f in files[:TOP_FILES])
    # the read columns only where something was read (a write-only job's would be rows of 0)
    with_reads = any(f["bytes_read"] or f["reads"] for f in files[:TOP_FILES])
    t = NamedRows(
        "file",
        [
            *(["read"] if with_reads else []),
            "written",
            *(["mapped"] if any_mapped else []),
            *(["reads"] if with_reads else []),
            "opens",
            *(["seq", "read time"] if with_reads else []),
        ],
        [
            (
                Text(str(f["path"])),
                [
                    *([fmt_bytes(f["bytes_read"])] if with_reads else []),
                    fmt_bytes(f["bytes_written"]),
                    *([_mapped_cell(f)] if any_mapped else []),
                    *([str(f["reads"])] if with_reads else []),
                    str(f["opens"]),
                    *(
                        [f"{100 * f['seq_read_fraction']:.0f}%", fmt_s(f["read_time_s"])]
                        if with_reads
                        else []
                    ),
                ],
            )
            for f in files[:TOP_FILES]
        ],
    )
    parts: list[Any] = [Text(""), Text("top files", style="bold"), t]
    count, read, reads, written = summary.more_files(io, files[:TOP_FILES])
    if count:
        where = (
            "every file is in holoprof report RUN --json"
            if len(files) >= int(io.get("files") or 0)
            else f"the largest {len(files)} are in holoprof report RUN --json"
        )
        parts.append(
            Text(
                f"… and {count:,} more files: {fmt_bytes(read)} read in {int(reads):,} reads, "
                f"{fmt_bytes(written)} written ({where})",
                style="grey62",
            )
        )
    return parts


def _staging(io: dict[str, Any]) -> list[Text]:
    """The directories worth staging on a faster tier, with what each saves ([] when none)."""
    staging = [s for s in io.get("staging") or [] if s.get("expected_saving_s", 0) > 0]
    if not staging:
        return []
    parts = [Text(""), Text("stage on a faster tier", style="bold")]
    for s in staging[:3]:
        parts.append(
            Text(
                f"{middle_ellipsis(str(s['directory']), 60)}: {s['files']} files, {fmt_bytes(s['bytes_read'])}, "
                f"saves about {fmt_s(s['expected_saving_s'])}"
            )
        )
    return parts


def render_io(doc: dict[str, Any], console: Console) -> None:
    """Print the I/O section (nothing when the run has no I/O)."""
    g = io_group(doc)
    if g is not None:
        console.print(Text("I/O", style="bold underline"))
        console.print(g)
