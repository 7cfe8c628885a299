"""Long tables (thousands of ranks, processes, stages, files) summarized for people to read.

The terminal, the HTML report and the dashboard show at most :data:`MAX_ROWS` rows of a table: the
rows that cost the most (time, bytes), in the table's own order, then one row that adds up the rest
("… and 2000 more"). Numbered names sort in natural order (rank 2 before rank 10). The JSON report
and the API keep every row.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

#: The most rows a table shows, the summary row of the rest included.
MAX_ROWS = 30

T = TypeVar("T")

_DIGITS = re.compile(r"(\d+)")


def natural_key(value: Any) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders the numbers inside names by value: rank 2 before rank 10."""
    parts = _DIGITS.split(str(value))
    return tuple((0, int(p)) if i % 2 else (1, p) for i, p in enumerate(parts) if p)


def top_rows(
    rows: Sequence[T],
    cost: Callable[[T], float],
    limit: int = MAX_ROWS,
    parent: Callable[[int], int | None] | None = None,
) -> tuple[list[T], list[T]]:
    """``rows`` cut to at most ``limit`` rows to show, the summary row of the rest included:
    ``(shown, rest)``. The shown rows are the costliest (ties: the earlier), in their order in
    ``rows``; with ``parent`` (the index of a row's parent, or None), a shown row's ancestors are
    shown too, so a tree stays a tree. Nothing is cut when ``rows`` fits."""
    if len(rows) <= limit:
        return list(rows), []
    keep: set[int] = set()
    for i in sorted(range(len(rows)), key=lambda i: (-float(cost(rows[i]) or 0), i)):
        chain = [i]
        while parent is not None and (p := parent(chain[-1])) is not None and p not in keep:
            chain.append(p)
        if len(keep) + len(chain) > limit - 1:
            if len(keep) >= limit - 1:
                break
            continue
        keep.update(chain)
    shown = [r for i, r in enumerate(rows) if i in keep]
    rest = [r for i, r in enumerate(rows) if i not in keep]
    return shown, rest


def tree_parent(depths: Sequence[int]) -> Callable[[int], int | None]:
    """``parent`` for :func:`top_rows` of rows in tree order with these depths (0 at the roots)."""
    parents: list[int | None] = []
    stack: list[int] = []
    for i, d in enumerate(depths):
        while stack and depths[stack[-1]] >= d:
            stack.pop()
        parents.append(stack[-1] if stack else None)
        stack.append(i)
    return lambda i: parents[i]


def more_label(rest: Sequence[Any], what: str) -> str:
    """The name cell of the summary row: "… and 2000 more <what>"."""
    return f"… and {len(rest)} more {what}"


def total(rest: Sequence[dict[str, Any]], key: str) -> float:
    """The sum of ``key`` over the rows (missing or null counts as 0)."""
    return float(sum(float(r.get(key) or 0) for r in rest))


def at_most(rest: Sequence[dict[str, Any]], key: str, fmt: Callable[[float], str]) -> str:
    """The largest ``key`` over the rows, formatted, as a bound: "≤ 15.5 ms" (empty for no rows)."""
    values = [float(r[key]) for r in rest if r.get(key) is not None]
    return f"≤ {fmt(max(values))}" if values else ""


def more_files(io: dict[str, Any], shown: Sequence[dict[str, Any]]) -> tuple[int, float, float, float]:
    """What the files not shown add up to, from the run's I/O totals (the report lists only the
    largest files): ``(files, bytes read, read calls, bytes written)``."""
    listed = io.get("files_detail") or []
    count = max(0, int(io.get("files") or 0) - len(shown), len(listed) - len(shown))
    read = max(0.0, float(io.get("bytes_read") or 0) - total(shown, "bytes_read"))
    reads = max(0.0, float(io.get("reads") or 0) - total(shown, "reads"))
    written = max(0.0, float(io.get("bytes_written") or 0) - total(shown, "bytes_written"))
    return count, read, reads, written


_RANK_NAME = re.compile(r"^(?:(?P<base>.*) )?\[?rank (?P<rank>\d+)\]?$")
#: Sibling stages that are ranks of one command are shown as one row from this many on.
RANK_GROUP_MIN = 5
_SUMMED = ("processes", "steps", "cpu_s", "read_bytes", "write_bytes", "traced_write_bytes")


def collapse_ranks(stages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stage tree with each run of :data:`RANK_GROUP_MIN` or more sibling leaf stages that are
    ranks of one command ("ior [rank 0]", "ior [rank 1]", ...) shown as one row, "ior [ranks
    0-2047]": its start the earliest, wall and share the longest, its counts and bytes summed. A
    2,048-rank import reads as its command, not as 2,048 rows that say the same."""
    out: list[dict[str, Any]] = []
    i, n = 0, len(stages)
    while i < n:
        j, key = i, _rank_key(stages, i)
        while key is not None and j + 1 < n and _rank_key(stages, j + 1) == key:
            j += 1
        if key is None or j - i + 1 < RANK_GROUP_MIN:
            out.append(dict(stages[i]))
            i += 1
            continue
        group = stages[i : j + 1]
        ranks = sorted(int(m.group("rank")) for st in group if (m := _RANK_NAME.match(str(st["name"]))))
        row = dict(group[0])
        base = key[1]
        span = (
            f"ranks {ranks[0]}-{ranks[-1]}"
            if ranks == list(range(ranks[0], ranks[-1] + 1))
            else f"{len(ranks)} ranks"
        )
        row["name"] = f"{base} [{span}]" if base else span
        row["ranks"] = len(group)
        row["start_s"] = min(float(st.get("start_s") or 0) for st in group)
        for k in ("wall_s", "share", "max_rss_bytes"):
            row[k] = max(float(st.get(k) or 0) for st in group)
        for k in _SUMMED:
            row[k] = sum(float(st.get(k) or 0) for st in group)
        row["critical"] = any(st.get("critical") for st in group)
        out.append(row)
        i = j + 1
    return out


def _rank_key(stages: Sequence[dict[str, Any]], i: int) -> tuple[int, str, str, str] | None:
    """(depth, command, kind, parent) of stage ``i`` when it is a rank's stage with no child stage."""
    st = stages[i]
    m = _RANK_NAME.match(str(st.get("name", "")))
    depth = int(st.get("depth", 0))
    if m is None or (i + 1 < len(stages) and int(stages[i + 1].get("depth", 0)) > depth):
        return None
    return (depth, m.group("base") or "", str(st.get("kind", "")), str(st.get("parent")))
