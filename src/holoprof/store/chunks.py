"""Writing Parquet chunks atomically.

A chunk is written under a temporary name and renamed, so that it appears whole or not at all to
concurrent readers such as the live dashboard (the reader also skips unreadable chunks).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from holoprof import model

_counter = itertools.count()
_lock = threading.Lock()


class _NoPandas:
    """A finder that makes ``import pandas`` fail while it is on ``sys.meta_path``."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas":
            raise ModuleNotFoundError("pandas is not needed here", name=name)


@contextlib.contextmanager
def without_pandas() -> Iterator[None]:
    """``import pandas`` fails inside (unless pandas is imported already), in this process and in the
    processes it forks meanwhile. Only for holoprof's own commands: never in a traced job."""
    if "pandas" in sys.modules:
        yield
        return
    sys.meta_path.insert(0, _NoPandas)
    try:
        yield
    finally:
        sys.meta_path.remove(_NoPandas)


def pyarrow_without_pandas() -> None:
    """Keep pyarrow from importing pandas (about 50 MiB and half a second) for its array-like checks.

    pyarrow looks for pandas once, lazily, the first time it asks whether a value is array-like
    (``pa.scalar``, ``fill_null``, ``to_numpy``, ``pa.array``...), and imports it if it is installed.
    The trace importer's workers never use pandas (the report does not load pyarrow), so this first probe is made to fail:
    pyarrow remembers that answer for its checks, while an explicit ``to_pandas()`` still imports
    pandas as usual. Only for holoprof's own commands: never in a traced job, whose pyarrow must see
    the job's pandas.
    """
    with without_pandas():
        import pyarrow as pa

        pa.scalar(0)  # the first array-like check: pyarrow's one lazy probe for pandas


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
    try:
        pq.write_table(
            tbl,
            tmp,
            compression="zstd",
            use_dictionary=True,
            write_statistics=True,
        )
        os.replace(tmp, path)
    except BaseException:
        from holoprof.store.raw import discard

        discard(tmp)  # a full disk leaves no partial temporary file behind
        raise
    return path
