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
