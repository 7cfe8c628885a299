"""Compaction after a run: one Parquet file per table per process instead of one per flush.

Safe against interruption: the compacted file is named after the range of chunk numbers it holds
(``spans-c<first>-<last>.parquet``) and written atomically before the parts are removed; a reader that
finds both ignores the parts inside the range.
"""

from __future__ import annotations

import os

from holoprof.store.layout import folder_chunks, is_complete_parquet, process_folders


def compact_run(run_dir: str, min_parts: int = 2) -> int:
    """Compact every process folder of ``run_dir``; returns the number of parts merged."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    merged = 0
    for folder in process_folders(run_dir):
        for table, (compacted, parts) in folder_chunks(folder).items():
            good = [(s, p) for s, p in sorted(parts) if is_complete_parquet(p)]
            if len(good) + len(compacted) < min_parts or not good:
                continue
            tables = []
            for _, p in good:
                try:
                    tables.append(pq.read_table(p))
                except Exception:
                    continue
            if not tables:
                continue
            for _first, _last, p in compacted:
                if is_complete_parquet(p):
                    tables.insert(0, pq.read_table(p))
            combined = pa.concat_tables(tables, promote_options="default")
            if table == "spans" and "start_ns" in combined.column_names:
                combined = combined.sort_by([("start_ns", "ascending")])
            lo = min([s for s, _ in good] + [f for f, _, _ in compacted])
            hi = max([s for s, _ in good] + [la for _, la, _ in compacted])
            dest = os.path.join(folder, f"{table}-c{lo:08d}-{hi:08d}.parquet")
            tmp = dest + ".tmp"
            pq.write_table(combined, tmp, compression="zstd", use_dictionary=True, row_group_size=1_000_000)
            os.replace(tmp, dest)
            for _, p in good:
                os.remove(p)
            for _, _, p in compacted:
                if p != dest:
                    os.remove(p)
            merged += len(good)
    return merged
