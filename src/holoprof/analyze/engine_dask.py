"""The Dask engine: the analyses and exports on dask.dataframe, for runs that outgrow one machine.

``holoprof report RUN --engine dask [--scheduler ADDRESS]`` (or ``holoprof.analyze(run,
engine="dask")``) reads the same Parquet files with ``dask.dataframe`` on a ``dask.distributed``
cluster — a local one by default, or the scheduler given — and computes steps, the phase breakdown
and resource summaries there, with the same definitions as the DuckDB queries (medians and p90
interpolated the same way), so both engines give the same numbers. The heavy part (scanning and
joining every span) runs on the cluster; only per-step sums of the main loop come back. The I/O and
communication sections run their scans on the cluster too (:class:`Aggregation`: the same DuckDB
SQL on every partition, partial results merged on the cluster): the last counters of every file and
the read bandwidth over time from ``io_files``; per collective, per step of every rank (the union of
its communication, the exposed part, the bytes), the DDP buckets and the ranks' last activity from
``spans``. Only small lookups (the process table, the manifest) stay on DuckDB, as do the memory,
stages and checkpoints sections.

``holoprof export RUN --format chrome|tensorboard --engine dask`` reads spans, samples and I/O
operations through Dask partitions: the cluster reads and filters every chunk, a few at a time, and
the client spools them to a temporary Parquet file that DuckDB sorts and writes as events the way it
does the run's views (spilling to disk), so the file is the same, byte for byte, as the DuckDB
engine's and memory stays flat. The per-step table of the TensorBoard export is computed on the
cluster one window of steps at a time. Only the small process table is read with DuckDB.

Every chunk file is one partition, read by :func:`read_chunk` with the run's filters (time window,
ranks, steps) pushed into the Parquet read, and with the columns a chunk lacks filled with nulls (as
DuckDB's ``union_by_name`` does). The per-process analyses (steps, phases, epochs) read only the
chunk files that can hold the process's spans — those whose Parquet statistics of ``pid`` include
it, in practice the files of its own folder — so a report of many ranks makes one pass over the
spans in all, not one per rank. The workers of an existing cluster need holoprof installed and
the run at the same path (a shared file system).
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from holoprof import model
from holoprof.analyze.resources import Resources, SeriesStat
from holoprof.analyze.steps import NS, PhaseStat, ProcKey, StepStats
from holoprof.errors import HoloprofError, MissingExtraError
from holoprof.store.reader import Bound, Filter, Run, scan_memory_limit, windows

#: Rows per batch of the per-step tables the exports read.
BATCH = 20_000
#: Steps whose per-step table is computed at a time (about 1 KiB of DuckDB memory per step).
STEP_WINDOW = 100_000

_PHASE_COLS = list(model.MEASURED_PHASES)
#: One value in this many rows of a chunk is sampled to cut a table into windows of a column.
WINDOW_SAMPLE = 512
#: Chunks an export reads on the cluster at a time.
EXPORT_IN_FLIGHT = 2
_TIME_COL = {"spans": "start_ns", "samples": "ts_ns", "io_files": "ts_ns", "io_ops": "start_ns"}
#: Partial results combined per task in the tree reduction of an :class:`Aggregation`.
SPLIT_EVERY = 8
#: Rows of the table read per partition after the shuffle of an :class:`Aggregation`.
SHUFFLE_ROWS = 1_000_000


@dataclass
class Aggregation:
    """A SQL aggregation over one table that either engine runs, with the same result rows.

    Every stage is a DuckDB query over the relation ``{t}``. ``chunk`` reads the ``columns`` of
    ``table`` (the run's filters applied); the result is ``final`` over what the stages before it
    produced, ordered by ``order`` (a total order: both engines return the rows in the same order).

    * DuckDB: ``final(group(chunk(table)))`` in one query over the whole table (``group`` only when
      ``shuffle`` is set).
    * Dask: ``chunk`` runs on every partition (chunk file) on the workers. With ``shuffle``, its rows
      are shuffled on those columns (rows with equal keys meet in one partition) and ``group`` runs on
      every shuffled partition. Else ``combine`` (same columns in and out; None: a concatenation)
      merges the partial results in a tree on the cluster, and once more before ``final``. ``final``
      runs on a worker too; only its rows come back.

    So ``chunk`` must be decomposable: ``combine`` over the chunks of the parts of a table equals the
    chunk of the whole table (sums of sums, max of maxima, arg_max over the parts' winners with
    their keys), and ``group`` must need only rows of equal ``shuffle`` keys together. Integers are
    exact on both paths; sums are cast to BIGINT so that the types match too. Each stage is the same
    SQL text on both engines: one definition of every number.
    """

    name: str
    table: str
    columns: tuple[str, ...]
    chunk: str
    final: str = "SELECT * FROM {t}"
    order: str = ""
    combine: str | None = None
    shuffle: tuple[str, ...] = ()
    group: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    #: spans only: the rows are of these pids, so the Dask engine reads only the chunk files whose
    #: statistics can hold them
    pids: tuple[int, ...] | None = None

    def final_sql(self) -> str:
        return self.final + (f" ORDER BY {self.order}" if self.order else "")


def _sub(sql: str, rel: str) -> str:
    return sql.replace("{t}", rel)


def _params(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters ``sql`` uses (DuckDB refuses one it does not)."""
    return {k: v for k, v in params.items() if re.search(rf"\${re.escape(k)}\b", sql)}


def duckdb_rows(run: Run, agg: Aggregation) -> list[tuple[Any, ...]]:
    """``agg`` on the DuckDB engine: one query over the run's view of the table."""
    cols = ", ".join(agg.columns)
    ctes = [f"_hp_in AS (SELECT {cols} FROM {agg.table})", f"_hp_chunk AS ({_sub(agg.chunk, '_hp_in')})"]
    last = "_hp_chunk"
    if agg.shuffle:
        assert agg.group is not None
        ctes.append(f"_hp_group AS ({_sub(agg.group, '_hp_chunk')})")
        last = "_hp_group"
    ctes.append(f"_hp_final AS ({_sub(agg.final, last)})")
    sql = (
        "WITH "
        + ", ".join(ctes)
        + " SELECT * FROM _hp_final"
        + (f" ORDER BY {agg.order}" if agg.order else "")
    )
    # on a cursor of its own: a result left half-read on the run's connection must not block it
    cur = run.con.cursor()
    try:
        # most aggregations have few groups: DuckDB then needs little more than its readers
        return run.lean(
            lambda: cur.execute(sql, _params(sql, agg.params)).fetchall(),
            scan_memory_limit(run.threads),
        )
    finally:
        cur.close()


def aggregate(run: Run, ctx: dict[str, Any] | None, agg: Aggregation) -> list[tuple[Any, ...]]:
    """``agg`` on the report's engine: on the Dask cluster when ``ctx["engine"]`` is a
    :class:`DaskEngine`, else with DuckDB."""
    eng = (ctx or {}).get("engine")
    if isinstance(eng, DaskEngine) and eng.run is run:
        return eng.aggregate(agg)
    return duckdb_rows(run, agg)


def _table_rows(tbl: Any) -> list[tuple[Any, ...]]:
    cols = [tbl.column(i).to_pylist() for i in range(tbl.num_columns)]
    return list(zip(*cols, strict=True)) if cols else []


_worker = threading.local()


def sql_tables(parts: list[Any], sql: str, params: dict[str, Any]) -> Any:
    """``sql`` over the concatenation of ``parts`` (pandas frames or Arrow tables) as ``{t}``, with
    DuckDB, as an Arrow table: a stage of an :class:`Aggregation` on a worker."""
    import duckdb
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
        q = _sub(sql, name)
        return con.sql(q, params=_params(q, params)).to_arrow_table()
    finally:
        con.unregister(name)


def sql_chain(parts: list[Any], sqls: list[str], params: dict[str, Any]) -> Any:
    """:func:`sql_tables` of each query of ``sqls`` over the result of the one before."""
    for sql in sqls:
        parts = [sql_tables(parts, sql, params)]
    return parts[0]


def sql_frame(pdf: Any, sql: str, params: dict[str, Any]) -> Any:
    """:func:`sql_tables` over one partition, as an Arrow-backed pandas frame."""
    import pandas as pd

    return sql_tables([pdf], sql, params).to_pandas(types_mapper=pd.ArrowDtype)


def _import_dask() -> Any:
    try:
        import dask.dataframe as dd
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
    from distributed import Client, LocalCluster

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


def _filter_expr(table: str, f: Filter) -> Any:
    """The run's filter for ``table`` as a pyarrow expression (None: keep everything); the same
    predicates as :meth:`Filter.sql`."""
    import pyarrow.compute as pc

    conds = []
    t_col = _TIME_COL.get(table)
    if t_col is not None:
        if f.start_s is not None:
            conds.append(pc.field(t_col) >= f.run_start_ns + int(f.start_s * 1e9))
        if f.end_s is not None:
            conds.append(pc.field(t_col) <= f.run_start_ns + int(f.end_s * 1e9))
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
) -> Any:
    """One chunk file as a pandas DataFrame of the columns ``names`` (model types; missing columns are nulls),
    filtered by ``where`` and by ``bounds`` (``(column, operator, value)`` conditions, pushed into
    the read so row groups outside them are skipped). ``arrow``: Arrow-backed columns (exact ints
    and nulls) instead of NumPy. ``head``: the first rows only, unfiltered (enough for the
    frame's types: a dask ``meta``)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = names  # (not called `columns`: dask would push its own projection into it)
    schema = model.arrow_schema(table)
    have = set(pq.read_schema(path).names)
    fcols = _filter_columns(table, where) | {c for c, _, _ in bounds}
    need = sorted((set(columns) | fcols) & have)
    expr = _filter_expr(table, where)
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
    if arrow:
        return full.to_pandas(types_mapper=pd.ArrowDtype)
    return full.to_pandas()


def _fmean(values: Any) -> float:
    """The mean of a column's non-null values with an exactly rounded sum (0 when there is none), as
    DuckDB's ``favg`` takes it (see :func:`holoprof.analyze.resources.resources`)."""
    v = values.dropna().to_numpy(dtype="float64")
    return math.fsum(v.tolist()) / len(v) if len(v) else 0.0


