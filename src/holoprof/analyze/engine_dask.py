"""The Dask engine: the analyses and exports on a Dask cluster, for runs that outgrow one machine.

``holoprof report RUN --engine dask [--scheduler ADDRESS]`` (or ``holoprof.analyze(run,
engine="dask")``) reads the same Parquet files with ``dask.dataframe`` on a ``dask.distributed``
cluster — a local one by default, or the scheduler given — and runs every
:class:`~holoprof.analyze.engine.Aggregation` of the analyses there: the same DuckDB SQL on every
partition (chunk file) on the workers, the partial results merged on the cluster (in a tree, or
after a shuffle by key), so both engines give the same numbers, and only the merged rows come back.
That covers the process choice, the per-step table and the step and phase statistics (per step
index, see :mod:`holoprof.analyze.per_step`), the resources, the I/O, communication, stages, memory
and checkpoints scans, the Chrome trace's threads and the TensorBoard rows. Only small lookups (the
process table, the manifest, the DataLoader's configuration) stay on DuckDB.

``holoprof export RUN --format chrome|tensorboard --engine dask`` reads spans, samples and I/O
operations through Dask partitions: the cluster reads and filters every chunk, a few at a time, and
the client spools them to a temporary Parquet file that DuckDB sorts and writes as events the way it
does the run's views (spilling to disk), so the file is the same, byte for byte, as the DuckDB
engine's and memory stays flat (:meth:`DaskEngine.sorted_source`).

Every chunk file is one partition, read by :func:`read_chunk` with the run's filters (time window,
ranks, steps) pushed into the Parquet read, and with the columns a chunk lacks filled with nulls (as
DuckDB's ``union_by_name`` does). The per-process aggregations read only the chunk files that can
hold the process's spans — those whose Parquet statistics of ``pid`` include it, in practice the
files of its own folder — so a report of many ranks makes one pass over the spans in all, not one
per rank. The workers of an existing cluster need holoprof installed and the run at the same path
(a shared file system).
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from holoprof import model
from holoprof.analyze.engine import Aggregation, Engine, sub, used_params
from holoprof.errors import HoloprofError, MissingExtraError
from holoprof.store.layout import host_of
from holoprof.store.reader import TIME_COLUMNS, Batch, Bound, Filter, Run, _sql_str

#: Chunks an export reads on the cluster at a time.
EXPORT_IN_FLIGHT = 2
_TIME_COL = {"spans": "start_ns", "samples": "ts_ns", "io_files": "ts_ns", "io_ops": "start_ns"}
#: Partial results combined per task in the tree reduction of an :class:`Aggregation`.
SPLIT_EVERY = 8
#: Rows of the table read per partition after the shuffle of an :class:`Aggregation`.
SHUFFLE_ROWS = 1_000_000


def _table_rows(tbl: Any) -> list[tuple[Any, ...]]:
    cols = [tbl.column(i).to_pylist() for i in range(tbl.num_columns)]
    return list(zip(*cols, strict=True)) if cols else []


_worker = threading.local()


def sql_tables(parts: list[Any], sql: str, params: dict[str, Any]) -> Any:
    """``sql`` over the concatenation of ``parts`` (pandas frames or Arrow tables) as ``{t}``, with
    DuckDB, as an Arrow table: a stage of an :class:`Aggregation` on a worker."""
    import duckdb  # lazy: DuckDB, in the worker process
    import pyarrow as pa

    tables = [p if isinstance(p, pa.Table) else pa.Table.from_pandas(p, preserve_index=False) for p in parts]
    tbl = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    con = getattr(_worker, "con", None)
    if con is None:  # one connection per worker thread: opening one costs more than a small stage
        con = _worker.con = duckdb.connect(":memory:")
        con.execute("SET threads TO 1")
    name = f"_hp_t_{uuid.uuid4().hex}"
    con.register(name, tbl)
    try:
        q = sub(sql, name)
        return con.sql(q, params=used_params(q, params)).to_arrow_table()
    finally:
        con.unregister(name)


def sql_chain(parts: list[Any], sqls: list[str], params: dict[str, Any]) -> Any:
    """:func:`sql_tables` of each query of ``sqls`` over the result of the one before."""
    for sql in sqls:
        parts = [sql_tables(parts, sql, params)]
    return parts[0]


def sql_frame(pdf: Any, sql: str, params: dict[str, Any]) -> Any:
    """:func:`sql_tables` over one partition, as an Arrow-backed pandas frame."""
    import pandas as pd  # lazy: pandas, for dask partitions only

    return sql_tables([pdf], sql, params).to_pandas(types_mapper=pd.ArrowDtype)


def _import_dask() -> Any:
    try:
        import dask.dataframe as dd  # lazy: the optional dask extra
        import distributed  # noqa: F401
    except ImportError:
        raise MissingExtraError("the Dask engine", "dask", "dask[dataframe] distributed")
    return dd


@contextmanager
def client(scheduler: Any = None, workers: int = 2) -> Iterator[Any]:
    """A dask.distributed client: on ``scheduler`` if given (an address such as
    ``tcp://host:8786``, or a ``distributed.Client`` of the caller's, left open), else on a local
    cluster of ``workers`` worker processes, closed on exit."""
    _import_dask()
    from distributed import Client, LocalCluster  # lazy: the optional dask extra

    # the shuffle of a distributed sort logs every start and end at WARNING level: not news for users
    logging.getLogger("distributed.shuffle").setLevel(logging.ERROR)
    if scheduler is not None and not isinstance(scheduler, str):
        if not isinstance(scheduler, Client):
            raise HoloprofError(
                f"scheduler must be an address such as tcp://HOST:8786 or a distributed.Client, "
                f"not {type(scheduler).__name__}"
            )
        yield scheduler
        return
    if scheduler:
        refused = _refused(scheduler)
        if refused:
            raise HoloprofError(
                f"cannot reach the Dask scheduler at {scheduler} ({refused}); check the address"
            )
        try:
            c = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise HoloprofError(f"cannot reach the Dask scheduler at {scheduler} ({exc}); check the address")
        try:
            yield c
        finally:
            c.close()
        return
    # dashboard on a free port: the default (8787, even with no dashboard) warns when it is taken
    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


def _refused(address: str) -> str | None:
    """Why a ``tcp://HOST:PORT`` scheduler address cannot be reached at all (no such host, nothing
    listening: the client would retry for its whole timeout), else None (another protocol, or a host
    that answers or is merely slow: the client decides)."""
    m = re.fullmatch(r"tcp://\[?([^\]/]+?)\]?:(\d+)/?", address.strip())
    if not m:
        return None
    try:
        with socket.create_connection((m.group(1), int(m.group(2))), timeout=3):
            return None
    except ConnectionRefusedError:
        return "connection refused: nothing listens there"
    except socket.gaierror as exc:
        return f"unknown host {m.group(1)!r}: {exc.strerror or exc}"
    except OSError:
        return None


def _filter_expr(table: str, f: Filter, shift: int = 0) -> Any:
    """The run's filter for ``table`` as a pyarrow expression (None: keep everything); the same
    predicates as :meth:`Filter.sql` (``shift``: the clock offset of the rows' host)."""
    import pyarrow.compute as pc  # lazy: pyarrow (about 27 MiB) only where a table is built

    conds = []
    t_col = _TIME_COL.get(table)
    if t_col is not None:
        if f.start_s is not None:
            conds.append(pc.field(t_col) >= f.run_start_ns + int(f.start_s * 1e9) + shift)
        if f.end_s is not None:
            conds.append(pc.field(t_col) <= f.run_start_ns + int(f.end_s * 1e9) + shift)
    if f.ranks is not None and table != "processes":
        conds.append(pc.field("rank").isin([int(r) for r in f.ranks]))
    if f.steps is not None and table == "spans":
        a, b = f.steps
        st = pc.field("step")
        conds.append(((st >= int(a)) & (st <= int(b))) | (st < 0))
    if not conds:
        return None
    expr = conds[0]
    for c in conds[1:]:
        expr = expr & c
    return expr


def _filter_columns(table: str, f: Filter) -> set[str]:
    cols = set()
    if table in _TIME_COL and (f.start_s is not None or f.end_s is not None):
        cols.add(_TIME_COL[table])
    if f.ranks is not None and table != "processes":
        cols.add("rank")
    if f.steps is not None and table == "spans":
        cols.add("step")
    return cols


def read_chunk(
    path: str,
    table: str,
    names: list[str],
    where: Filter,
    arrow: bool,
    bounds: tuple[Bound, ...] = (),
    head: bool = False,
    shift: int = 0,
) -> Any:
    """One chunk file as a pandas DataFrame of the columns ``names`` (model types; missing columns are nulls),
    filtered by ``where`` and by ``bounds`` (``(column, operator, value)`` conditions, pushed into
    the read so row groups outside them are skipped). ``arrow``: Arrow-backed columns (exact ints
    and nulls) instead of NumPy. ``head``: the first rows only, unfiltered (enough for the
    frame's types: a dask ``meta``). ``shift``: the clock offset of the file's host, taken off its
    times as :class:`~holoprof.store.reader.Run`'s views do (``where`` and ``bounds`` are on the
    aligned times)."""
    import pandas as pd  # lazy: pandas, for dask partitions only
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    columns = names  # (not called `columns`: dask would push its own projection into it)
    schema = model.arrow_schema(table)
    have = set(pq.read_schema(path).names)
    times = TIME_COLUMNS.get(table, ()) if shift else ()
    bounds = tuple((c, op, v + shift if c in times else v) for c, op, v in bounds)
    fcols = _filter_columns(table, where) | {c for c, _, _ in bounds}
    need = sorted((set(columns) | fcols) & have)
    expr = _filter_expr(table, where, shift)
    if bounds:
        window = pq.filters_to_expression([list(bounds)])
        expr = window if expr is None else expr & window
    pushed = expr is not None and fcols <= have
    first = next(pq.ParquetFile(path).iter_batches(batch_size=64, columns=need), None) if head else None
    if first is not None:
        tbl = pa.Table.from_batches([first])
        expr = None
    else:
        tbl = pq.read_table(path, columns=need, filters=expr if pushed else None)
    n = tbl.num_rows
    names_all = sorted(set(need) | set(columns) | fcols)
    full = pa.Table.from_arrays(
        [
            tbl.column(c).cast(schema.field(c).type) if c in have else pa.nulls(n, schema.field(c).type)
            for c in names_all
        ],
        names=names_all,
    )
    if expr is not None and not pushed:
        full = full.filter(expr)
    full = full.select(columns)
    for c in times:
        if c in columns:  # 0 stands for "not yet" (a process's end while it runs): kept
            col = full.column(c)
            aligned = pc.if_else(pc.equal(col, 0), col, pc.subtract(col, pa.scalar(shift, col.type)))
            full = full.set_column(full.schema.get_field_index(c), c, aligned)
    if arrow:
        return full.to_pandas(types_mapper=pd.ArrowDtype)
    return full.to_pandas()


def _read_aligned(
    path: str, shift: int, table: str, names: list[str], where: Filter, arrow: bool, bounds: tuple[Bound, ...]
) -> Any:
    """:func:`read_chunk` of a file whose host's clock is ``shift`` ns ahead."""
    return read_chunk(path, table, names, where, arrow, bounds, shift=shift)


def _arrow_table(pdf: Any) -> Any:
    """An Arrow-backed partition as an Arrow table (its columns are not copied)."""
    import pyarrow as pa  # lazy: pyarrow (about 27 MiB) only where a table is built

    return pa.Table.from_pandas(pdf, preserve_index=False)


class DaskEngine(Engine):
    """The engine on a Dask cluster (``dask_client``): every :class:`Aggregation` per partition on
    the workers, merged there."""

    name = "dask"

    def __init__(self, run: Run, dask_client: Any) -> None:
        self.dd = _import_dask()
        self.run = run
        self.client = dask_client
        self._metas: dict[tuple[str, tuple[str, ...], bool], Any] = {}
        self._pids: list[tuple[str, int | None, int | None]] | None = None
        #: :class:`Aggregation` names run on the cluster, with how many times
        self.aggregations: Counter[str] = Counter()

    def read(
        self,
        table: str,
        columns: list[str],
        arrow: bool = False,
        files: list[str] | None = None,
        bounds: tuple[Bound, ...] = (),
    ) -> Any:
        """``table`` as a dask DataFrame (one partition per chunk file, the run's filters applied),
        or None when the run has no chunk of it. ``files``: only these chunk files of the table;
        ``bounds``: only the rows within these (see :func:`read_chunk`)."""
        files = list(self.run.chunks.files[table] if files is None else files)
        if not files:
            return None
        where = self.run.filter
        key = (table, tuple(columns), arrow)
        meta = self._metas.get(key)
        if meta is None:
            # a deep copy: a slice would keep the whole chunk's buffers alive with the expression
            meta = read_chunk(files[0], table, columns, where, arrow, head=True).iloc[:0].copy(deep=True)
            self._metas[key] = meta
        shifts = [self.run.shift_ns(host_of(f)) for f in files]
        return self.dd.from_map(
            _read_aligned,
            files,
            shifts,
            args=(table, columns, where, arrow, bounds),
            meta=meta,
            label=f"read-{table}",
        )

    def _pid_ranges(self) -> list[tuple[str, int | None, int | None]]:
        """Every spans chunk file with the smallest and largest ``pid`` its row groups' statistics
        give (None, None where a row group has no usable statistics: the file may hold any pid)."""
        if self._pids is None:
            import pyarrow.parquet as pq  # lazy: pyarrow (about 27 MiB) only where a table is built

            out: list[tuple[str, int | None, int | None]] = []
            for path in self.run.chunks.files["spans"]:
                md = pq.ParquetFile(path).metadata
                lo: int | None = None
                hi: int | None = None
                known = True
                for i in range(md.num_row_groups):
                    rg = md.row_group(i)
                    stats = None
                    for j in range(rg.num_columns):
                        col = rg.column(j)
                        if col.path_in_schema == "pid":
                            stats = col.statistics
                            break
                    if stats is None:
                        if "pid" not in md.schema.names:
                            continue  # no pid column: null pids, never one of a process
                        known = False
                        break
                    if rg.num_rows == 0 or stats.null_count == rg.num_rows:
                        continue
                    if not stats.has_min_max:
                        known = False
                        break
                    a, b = int(stats.min), int(stats.max)
                    lo = a if lo is None else min(lo, a)
                    hi = b if hi is None else max(hi, b)
                if not known:
                    out.append((path, None, None))
                elif lo is not None and hi is not None:
                    out.append((path, lo, hi))
            self._pids = out
        return self._pids

    def _files_of(self, pids: tuple[int, ...]) -> list[str]:
        """The spans chunk files whose pid statistics can hold one of ``pids``."""
        return [
            p
            for p, lo, hi in self._pid_ranges()
            if lo is None or hi is None or any(lo <= x <= hi for x in pids)
        ]

    def aggregate(self, agg: Aggregation) -> list[tuple[Any, ...]]:
        """``agg`` on the cluster (see :class:`Aggregation`): the rows DuckDB gives for it."""
        return _table_rows(self.aggregate_table(agg))

    def aggregate_batches(self, agg: Aggregation) -> Iterator[Batch]:
        """``agg`` on the cluster, as NumPy batches of its Arrow result."""
        import nanoarrow as na  # lazy: read with the Arrow result

        stream = na.c_array_stream(self.aggregate_table(agg))
        try:
            for array in stream:
                if array.length:
                    yield Batch(array)
        finally:
            stream.release()

    def aggregate_table(self, agg: Aggregation) -> Any:
        """``agg`` on the cluster, as an Arrow table."""
        import dask  # lazy: the optional extra
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = list(self.run.chunks.files[agg.table])
        if agg.pids is not None and agg.table == "spans":
            files = self._files_of(agg.pids)
        df = (
            self.read(agg.table, list(agg.columns), arrow=True, files=files, bounds=agg.bounds)
            if files
            else None
        )
        if df is None:  # nothing to read: the stages run here on an empty table, as on DuckDB
            schema = model.arrow_schema(agg.table)
            empty = pa.schema([schema.field(c) for c in agg.columns]).empty_table()
            out = sql_tables([empty], agg.chunk, agg.params)
            if agg.shuffle:
                assert agg.group is not None
                out = sql_tables([out], agg.group, agg.params)
            return sql_tables([out], agg.final_sql(), agg.params)
        tag = f"holoprof-{agg.name}"
        meta = sql_frame(df._meta, agg.chunk, agg.params)
        parts = df.map_partitions(sql_frame, agg.chunk, agg.params, meta=meta, token=tag)
        if agg.shuffle:
            assert agg.group is not None
            # about SHUFFLE_ROWS rows of the table per shuffled partition (each is a task's overhead)
            rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
            out_parts = min(parts.npartitions, max(1, math.ceil(rows / SHUFFLE_ROWS)))
            parts = parts.shuffle(on=list(agg.shuffle), npartitions=out_parts)
            meta = sql_frame(meta, agg.group, agg.params)
            parts = parts.map_partitions(sql_frame, agg.group, agg.params, meta=meta, token=f"{tag}-group")
        level: list[Any] = list(parts.to_delayed())
        run_id = uuid.uuid4().hex[:12]
        if agg.combine is not None and not agg.shuffle:
            depth = 0
            while len(level) > SPLIT_EVERY:
                level = [
                    dask.delayed(sql_tables)(
                        level[i : i + SPLIT_EVERY],
                        agg.combine,
                        agg.params,
                        dask_key_name=f"{tag}-combine-{run_id}-{depth}-{i}",
                    )
                    for i in range(0, len(level), SPLIT_EVERY)
                ]
                depth += 1
        last = [agg.final_sql()] if agg.combine is None or agg.shuffle else [agg.combine, agg.final_sql()]
        final = dask.delayed(sql_chain)(level, last, agg.params, dask_key_name=f"{tag}-final-{run_id}")
        tbl = self.client.compute(final, sync=True)
        self.aggregations[agg.name] += 1
        return tbl

    # Not an Aggregation: a sort over every partition is not a merge of partial results. The rows go
    # to a file as they are read, and the exporter sorts that file with DuckDB as it sorts the views.
    @contextmanager
    def sorted_source(
        self, table: str, columns: tuple[str, ...], bounds: tuple[Bound, ...]
    ) -> Iterator[tuple[str, tuple[Bound, ...]] | None]:
        """Where the exporter's DuckDB queries read ``columns`` of the rows of ``table`` within
        ``bounds`` (None when the run has no such table): a Parquet file in the run's temporary
        folder, removed at the end, which the exporter sorts as it sorts the DuckDB engine's views
        (:func:`~holoprof.exports.chrome_trace.sorted_events`, spilling to disk).

        The cluster reads and filters every chunk once (EXPORT_IN_FLIGHT chunks at a time, skipping
        the row groups outside ``bounds``) and the client appends each to the file, so neither the
        client nor a worker holds more than a few chunks however long the run is."""
        import dask  # lazy: the optional extra
        import pyarrow.parquet as pq

        df = self.read(table, list(columns), arrow=True, bounds=bounds)
        if df is None:
            yield None
            return
        parts = [dask.delayed(_arrow_table)(p) for p in df.to_delayed()]
        path = os.path.join(self.run.temp_dir, f"export-{table}-{uuid.uuid4().hex[:12]}.parquet")
        writer = None
        try:
            for i in range(0, len(parts), EXPORT_IN_FLIGHT):
                for fut in self.client.compute(parts[i : i + EXPORT_IN_FLIGHT]):
                    piece = fut.result()
                    fut.release()
                    if piece.num_rows:
                        if writer is None:
                            writer = pq.ParquetWriter(path, piece.schema)
                        writer.write_table(piece)
                    del piece
            if writer is None:
                yield None
                return
            writer.close()
            writer = None
            yield f"read_parquet({_sql_str(path)})", ()
        finally:
            if writer is not None:
                writer.close()
            try:
                os.remove(path)
            except OSError:
                pass
