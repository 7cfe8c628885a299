"""Compaction: a few large Parquet files per table per process instead of one per flush.

After a run, :func:`compact_run` merges each process's parts; while a job runs, the converter calls
:func:`compact_live` every second, which merges the parts of a process and table once there are
:data:`LIVE_PARTS` of them, and merges its compacted files once there are :data:`LIVE_COMPACTED`, so
the number of files stays bounded (and reading a running job costs about what a finished one does).

Safe against interruption and against concurrent readers: a compacted file is named after the range
of chunk numbers it holds (``part-c<first>-<last>.parquet``), written under a hidden temporary name
and renamed before the files it replaces are removed; a reader that finds both ignores the parts
(and smaller compacted files) inside the range, and the next compaction removes them.

Memory is bounded: files are merged in groups of at most ``max_rows`` rows (read from the Parquet
footers; about 120 bytes a span once in memory), so a process that recorded a hundred million spans
is compacted into files of a million rows, each sorted by start time, never loaded whole.
"""

from __future__ import annotations

import os

from holoprof.store.layout import ChunkDir, chunk_dirs, is_complete_parquet, scan_dir
from holoprof.store.raw import discard

#: Rows of chunk data merged into one compacted file (and held in memory at once).
MAX_ROWS = 1_000_000
#: While a job runs: parts of one process and table merged once there are this many ...
LIVE_PARTS = 32
#: ... and its compacted files (each below MAX_ROWS rows) merged once there are this many.
LIVE_COMPACTED = 8


def _rows(path: str) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def _groups(files: list[tuple[int, int, str]], max_rows: int) -> list[list[tuple[int, int, str]]]:
    """Consecutive files in groups of at most ``max_rows`` rows (a larger file alone); unreadable
    files are left out."""
    groups: list[list[tuple[int, int, str]]] = []
    cur: list[tuple[int, int, str]] = []
    size = 0
    for f in files:
        try:
            n = _rows(f[2])
        except Exception:
            continue
        if cur and size + n > max_rows:
            groups.append(cur)
            cur, size = [], 0
        cur.append(f)
        size += n
    if cur:
        groups.append(cur)
    return groups


def _merge(cd: ChunkDir, group: list[tuple[int, int, str]]) -> int:
    """Write the files of ``group`` as one compacted file, then remove them; the files merged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for _, _, p in group:
        try:
            tables.append(pq.read_table(p))
        except Exception:
            continue
    if not tables:
        return 0
    combined = pa.concat_tables(tables, promote_options="default")
    del tables
    if cd.table == "spans" and "start_ns" in combined.column_names:
        combined = combined.sort_by([("start_ns", "ascending")])
    dest = cd.compacted_path(group[0][0], group[-1][1])
    tmp = os.path.join(cd.path, f".{os.path.basename(dest)}.tmp{os.getpid()}")
    try:
        pq.write_table(combined, tmp, compression="zstd", use_dictionary=True, row_group_size=1_000_000)
        os.replace(tmp, dest)
    except BaseException:
        discard(tmp)  # a full disk leaves no partial temporary file behind
        raise
    del combined
    for _, _, p in group:
        if p != dest:
            os.remove(p)
    return len(group)


def _tidy(cd: ChunkDir) -> tuple[list[tuple[int, int, str]], list[tuple[int, int, str]]]:
    """Remove what an interrupted compaction left inside a compacted range; the complete compacted
    files and parts that remain, as (first, last, path), in order."""
    done = sorted(c for c in cd.compacted if is_complete_parquet(c[2]))
    keep = []
    for c in done:
        if any(o is not c and o[0] <= c[0] and c[1] <= o[1] for o in done):
            os.remove(c[2])
        else:
            keep.append(c)
    parts = []
    for seq, p in sorted(cd.parts):
        if any(f <= seq <= la for f, la, _ in keep):
            os.remove(p)
        elif is_complete_parquet(p):
            parts.append((seq, seq, p))
    return keep, parts


def compact_run(run_dir: str, min_parts: int = 2, max_rows: int = MAX_ROWS) -> int:
    """Compact every process and table of ``run_dir``; returns the number of parts merged."""
    merged = 0
    for cd in chunk_dirs(run_dir):
        compacted, parts = _tidy(cd)
        if len(parts) < min_parts and not (parts and compacted):
            continue
        for group in _groups(parts, max_rows):
            merged += _merge(cd, group)
    return merged


def compact_live(
    run_dir: str, parts_at: int = LIVE_PARTS, compacted_at: int = LIVE_COMPACTED, max_rows: int = MAX_ROWS
) -> int:
    """Compact the tables of a running job where files pile up; returns the files merged. A process
    numbers its parts in the order it writes them, and the converter writes them in that order, so
    the parts there are hold every number below the last one: merging them skips none to come."""
    merged = 0
    for cd in chunk_dirs(run_dir):
        if cd.old or len(cd.parts) + len(cd.compacted) < min(parts_at, compacted_at):
            continue
        compacted, parts = _tidy(cd)
        if len(parts) >= parts_at:
            for group in _groups(parts, max_rows):
                merged += _merge(cd, group)
            compacted, parts = _tidy(scan_dir(cd.path, cd.table).get(cd.table) or ChunkDir(cd.table, cd.path))
        # runs of consecutive small compacted files (never across a full one: its range would be covered)
        runs: list[list[tuple[int, int, str]]] = [[]]
        for c in compacted:
            if _rows_or_max(c[2]) < max_rows:
                runs[-1].append(c)
            elif runs[-1]:
                runs.append([])
        if sum(len(r) for r in runs) >= compacted_at:
            for run in runs:
                for group in _groups(run, max_rows):
                    if len(group) > 1:
                        merged += _merge(cd, group)
    return merged


def _rows_or_max(path: str) -> int:
    try:
        return _rows(path)
    except Exception:
        return MAX_ROWS
