"""Writing Parquet chunks atomically.

A chunk is written under a temporary name and renamed, so that it appears whole or not at all to
concurrent readers such as the live dashboard (the reader also skips unreadable chunks).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from holoprof import model

_counter = itertools.count()
_lock = threading.Lock()


def chunk_name(table: str, seq: int) -> str:
    return f"{table}-{seq:08d}{model.CHUNK_SUFFIX}"


def write_chunk(
    folder: str, table: str, columns: Mapping[str, Sequence[Any]], seq: int | None = None, exact: bool = False
) -> str | None:
    """Write one chunk of ``table`` (column name -> values) into ``folder``; return its path.

    Missing columns are filled with nulls; columns not in the schema are an error. Returns None when
    there are no rows.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = model.arrow_schema(table)
    unknown = set(columns) - set(schema.names)
    if unknown:
        raise ValueError(f"unknown columns for table {table!r}: {sorted(unknown)}")
    n = max((len(v) for v in columns.values()), default=0)
    if n == 0:
        return None
    arrays = []
    for field in schema:
        values = columns.get(field.name)
        if values is None:
            arrays.append(pa.nulls(n, type=field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
    tbl = pa.Table.from_arrays(arrays, schema=schema)
    if seq is None:
        with _lock:
            seq = next(_counter)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, chunk_name(table, seq))
    while not exact and os.path.exists(path):  # another writer used the same sequence number
        seq += 1_000_000
        path = os.path.join(folder, chunk_name(table, seq))
    tmp = f"{path}.tmp{os.getpid()}-{threading.get_ident()}"
    pq.write_table(
        tbl,
        tmp,
        compression="zstd",
        use_dictionary=True,
        write_statistics=True,
    )
    os.replace(tmp, path)
    return path
