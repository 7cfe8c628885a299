"""Writing Parquet chunks atomically.

A chunk is written under a temporary name and renamed, so that it appears whole or not at all to
concurrent readers such as the live dashboard (the reader also skips unreadable chunks).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from holoprof import model
from holoprof.errors import printable_text
from holoprof.store import layout, safeio
from holoprof.store.raw import discard

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
        import pyarrow as pa  # lazy: pyarrow loads only where chunks are written or read, not with the module

        pa.scalar(0)  # the first array-like check: pyarrow's one lazy probe for pandas


def write_chunk(
    run_dir: str,
    table: str,
    columns: Mapping[str, Sequence[Any]],
    seq: int | None = None,
    exact: bool = False,
    writer: tuple[str, int] | None = None,
    last: int | None = None,
) -> list[str]:
    """Write the rows of ``table`` (column name -> values) into the table's partition folders of
    ``run_dir``; return the paths written.

    A partition belongs to the process that writes it, which numbers its parts in order: ``writer``
    (host, pid) puts every row into that process's partition (rows a process records about others,
    such as the launcher's snapshots of the job's processes, stay in its own); without it, each
    process of the rows (``host``, ``pid``) gets a part of its own (imports, which write once).
    ``last`` names the file as holding the parts ``seq`` to ``last`` (``part-c<seq>-<last>``).

    Missing columns are filled with nulls (the typed I/O counters from ``counters``); columns not in
    the schema are an error. Each part is written under a hidden temporary name and renamed, so a
    reader sees it whole or not at all. Nothing is written when there are no rows.
    """
    import pyarrow as pa  # lazy: pyarrow loads only where chunks are written or read, not with the module

    run_dir = safeio.utf8_path(run_dir)  # pyarrow takes UTF-8 file names only
    schema = model.arrow_schema(table)
    unknown = set(columns) - set(schema.names)
    if unknown:
        raise ValueError(f"unknown columns for table {table!r}: {sorted(unknown)}")
    n = max((len(v) for v in columns.values()), default=0)
    if n == 0:
        return []
    if "host" not in columns or "pid" not in columns:
        raise ValueError(f"rows of table {table!r} need their process: columns 'host' and 'pid'")
    if table == "io_files":
        columns = {**typed_counters(columns.get("counters") or [None] * n), **columns}
    arrays = []
    for f in schema:
        values = columns.get(f.name)
        if values is None:
            arrays.append(pa.nulls(n, type=f.type))
        else:
            arrays.append(_array(pa, values, f.type))
    tbl = pa.Table.from_arrays(arrays, schema=schema)
    if seq is None:
        with _lock:
            seq = next(_counter)
    rows: dict[tuple[Any, Any], list[int]] = {}
    if writer is not None:
        rows[writer] = list(range(n))
    else:
        for i, key in enumerate(zip(columns["host"], columns["pid"], strict=False)):
            rows.setdefault(key, []).append(i)

    def write(key: tuple[Any, Any], idx: list[int]) -> str:
        part = tbl if len(rows) == 1 else tbl.take(pa.array(idx, type=pa.int64()))
        return _write_part(
            part, layout.partition_dir(run_dir, table, str(key[0]), int(key[1])), seq, exact, last
        )

    parts = sorted(rows.items(), key=lambda kv: str(kv[0]))
    if len(parts) < _PARALLEL_PARTS:
        return [write(key, idx) for key, idx in parts]
    # an import writes one part per process (2,048 for a large Darshan log): each costs a few
    # milliseconds of pyarrow, which releases the GIL while it writes, so they go on several threads
    with ThreadPoolExecutor(max_workers=min(_MAX_WRITERS, os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda kv: write(*kv), parts))


def _has_part(root: str, table: str) -> bool:
    """Whether ``table`` of the run at ``root`` has a visible Parquet file in a partition folder."""
    return any(
        f.endswith(".parquet") and not f.startswith(".")
        for d in layout.partition_dirs(root, table)
        for f in os.listdir(d)
    )


def write_empty_tables(run_dir: str, host: str | None = None, pid: int | None = None) -> list[str]:
    """Every table of ``run_dir`` that has no file yet gets one part with its schema and no rows, in
    the partition of the process (``host``, ``pid``) that finishes the run (the launcher, an import;
    by default the first process with a partition): each table folder of a finished run then reads as
    a table, empty or not, with pandas, pyarrow, DuckDB or polars (``io_ops`` has rows only with
    ``--io-trace``). Returns the paths written."""
    import pyarrow as pa  # lazy: pyarrow loads only where chunks are written or read, not with the module

    root = safeio.utf8_path(run_dir)  # pyarrow takes UTF-8 file names only
    if host is None or pid is None:
        found = next(
            (layout.partition_of(d) for t in model.TABLES for d in layout.partition_dirs(root, t)), None
        )
        if found is None:
            return []
        host, pid = found
    out = []
    for table in model.TABLES:
        if _has_part(root, table):
            continue
        empty = pa.Table.from_batches([], schema=model.arrow_schema(table))
        out.append(_write_part(empty, layout.partition_dir(root, table, host, int(pid)), 0, False, None))
    return out


def _array(pa: Any, values: Sequence[Any], type_: Any) -> Any:
    """``values`` as an Arrow array of ``type_``; strings holding bytes that are not UTF-8 (surrogate
    escapes: a path the job used) are stored with those bytes as ``\\xNN``, as the I/O layers do."""
    try:
        return pa.array(values, type=type_)
    except UnicodeEncodeError:
        return pa.array([printable_text(v) if isinstance(v, str) else v for v in values], type=type_)


#: parts written by one call from which they are written on several threads, and at most how many
_PARALLEL_PARTS = 16
_MAX_WRITERS = 8


def _write_part(part: Any, folder: str, seq: int, exact: bool, last: int | None) -> str:
    """Write one process's part into its partition folder (a hidden temporary name, then renamed); its path."""
    import pyarrow.parquet as pq  # lazy: pyarrow loads only where chunks are written or read, not with the module

    os.makedirs(folder, mode=0o700, exist_ok=True)
    s = seq
    path = os.path.join(folder, layout.part_name(s) if last is None else layout.compacted_name(s, last))
    while not exact and os.path.exists(path):  # another writer used the same sequence number
        s += 1_000_000
        path = os.path.join(folder, layout.part_name(s) if last is None else layout.compacted_name(s, last))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp{os.getpid()}-{threading.get_ident()}")
    try:
        pq.write_table(part, tmp, compression="zstd", use_dictionary=True, write_statistics=True)
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)  # a full disk leaves no partial temporary file behind
        raise
    return path


def typed_counters(counters: Sequence[Any]) -> dict[str, list[Any]]:
    """The typed counter columns of ``io_files`` rows from their ``counters`` (JSON text or dicts):
    one list per counter of :data:`holoprof.model.IO_COUNTERS`, None where a row lacks it."""

    out: dict[str, list[Any]] = {name: [] for name, _ in model.IO_COUNTERS}
    for c in counters:
        d = json.loads(c) if isinstance(c, str) else c
        if not isinstance(d, dict):
            d = {}
        for name, t in model.IO_COUNTERS:
            v = d.get(name)
            if v is not None:
                try:
                    v = float(v) if t == "double" else int(v)
                except (TypeError, ValueError, OverflowError):
                    v = None
                if t == "int64" and v is not None and not -(2**63) <= v < 2**63:
                    v = None
            out[name].append(v)
    return out
