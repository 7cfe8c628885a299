"""Compaction after a run: a few large Parquet files per table per process instead of one per flush.

Safe against interruption: a compacted file is named after the range of chunk numbers it holds
(``spans-c<first>-<last>.parquet``) and written atomically before the parts are removed; a reader that
finds both ignores the parts inside the range, and the next compaction removes them.

Memory is bounded: consecutive parts are merged in groups of at most ``max_rows`` rows (read from the
Parquet footers; about 120 bytes a span once in memory), so a process that recorded a hundred million
spans is compacted into files of a million rows, each sorted by start time, never loaded whole. Files
already compacted stay as they are.
"""

from __future__ import annotations

import os

from holoprof.store.layout import folder_chunks, is_complete_parquet, process_folders
from holoprof.store.raw import discard

#: Rows of chunk data merged into one compacted file (and held in memory at once).
MAX_ROWS = 1_000_000


def _rows(path: str) -> int:
    import pyarrow.parquet as pq

    return int(pq.ParquetFile(path).metadata.num_rows)


def _groups(parts: list[tuple[int, str]], max_rows: int) -> list[list[tuple[int, str]]]:
    groups: list[list[tuple[int, str]]] = []
    cur: list[tuple[int, str]] = []
    size = 0
    for seq, path in parts:
        try:
            n = _rows(path)
        except Exception:
            continue
        if cur and size + n > max_rows:
            groups.append(cur)
            cur, size = [], 0
        cur.append((seq, path))
        size += n
    if cur:
        groups.append(cur)
    return groups


def compact_run(run_dir: str, min_parts: int = 2, max_rows: int = MAX_ROWS) -> int:
    """Compact every process folder of ``run_dir``; returns the number of parts merged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    merged = 0
    for folder in process_folders(run_dir):
        for table, (compacted, parts) in folder_chunks(folder).items():
            ranges = [(f, la) for f, la, p in compacted if is_complete_parquet(p)]
            for seq, p in parts:  # left behind by an interrupted compaction: already in a compacted file
                if any(f <= seq <= la for f, la in ranges):
                    os.remove(p)
            good = [(s, p) for s, p in sorted(parts) if is_complete_parquet(p) and os.path.exists(p)]
            if len(good) < min_parts and not (good and compacted):
                continue
            for group in _groups(good, max_rows):
                tables = []
                for _, p in group:
                    try:
                        tables.append(pq.read_table(p))
                    except Exception:
                        continue
                if not tables:
                    continue
                combined = pa.concat_tables(tables, promote_options="default")
                del tables
                if table == "spans" and "start_ns" in combined.column_names:
                    combined = combined.sort_by([("start_ns", "ascending")])
                lo, hi = group[0][0], group[-1][0]
                dest = os.path.join(folder, f"{table}-c{lo:08d}-{hi:08d}.parquet")
                tmp = dest + ".tmp"
                try:
                    pq.write_table(
                        combined, tmp, compression="zstd", use_dictionary=True, row_group_size=1_000_000
                    )
                    os.replace(tmp, dest)
                except BaseException:
                    discard(tmp)  # a full disk leaves no partial temporary file behind
                    raise
                del combined
                for _, p in group:
                    os.remove(p)
                merged += len(group)
    return merged
