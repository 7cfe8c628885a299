"""Compaction: a few large Parquet files per table per process instead of one per flush.

After a run, :func:`compact_run` merges each process's files; while a job runs, the converter calls
:func:`compact_live` after each pass, which merges a process's files of one table once there are
:data:`LIVE_FILES` of them below :data:`MAX_ROWS` rows, so the number of files stays bounded (and
reading a running job costs about what a finished one does).

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
import time

from holoprof.store import safeio
from holoprof.store.layout import ChunkDir, chunk_dirs, is_complete_parquet
from holoprof.store.raw import discard

#: Rows of chunk data merged into one compacted file (and held in memory at once).
MAX_ROWS = 1_000_000
#: While a job runs, the files of one process and table below MAX_ROWS rows are merged once there are
#: this many (the converter writes one a second at most).
LIVE_FILES = 8
#: While a job runs, files merged into a compacted file are removed only this many seconds after it was
#: written: a reader that listed them just before (the dashboard building a report) can still read them.
LIVE_GRACE_S = 10.0


def _rows(path: str) -> int:
    import pyarrow.parquet as pq  # lazy: pyarrow loads only where chunks are written or read, not with the module

    with safeio.open_regular(path) as f:  # a FIFO or a device among the chunks is skipped, never waited on
        return int(pq.ParquetFile(f).metadata.num_rows)


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


def _merge(cd: ChunkDir, group: list[tuple[int, int, str]], grace_s: float = 0.0) -> int:
    """Write the files of ``group`` as one compacted file, then remove them (at once, or by a later
    pass once it is ``grace_s`` seconds old); the files merged."""
    import pyarrow as pa  # lazy: pyarrow loads only where chunks are written or read, not with the module
    import pyarrow.parquet as pq  # lazy: pyarrow loads only where chunks are written or read, not with the module

    tables = []
    for _, _, p in group:
        try:
            with safeio.open_regular(p) as f:
                tables.append(pq.read_table(f))
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
    if not grace_s:
        for _, _, p in group:
            if p != dest:
                os.remove(p)
    return len(group)


def _tidy(
    cd: ChunkDir, grace_s: float = 0.0
) -> tuple[list[tuple[int, int, str]], list[tuple[int, int, str]]]:
    """Remove the files inside a compacted range (merged, or left by an interrupted compaction) once
    the compacted file is ``grace_s`` seconds old; the complete compacted files and parts that are
    not inside one, as (first, last, path), in order."""

    done = sorted(c for c in cd.compacted if is_complete_parquet(c[2]))
    now = time.time()

    def covering(first: int, last: int, path: str) -> bool:
        """Inside another compacted file: removed when that one is old enough."""
        for o in done:
            if o[2] != path and o[0] <= first and last <= o[1] and (o[0], o[1]) != (first, last):
                try:
                    if now - os.path.getmtime(o[2]) >= grace_s:
                        os.remove(path)
                except FileNotFoundError:
                    pass
                return True
        return False

    keep = [c for c in done if not covering(*c)]
    parts = []
    for seq, p in sorted(cd.parts):
        if not covering(seq, seq, p) and is_complete_parquet(p):
            parts.append((seq, seq, p))
    return keep, parts


def _small_runs(files: list[tuple[int, int, str]], max_rows: int) -> list[list[tuple[int, int, str]]]:
    """Runs of consecutive files below ``max_rows`` rows: merging never crosses a full file, whose
    range would then be inside the merged one."""
    runs: list[list[tuple[int, int, str]]] = [[]]
    for f in sorted(files):
        if _rows_or_max(f[2]) < max_rows:
            runs[-1].append(f)
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def compact_run(run_dir: str, min_parts: int = 2, max_rows: int = MAX_ROWS, host: str | None = None) -> int:
    """Compact every process and table of ``run_dir`` (after the run; ``host``'s processes only, when
    given): consecutive files below ``max_rows`` rows are merged into files of at most ``max_rows``;
    returns the files merged."""
    merged = 0
    for cd in chunk_dirs(safeio.utf8_path(run_dir), host):  # pyarrow takes UTF-8 file names only
        compacted, parts = _tidy(cd)
        if len(parts) + len(compacted) < min_parts:
            continue
        for run in _small_runs(compacted + parts, max_rows):
            for group in _groups(run, max_rows):
                if len(group) > 1 or group[0] in parts:  # (a part alone is renamed as compacted)
                    merged += _merge(cd, group)
    return merged


def compact_live(
    run_dir: str, files_at: int = LIVE_FILES, max_rows: int = MAX_ROWS, host: str | None = None
) -> int:
    """Compact the tables of a running job where files pile up: once a process has ``files_at`` files
    of one table below ``max_rows`` rows, consecutive ones are merged. Returns the files merged. A
    process numbers its chunks in the order it writes them and the converter converts them in that
    order, so the files there hold every number below the last one: a merge skips none to come.
    ``host``: that host's processes only."""
    merged = 0
    for cd in chunk_dirs(safeio.utf8_path(run_dir), host):  # pyarrow takes UTF-8 file names only
        if cd.old or len(cd.parts) + len(cd.compacted) < files_at:
            continue
        compacted, parts = _tidy(cd, LIVE_GRACE_S)
        runs = _small_runs(compacted + parts, max_rows)
        if sum(len(r) for r in runs) < files_at:
            continue
        for run in runs:
            for group in _groups(run, max_rows):
                if len(group) > 1:
                    merged += _merge(cd, group, LIVE_GRACE_S)
    return merged


def _rows_or_max(path: str) -> int:
    try:
        return _rows(path)
    except Exception:
        return MAX_ROWS