def _arrow_table(pdf: Any) -> Any:
    """An Arrow-backed partition as an Arrow table (its columns are not copied)."""
    import pyarrow as pa

    return pa.Table.from_pandas(pdf, preserve_index=False)


def _every_nth(pdf: Any, col: str, n: int) -> Any:
    """Every ``n``-th value of ``col`` in ``pdf``, sorted: a sample of its distribution in which
    each value stands for ``n`` rows."""
    import numpy as np
    import pandas as pd

    v = np.sort(pdf[col].dropna().to_numpy(dtype="int64"))
    return pd.DataFrame({col: v[n - 1 :: n]})


class DaskEngine:
    def __init__(self, run: Run, dask_client: Any) -> None:
        self.dd = _import_dask()
        self.run = run
        self.client = dask_client
        self._metas: dict[tuple[str, tuple[str, ...], bool], Any] = {}
        self._span_cols = ["host", "pid", "rank", "tid", "kind", "name", "start_ns", "end_ns", "step"]
        self.spans = self.read("spans", self._span_cols)
        self._pids: list[tuple[str, int | None, int | None]] | None = None
        self.samples = self.read("samples", ["ts_ns", "name", "value", "target_pid"])
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
        return self.dd.from_map(
            read_chunk, files, args=(table, columns, where, arrow, bounds), meta=meta, label=f"read-{table}"
        )

    def _pid_ranges(self) -> list[tuple[str, int | None, int | None]]:
        """Every spans chunk file with the smallest and largest ``pid`` its row groups' statistics
        give (None, None where a row group has no usable statistics: the file may hold any pid)."""
        if self._pids is None:
            import pyarrow.parquet as pq

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

    def _spans_of(self, proc: ProcKey, bounds: tuple[Bound, ...] = ()) -> Any:
        """The spans of one process (within ``bounds``): read from the chunk files that can hold
        its pid only, then filtered by host and pid."""
        files = self._files_of((proc.pid,))
        sp = self.read("spans", self._span_cols, files=files, bounds=bounds)
        if sp is None:  # no file can hold it: an empty frame of the same columns
            sp = self.spans
        return sp[(sp.host == proc.host) & (sp.pid == proc.pid)]

    # -- the analyses ------------------------------------------------------------------------------
    def aggregate(self, agg: Aggregation) -> list[tuple[Any, ...]]:
        """``agg`` on the cluster (see :class:`Aggregation`): the rows DuckDB gives for it."""
        import dask
        import pyarrow as pa
        import pyarrow.parquet as pq

        files = list(self.run.chunks.files[agg.table])
        if agg.pids is not None and agg.table == "spans":
            files = self._files_of(agg.pids)
        df = self.read(agg.table, list(agg.columns), arrow=True, files=files) if files else None
        if df is None:  # nothing to read: the stages run here on an empty table, as on DuckDB
            schema = model.arrow_schema(agg.table)
            empty = pa.schema([schema.field(c) for c in agg.columns]).empty_table()
            out = sql_tables([empty], agg.chunk, agg.params)
            if agg.shuffle:
                assert agg.group is not None
                out = sql_tables([out], agg.group, agg.params)
            return _table_rows(sql_tables([out], agg.final_sql(), agg.params))
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
        return _table_rows(tbl)

    def step_processes(self) -> list[ProcKey]:
        if self.spans is None:
            return []
        sp = self.read("spans", ["host", "pid", "rank", "tid", "kind", "step"])
        steps = sp[sp.kind == "step"]
        per_tid = steps.groupby(["host", "pid", "tid"]).agg({"rank": "first", "step": "count"}).compute()
        if per_tid.empty:
            return []
        per_tid = per_tid.reset_index()
        out = []
        for (host, pid), g in per_tid.groupby(["host", "pid"]):
            n = int(g["step"].sum())
            best = g.sort_values(["step", "tid"], ascending=[False, True]).iloc[0]
            rank = int(g["rank"].iloc[0]) if g["rank"].notna().any() else -1
            out.append((n, rank, int(pid), ProcKey(str(host), int(pid), rank, int(best["tid"]))))
        out.sort(key=lambda x: (-x[0], x[1] if x[1] >= 0 else 1 << 30, x[2]))
        return [p for *_, p in out]

    def per_step(self, proc: ProcKey) -> Any:
        """The main loop's steps as a pandas DataFrame indexed by step (sorted): ``s``, ``e``,
        ``dur`` and the time of every phase in the step, ``other`` the rest — the DuckDB engine's
        ``per_step`` table, computed the same way."""
        return self._per_step(proc)[0]

    def _per_step(self, proc: ProcKey, bounds: tuple[Bound, ...] = ()) -> tuple[Any, int]:
        """:meth:`per_step` and the number of epoch spans of the process, in one computation;
        ``bounds``: of the spans read (a window of steps)."""
        import numpy as np
        import pandas as pd

        assert self.spans is not None
        mine = self._spans_of(proc, bounds)
        steps_dd = mine[(mine.kind == "step") & (mine.end_ns >= mine.start_ns)][
            ["step", "start_ns", "end_ns"]
        ].rename(columns={"start_ns": "s", "end_ns": "e"})
        phases = mine[(mine.kind == "phase") & (mine.tid == proc.tid)][["step", "name", "start_ns", "end_ns"]]
        # joined on the cluster (a computed table of steps would travel inside the task graph)
        joined = phases.merge(steps_dd, on="step", how="inner")
        joined = joined[(joined.end_ns > joined.s) & (joined.start_ns < joined.e)]
        joined = joined.assign(
            d=joined.end_ns.where(joined.end_ns < joined.e, joined.e)
            - joined.start_ns.where(joined.start_ns > joined.s, joined.s)
        )
        sums = joined.groupby(["step", "name"]).d.sum()
        epochs = (mine.kind == "epoch").sum()
        steps, sums, n_epochs = self.client.compute([steps_dd, sums, epochs], sync=True)
        table = sums.unstack(fill_value=0) if len(sums) else pd.DataFrame()
        per = steps.set_index("step").sort_index()
        per["dur"] = (per["e"] - per["s"]).astype("float64")
        for p in _PHASE_COLS:
            per[p] = table[p].reindex(per.index).fillna(0).astype("float64") if p in table else 0.0
        measured = per[_PHASE_COLS].sum(axis=1)
        f = np.where(
            (measured > per["dur"]) & (measured > 0), per["dur"] / measured.where(measured > 0, 1), 1.0
        )
        for p in _PHASE_COLS:
            per[p] = per[p] * f
        per["other"] = np.maximum(per["dur"] - measured * f, 0)
        return per, int(n_epochs)

    def step_stats(self, proc: ProcKey, timeline_points: int = 120) -> StepStats:
        import numpy as np

        per, epochs = self._per_step(proc)
        count = len(per)
        total = float(per["dur"].sum())
        phase_stats: dict[str, PhaseStat] = {}
        for p in (*_PHASE_COLS, "other"):
            tot = float(per[p].sum())
            phase_stats[p] = PhaseStat(
                fraction=tot / total if total > 0 else 0.0,
                total_s=tot / NS,
                median_s=float(per[p].median()) / NS if count else 0.0,
                median_share=float((per[p] / per["dur"].clip(lower=1)).median()) if count else 0.0,
                steps=int((per[p] != 0).sum()),
            )
        if total > 0:
            residue = 1.0 - sum(ps.fraction for ps in phase_stats.values())
            phase_stats["other"].fraction = max(0.0, phase_stats["other"].fraction + residue)
        first = int(per["s"].min()) if count else 0
        last = int(per["e"].max()) if count else 0
        wall = (last - first) / NS if last > first else 0.0
        timeline: list[dict[str, float]] = []
        if count:
            k = max(1, -(-count // timeline_points))
            grp = per.reset_index().assign(i=np.arange(count) // k).groupby("i")
            agg = grp.agg({"step": "min", "dur": "mean", **{p: "mean" for p in (*_PHASE_COLS, "other")}})
            for _, r in agg.iterrows():
                row = {"step": float(r["step"]), "step_s": float(r["dur"]) / NS}
                row.update({p: float(r[p]) / NS for p in (*_PHASE_COLS, "other")})
                timeline.append(row)
        return StepStats(
            proc=proc,
            count=count,
            median_s=float(per["dur"].median()) / NS if count else 0.0,
            p90_s=float(np.percentile(per["dur"], 90)) / NS if count else 0.0,
            mean_s=float(per["dur"].mean()) / NS if count else 0.0,
            per_s=(count / wall) if wall > 0 else 0.0,
            total_s=total / NS,
            first_start_ns=first,
            last_end_ns=last,
            phases=phase_stats,
            epochs=epochs,
            timeline=timeline,
        )

    def resources(self, points: int = 60) -> Resources:
        res = Resources()
        if self.samples is None:
            return res
        job = self.samples[self.samples.target_pid == -1]
        pdf = job.compute().reset_index(drop=True)
        if pdf.empty:
            return res
        for name, g in pdf.groupby("name"):
            last = float(g.loc[g["ts_ns"].idxmax(), "value"])
            res.stats[str(name)] = SeriesStat(
                str(name), _fmean(g["value"]), float(g["value"].max()), last, len(g)
            )
        t0, t1 = int(pdf["ts_ns"].min()), int(pdf["ts_ns"].max())
        res.start_ns = t0
        width = max(1, (t1 - t0) // max(1, points - 1) + 1)
        pdf = pdf.assign(b=(pdf["ts_ns"] - t0) // width)
        for (name, b), v in pdf.groupby(["name", "b"])["value"].agg(_fmean).items():
            res.series.setdefault(str(name), []).append((int(b) * width / 1e9, float(v)))
        res.gpus = sorted(
            {int(n.split(".")[1]) for n in res.stats if n.startswith("gpu.") and n.count(".") >= 2}
        )
        return res

    # -- exports: the same rows, in the same order, as the DuckDB queries of the exporters ----------
    def trace_threads(self, lo: int, hi: int) -> list[tuple[Any, ...]]:
        """``(host, pid, tid, steps, spans)`` of every thread with spans in [lo, hi], sorted."""
        sp = self.read("spans", ["host", "pid", "tid", "kind", "start_ns", "end_ns"])
        if sp is None:
            return []
        w = sp[(sp.end_ns >= lo) & (sp.start_ns <= hi)]
        w = w.assign(is_step=(w.kind == "step").astype("int64"))
        g = w.groupby(["host", "pid", "tid"]).is_step.agg(["sum", "count"]).compute()
        g = g.reset_index().sort_values(["host", "pid", "tid"])
        return [
            (str(h), int(p), int(t), int(s), int(n))
            for h, p, t, s, n in zip(g["host"], g["pid"], g["tid"], g["sum"], g["count"], strict=True)
        ]

    def _windows(self, df: Any, col: str, size: int) -> list[tuple[Bound, ...]]:
        """The windows of ``col`` that cut the rows of ``df`` into pieces of about ``size`` rows
        (:func:`~holoprof.store.reader.windows`), at quantiles of every WINDOW_SAMPLE-th value of
        each partition, sampled on the cluster."""
        import numpy as np
        import pandas as pd

        meta = pd.DataFrame({col: np.zeros(0, dtype="int64")})
        picked = df[[col]].map_partitions(
            _every_nth, col, WINDOW_SAMPLE, meta=meta, token=f"holoprof-sample-{col}"
        )
        vals = np.sort(self.client.compute(picked, sync=True)[col].to_numpy(dtype="int64"))

        def quantiles(qs: list[float]) -> list[int | None]:
            return [int(vals[min(len(vals) - 1, int(q * len(vals)))]) for q in qs] if len(vals) else []

        return windows(len(vals) * WINDOW_SAMPLE, col, quantiles, size)

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
        import dask
        import pyarrow.parquet as pq

        from holoprof.store.reader import _sql_str

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

    def job_sample_names(self) -> set[str]:
        if self.samples is None:
            return set()
        names = self.samples[self.samples.target_pid == -1].name.unique().compute()
        return {str(n) for n in names}

    def tensorboard_rows(self, proc: ProcKey, series: list[str]) -> Iterator[list[tuple[Any, ...]]]:
        """Per step of ``proc``, in step order: ``(step, end_ns, dur, <phases...>, other, <the last
        value of each series at or before the step's end, or None>)`` — the DuckDB export's rows,
        computed one window of steps (:data:`STEP_WINDOW`) at a time."""
        import numpy as np

        known: list[Any] = []  # per series: its times and values in time order (None: no samples)
        if series and self.samples is not None:
            job = self.samples[self.samples.target_pid == -1]
            job = job[job.name.isin(series)][["name", "ts_ns", "value"]].compute()
        for name in series:
            if self.samples is None:
                known.append(None)
                continue
            g = job[job["name"] == name].sort_values("ts_ns", kind="stable")
            known.append((g["ts_ns"].to_numpy(), g["value"].to_numpy()))
        phases = [*_PHASE_COLS, "other"]
        mine = self._spans_of(proc)
        steps = mine[(mine.kind == "step") & (mine.end_ns >= mine.start_ns)]
        for window in self._windows(steps, "step", STEP_WINDOW):
            per = self._per_step(proc, window)[0]
            columns = [per.index.to_numpy(), per["e"].to_numpy(), per["dur"].to_numpy()]
            columns += [per[p].to_numpy() for p in phases]
            last = [
                None if k is None else (np.searchsorted(k[0], per["e"].to_numpy(), side="right") - 1, k[1])
                for k in known
            ]
            for j in range(0, len(per), BATCH):  # Python objects for one batch at a time
                cols = [c[j : j + BATCH].tolist() for c in columns]
                for found in last:
                    if found is None:
                        cols.append([None] * len(cols[0]))
                    else:
                        idx, vals = found
                        cols.append([float(vals[i]) if i >= 0 else None for i in idx[j : j + BATCH].tolist()])
                yield list(zip(*cols, strict=True))
