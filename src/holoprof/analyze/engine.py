"""The engine seam: every analysis and export is written once, as SQL, and runs on either engine.

An analysis describes what it computes as an :class:`Aggregation` (DuckDB SQL in stages) and runs it
through an :class:`Engine`, which gives the same rows in the same order whichever engine it is:

* :class:`DuckDBEngine` (the default) runs the stages whole, as one DuckDB query over the run's
  views of its Parquet files;
* :class:`~holoprof.analyze.engine_dask.DaskEngine` (``--engine dask``) runs the first stage on every
  partition (chunk file) on a Dask cluster, with DuckDB on each partition, and merges the partial
  results with the later stages, on the cluster too.

What an engine offers is small: :meth:`Engine.aggregate` (the rows, as Python tuples),
:meth:`Engine.aggregate_batches` (the same rows as NumPy batches, for results of one row per step),
:meth:`Engine.sorted_source` (where DuckDB reads a table's rows to sort them for an export) and
:attr:`Engine.streams` (whether the spans can be read in file order, for the streamed step scan).
The analyses and exports (the process choice, the per-step table, step and phase statistics,
resources, the Chrome trace's threads, the TensorBoard rows and every report section) are written
against these, once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from holoprof.store.reader import Batch, Bound, Run, numpy_batches, scan_memory_limit


@dataclass
class Aggregation:
    """A SQL aggregation over one table that either engine runs, with the same result rows.

    Every stage is a DuckDB query over the relation ``{t}``. ``chunk`` reads the ``columns`` of
    ``table`` (the run's filters and ``bounds`` applied); the result is ``final`` over what the
    stages before it produced, ordered by ``order`` (a total order: both engines return the rows in
    the same order).

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
    #: only the rows within these (integer) bounds: pushed into the reads, so that row groups outside
    #: them are skipped
    bounds: tuple[Bound, ...] = ()
    #: DuckDB: the chunk stage is read again wherever a later stage reads it (each read skips row
    #: groups by the pushed filters), rather than held in memory once
    inline: bool = False

    def final_sql(self) -> str:
        """``final`` ordered by ``order`` (which names its output columns, as on DuckDB)."""
        return f"SELECT * FROM ({self.final}) ORDER BY {self.order}" if self.order else self.final


def sub(sql: str, rel: str) -> str:
    """``sql`` over the relation ``rel`` (for ``{t}``)."""
    return sql.replace("{t}", rel)


def step_windows(keys: str) -> str:
    """The window of each step of ``keys`` (e.g. ``host, pid, step``) in the relation ``{t}``: of
    several step spans with one index, the last to start. Columns: ``keys``, ``s``, ``e``."""
    return f"""SELECT {keys}, start_ns AS s, end_ns AS e FROM (
                SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY start_ns DESC, end_ns DESC) AS rn
                FROM {{t}} WHERE kind = 'step') WHERE rn = 1"""


def sql_value(v: str | int) -> str:
    """A literal of SQL: a quoted string, or an integer."""
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return str(int(v))


def rows_in(columns: tuple[str, ...], rows: Sequence[tuple[str | int, ...]]) -> str:
    """``(c1, c2) IN ((v1, v2), ...)``: a condition that keeps the rows whose columns are one of
    ``rows`` ("false" for none). DuckDB hashes the list: 512 ranks cost what one does, where an OR of
    512 terms is evaluated term by term on every row (10 s a scan of 1.2 M spans)."""
    if not rows:
        return "false"
    values = ", ".join("(" + ", ".join(sql_value(v) for v in r) + ")" for r in rows)
    return f"({', '.join(columns)}) IN ({values})"


def values_table(name: str, columns: tuple[str, ...], rows: Sequence[tuple[str | int, ...]]) -> str:
    """``(VALUES (...), ...) AS name(columns)``: ``rows`` as a table to join (one row of nulls for none)."""
    body = ", ".join("(" + ", ".join(sql_value(v) for v in r) + ")" for r in rows)
    body = body or "(" + ", ".join("NULL" for _ in columns) + ")"
    return f"(VALUES {body}) AS {name}({', '.join(columns)})"


def used_params(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters ``sql`` uses (DuckDB refuses one it does not)."""
    return {k: v for k, v in params.items() if re.search(rf"\${re.escape(k)}\b", sql)}


def bounds_condition(bounds: tuple[Bound, ...]) -> str:
    """Integer ``bounds`` as a SQL condition (``true`` for none)."""
    return " AND ".join(f'"{c}" {op} {int(v)}' for c, op, v in bounds) or "true"


def duckdb_sql(agg: Aggregation) -> str:
    """``agg`` as one DuckDB query over the run's view of its table."""
    cols = ", ".join(agg.columns)
    how = " NOT MATERIALIZED" if agg.inline else ""
    where = f" WHERE {bounds_condition(agg.bounds)}" if agg.bounds else ""
    ctes = [
        f"_hp_in AS{how} (SELECT {cols} FROM {agg.table}{where})",
        f"_hp_chunk AS{how} ({sub(agg.chunk, '_hp_in')})",
    ]
    last = "_hp_chunk"
    if agg.shuffle:
        assert agg.group is not None
        ctes.append(f"_hp_group AS ({sub(agg.group, '_hp_chunk')})")
        last = "_hp_group"
    ctes.append(f"_hp_final AS ({sub(agg.final, last)})")
    return (
        "WITH "
        + ", ".join(ctes)
        + " SELECT * FROM _hp_final"
        + (f" ORDER BY {agg.order}" if agg.order else "")
    )


class Engine:
    """How the analyses read a run: the interface both engines implement."""

    #: ``"duckdb"`` or ``"dask"`` (the report's ``engine``)
    name: str
    run: Run
    #: the run's DuckDB can read its spans in file order (the streamed step scan; DuckDB only)
    streams: bool = False

    def aggregate(self, agg: Aggregation) -> list[tuple[Any, ...]]:
        """The rows of ``agg``, in its order."""
        raise NotImplementedError

    def aggregate_batches(self, agg: Aggregation) -> Iterator[Batch]:
        """The rows of ``agg`` (numeric columns only) as NumPy batches, in its order."""
        raise NotImplementedError

    def sorted_source(
        self, table: str, columns: tuple[str, ...], bounds: tuple[Bound, ...]
    ) -> AbstractContextManager[tuple[str, tuple[Bound, ...]] | None]:
        """Where the run's DuckDB reads ``columns`` of the rows of ``table`` within ``bounds``, to sort
        them: ``(relation, bounds still to apply)``, or None when there are none."""
        raise NotImplementedError


class DuckDBEngine(Engine):
    """The default engine: DuckDB queries over the run's Parquet files."""

    name = "duckdb"
    streams = True

    def __init__(self, run: Run) -> None:
        self.run = run

    def aggregate(self, agg: Aggregation) -> list[tuple[Any, ...]]:
        sql = duckdb_sql(agg)
        # on a cursor of its own: a result left half-read on the run's connection must not block it
        cur = self.run.con.cursor()
        try:
            # most aggregations have few groups: DuckDB then needs little more than its readers
            return self.run.lean(
                lambda: cur.execute(sql, used_params(sql, agg.params)).fetchall(),
                scan_memory_limit(self.run.threads),
            )
        finally:
            cur.close()

    def aggregate_batches(self, agg: Aggregation) -> Iterator[Batch]:
        """Streamed from DuckDB, under the memory limit of the caller's (a result of one row per step
        may hold a hash table of steps: see :meth:`Run.lean`)."""
        sql = duckdb_sql(agg)
        cur = self.run.con.cursor()
        try:
            yield from numpy_batches(cur, sql, used_params(sql, agg.params))
        finally:
            cur.close()

    @contextmanager
    def sorted_source(
        self, table: str, columns: tuple[str, ...], bounds: tuple[Bound, ...]
    ) -> Iterator[tuple[str, tuple[Bound, ...]] | None]:
        """The run's view itself."""
        yield table, bounds


def engine_for(run: Run, engine: Engine | None) -> Engine:
    """``engine``, or the DuckDB engine of ``run`` when there is none."""
    return engine if engine is not None else DuckDBEngine(run)


def aggregate(run: Run, ctx: dict[str, Any] | None, agg: Aggregation) -> list[tuple[Any, ...]]:
    """``agg`` on the report's engine (``ctx["engine"]``: on the Dask cluster under ``--engine
    dask``), or with DuckDB when the context has no engine of this run."""
    eng = (ctx or {}).get("engine")
    if not isinstance(eng, Engine) or eng.run is not run:
        eng = DuckDBEngine(run)
    return eng.aggregate(agg)
