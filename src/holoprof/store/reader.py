"""Loading a run: DuckDB relations over the run's Parquet chunks.

``holoprof.load(RUN)`` returns a :class:`Run`. Its tables (``spans``, ``samples``, ``io_files``,
``io_ops``, ``processes``) are DuckDB relations (``.df()`` gives pandas, ``.arrow()`` Arrow), each with
exactly the columns of :data:`holoprof.model.COLUMNS` (the typed I/O counters of a run of the earlier
layout read from its JSON), and the views of :data:`VIEWS` (``io_file_totals``). Chunks that cannot be
read (the last chunk of a killed job, a footer that does not parse, a column of the wrong type) are
skipped and listed in ``Run.warnings``.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from holoprof import model
from holoprof.errors import HoloprofError, MissingExtraError, printable_text
from holoprof.store import clocks, convert, hosts, layout, native_dumps, rundir, safeio
from holoprof.store.pack import open_run

T = TypeVar("T")

#: A condition on one column, as pyarrow's ``filters`` take it: (column, operator, value).
Bound = tuple[str, str, Any]


def bounds_sql(bounds: tuple[Bound, ...]) -> tuple[str, list[Any]]:
    """``bounds`` as a SQL condition with ``?`` parameters, and the parameters."""
    return " AND ".join(f'"{c}" {op} ?' for c, op, _ in bounds) or "true", [v for *_, v in bounds]


def windows(
    rows: int, col: str, quantiles: Callable[[list[float]], Sequence[int | None]], size: int
) -> list[tuple[Bound, ...]]:
    """The windows of the integer column ``col`` that cut ``rows`` rows into pieces of about
    ``size``, as bounds: cut at the column's ``quantiles(qs)``. Rows of one value fall in one window
    (which is larger only where more rows share a value), so a table read window by window, each
    sorted by ``col`` first, is read in order with memory for one window."""
    k = -(-rows // size)
    cuts = sorted({int(c) for c in quantiles([i / k for i in range(1, k)]) if c is not None}) if k > 1 else []
    edges: list[int | None] = [None, *cuts, None]
    out = []
    for a, b in itertools.pairwise(edges):
        lower: list[Bound] = [(col, ">=", a)] if a is not None else []
        upper: list[Bound] = [(col, "<", b)] if b is not None else []
        out.append((*lower, *upper))
    return out


#: The time columns of each table: a host's clock offset is taken off them as the run is read.
TIME_COLUMNS: dict[str, tuple[str, ...]] = {
    "spans": ("start_ns", "end_ns"),
    "samples": ("ts_ns",),
    "io_files": ("ts_ns",),
    "io_ops": ("start_ns", "end_ns"),
    "processes": ("start_ns", "end_ns", "updated_ns"),
}

#: The views a loaded run adds to its tables.
VIEWS: tuple[str, ...] = ("io_file_totals",)
#: counters that mean nothing summed over processes (a mode, alignments, the most common strides and
#: access sizes, which rank was fastest): left out of :meth:`Run.file_totals`
_NOT_ADDITIVE = ("_MODE", "ALIGNMENT", "STRIDE", "ACCESS", "_RANK")


def _old_layout(path: str) -> bool:
    """A chunk written before the table folders (``<host>-<pid>/<table>-*.parquet``)."""
    return layout.partition_of(path) is None


#: A small table spread over more files than this is read once, when the run loads, into DuckDB's
#: memory, not at every query: an import of 2,048 ranks has a file of one row per process, and each
#: query over a view opens every file again.
READ_ONCE_FILES = 16
#: ... if its files hold no more than this many bytes (and only tables small by nature: processes and
#: the I/O counters, never the spans, samples or I/O operations)
READ_ONCE_BYTES = 256 * 2**20


def _read_once(table: str, files: list[str]) -> bool:
    if table not in ("processes", "io_files") or len(files) <= READ_ONCE_FILES:
        return False
    total = 0
    for f in files:
        try:
            total += os.stat(f).st_size
        except OSError:
            return False
        if total > READ_ONCE_BYTES:
            return False
    return True


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


class Run:
    """A loaded run. Cheap to create: nothing is read until a query runs."""

    def __init__(
        self,
        path: str,
        manifest: dict[str, Any],
        chunks: layout.Chunks,
        threads: int | None = None,
        where: Filter | None = None,
    ) -> None:
        try:
            import duckdb  # lazy: DuckDB loads only where a run is queried
        except ImportError:  # pragma: no cover - duckdb is a core dependency
            raise MissingExtraError("loading a run", "duckdb", "duckdb")
        self.path = path
        #: where the chunks are read: ``path``, or a UTF-8 alias of it (:func:`safeio.utf8_path`)
        self.root = safeio.utf8_path(path)
        self.manifest = manifest
        self.chunks = chunks
        self.warnings: list[str] = []
        if chunks.bad:
            rel = [self.relpath(p) for p in chunks.bad]
            self.warnings.append(
                f"skipped {len(rel)} unreadable chunk(s) (truncated: the process was probably killed while "
                f"writing): {', '.join(rel[:5])}{' ...' if len(rel) > 5 else ''}"
            )
        self.filter = where or Filter()
        self.con = duckdb.connect(":memory:")
        self.threads = threads or max(1, min(os.cpu_count() or 1, 8))
        self.con.execute(f"SET threads TO {self.threads}")
        # Bounded memory on large runs: DuckDB spills to a private temporary directory past the limit.
        self.con.execute("SET preserve_insertion_order = false")
        self.user_memory_limit = os.environ.get("HOLOPROF_MEMORY_LIMIT")
        limit = self.user_memory_limit or f"{default_memory_limit(self.disk_bytes) // 2**20}MiB"
        try:
            self.con.execute(f"SET memory_limit = {_sql_str(limit)}")
            self.memory_limit = limit  # as set: DuckDB reads it back rounded
        except duckdb.Error as exc:
            raise HoloprofError(
                f"HOLOPROF_MEMORY_LIMIT={limit!r} is not a memory size ({exc}); use e.g. 512MB or 2GB"
            )

        self._tmp = tempfile.TemporaryDirectory(prefix="holoprof-duckdb-")
        self.con.execute(f"SET temp_directory = {_sql_str(self._tmp.name)}")
        readable = {table: self._readable(table, chunks.files[table]) for table in model.TABLES}
        self._files = readable  # the chunks each table's view reads, in its order
        self._own: dict[str, dict[tuple[str, int], list[str]]] = {}  # see process_source
        #: each host's clock; its offset is taken off every time of its rows (:mod:`holoprof.store.clocks`)
        self.clocks = self._estimate_clocks(readable["spans"])
        self._align_manifest()
        for table in model.TABLES:
            self._register(table, readable[table])
        self.status = self._infer_status()

    def _estimate_clocks(self, files: list[str]) -> dict[str, clocks.HostClock]:
        """The hosts' clocks (a live compaction that removes a file meanwhile: once more without it)."""
        for attempt in range(2):
            try:
                return clocks.estimate(self.con, files, layout.host_of, self.manifest)
            except Exception as exc:
                files = [f for f in files if os.path.exists(f)]
                if attempt:
                    self.warnings.append(
                        f"the hosts' clock offsets could not be estimated ({type(exc).__name__}: "
                        f"{str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}); "
                        "times are as each host recorded them"
                    )
        return {}

    def shift_ns(self, host: str | None) -> int:
        """What is taken off the recorded times of ``host``'s rows: its clock offset."""
        clock = self.clocks.get(host) if host is not None else None
        return clock.offset_ns if clock is not None else 0

    def _align_manifest(self) -> None:
        """The run's end on the reference host's clock (each launcher wrote its own)."""
        parts = self.manifest.get("host_parts")
        if not parts or not self.manifest.get("end_ns"):
            return
        ends = [p["end_ns"] - self.shift_ns(p.get("host")) for p in parts if isinstance(p.get("end_ns"), int)]
        if ends:
            self.manifest = {**self.manifest, "end_ns": max(ends)}

    def _register(self, table: str, files: list[str]) -> None:
        raw = f"{table}_raw" if table in ("processes", "io_files") else table
        if files:
            groups: dict[int, list[str]] = {}
            for f in files:
                groups.setdefault(self.shift_ns(layout.host_of(f)), []).append(f)
            selects = [self._select(table, fs, shift) for shift, fs in sorted(groups.items())]
            what = "TABLE" if _read_once(table, files) else "VIEW"
            self.con.execute(f"CREATE {what} {raw} AS " + " UNION ALL ".join(selects))
        else:
            cols_ = ", ".join(f'"{n}" {model.duckdb_type(t)}' for n, t in model.COLUMNS[table])
            self.con.execute(f"CREATE TABLE {raw} ({cols_})")
        if table == "processes":
            self._register_exits()
            # Rows are snapshots: keep the newest per process, an agent's own row over the sampler's. A
            # process ends when it exited (its exit file), where that is after the agent's final row,
            # with the status its exit file gives (the agent's row precedes the exit). The same choice
            # without DuckDB: launch.run.import_exit_times over store.process_rows.newest_rows.
            self.con.execute(
                f"""CREATE VIEW processes AS SELECT p.* REPLACE (
                     CASE WHEN x.exit_ns >= p.start_ns AND x.exit_ns > coalesce(p.end_ns, 0)
                          THEN x.exit_ns ELSE p.end_ns END AS end_ns,
                     coalesce(x.status, p.exit_code) AS exit_code)
                   FROM (SELECT * EXCLUDE (rn) FROM (
                     SELECT *, row_number() OVER (
                       PARTITION BY host, pid
                       ORDER BY (coalesce(info, '') LIKE '%{model.SAMPLER_MARK}%'), updated_ns DESC) AS rn
                     FROM processes_raw) WHERE rn = 1) p
                   LEFT JOIN process_exits x ON x.host = p.host AND x.pid = p.pid"""
            )
        if table == "io_files":
            self.con.execute("CREATE VIEW io_files AS SELECT * FROM io_files_raw")
            # Rows are cumulative snapshots: the last one per process and file is its total there.
            self.con.execute(
                """CREATE VIEW io_file_totals AS SELECT * EXCLUDE (rn) FROM (
                     SELECT *, row_number() OVER (
                       PARTITION BY host, pid, module, path
                       ORDER BY (counters IS NULL), ts_ns DESC, counters DESC) AS rn
                     FROM io_files_raw) WHERE rn = 1"""
            )

    def _register_exits(self) -> None:
        """``process_exits``: when the processes an agent read exited, and with which status (the
        native library's exit files)."""
        self.con.execute(
            "CREATE TABLE process_exits (host VARCHAR, pid BIGINT, exit_ns BIGINT, status INTEGER)"
        )
        rows = [
            (h, p, ns - self.shift_ns(h), status)
            for (h, p), (ns, status) in native_dumps.exits(self.path).items()
        ]
        if rows:
            self.con.executemany("INSERT INTO process_exits VALUES (?, ?, ?, ?)", rows)

    def _select(self, table: str, files: list[str], shift: int) -> str:
        """The query of ``table``'s rows in ``files``: the schema's columns, typed as it says, with
        ``shift`` taken off every time (the files' host's clock offset), the run's filter applied."""
        lst = "[" + ", ".join(_sql_str(f) for f in files) + "]"
        cond = self.filter.sql(table, shift)
        # the files' own columns only (not the partition keys), each typed as the schema says
        src = f"read_parquet({lst}, union_by_name=true, hive_partitioning=false)"
        present = {r[0] for r in self.con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
        times = TIME_COLUMNS.get(table, ()) if shift else ()
        cols = []
        # runs of the earlier layout have the I/O counters as JSON only
        old = table == "io_files" and "counters" in present and any(_old_layout(f) for f in files)
        for name, t in model.COLUMNS[table]:
            ty = model.duckdb_type(t)
            col = f'"{name}"' if name in present else f"NULL::{ty}"
            if old and (name, t) in model.IO_COUNTERS:
                js = f"TRY_CAST(json_extract_string(counters, {_sql_str('$.' + name)}) AS {ty})"
                col = f"coalesce({col}, {js})"
            if name in times:  # 0 stands for "not yet" (a process's end while it runs): kept
                col = f"CASE WHEN {col} = 0 THEN {col} ELSE {col} - {int(shift)} END"
            cols.append(f'{col} AS "{name}"')
        return f"SELECT {', '.join(cols)} FROM {src}" + (f" WHERE {cond}" if cond else "")

    def process_source(self, table: str, host: str, pid: int) -> str:
        """``table``'s rows of the process (``host``, ``pid``), as a relation to select from (with
        ``WHERE host = .. AND pid = ..`` still): the files of that process's partition only, when every
        row of the table lies in its own process's partition (checked once per table), else the table's
        view. A run of hundreds of processes then reads one folder per query of one process, not the
        footer of every file of the run (0.002 s against 0.24 s for one rank of 512)."""
        files = self._own_partitions(table).get((str(host), int(pid)))
        if not files:
            return table
        return "(" + self._select(table, files, self.shift_ns(str(host))) + ")"

    def _own_partitions(self, table: str) -> dict[tuple[str, int], list[str]]:
        """(host, pid) -> its partition's files of ``table`` (in the view's order); empty when a file is
        not in a partition, or holds rows of another process."""
        if table in self._own:
            return self._own[table]
        files = self._files.get(table) or []
        parts = {f: layout.partition_of(f) for f in files}
        out: dict[tuple[str, int], list[str]] = {}
        if files and all(p is not None for p in parts.values()):
            lst = "[" + ", ".join(_sql_str(f) for f in files) + "]"
            rows = self.rows(
                f"SELECT DISTINCT filename, host, pid FROM read_parquet({lst}, union_by_name=true, "
                "hive_partitioning=false, filename=true)"
            )
            if all(parts.get(str(f)) == (str(h), int(p)) for f, h, p in rows if p is not None):
                for f in files:
                    out.setdefault(parts[f], []).append(f)  # type: ignore[arg-type]
        self._own[table] = out
        return out

    def _readable(self, table: str, files: list[str]) -> list[str]:
        """The files whose footer reads and whose columns have the schema's types; the others are
        skipped, with a warning (a corrupt chunk: a damaged disk, a copy cut short)."""
        import duckdb  # lazy: DuckDB loads only where a run is queried

        types = {n: model.duckdb_type(t) for n, t in model.COLUMNS[table]}
        skipped = [f for f in files if f in _CORRUPT]
        if skipped:
            files = [f for f in files if f not in _CORRUPT]
            rel = [self.relpath(f) for f in skipped]
            self.warnings.append(
                f"skipped {len(rel)} corrupt chunk(s) of {table} whose data does not decode "
                f"({_CORRUPT[skipped[0]]}): {', '.join(rel[:5])}{' ...' if len(rel) > 5 else ''}"
            )

        def wrong(rows: list[tuple[Any, ...]]) -> list[str]:
            return [f"{n} is {t}" for n, t, *_ in rows if n in types and str(t) != types[n]]

        def describe(fs: list[str]) -> list[tuple[Any, ...]]:
            lst = "[" + ", ".join(_sql_str(f) for f in fs) + "]"
            sql = f"DESCRIBE SELECT * FROM read_parquet({lst}, union_by_name=true, hive_partitioning=false)"
            return self.con.execute(sql).fetchall()

        try:
            if not files or not wrong(describe(files)):
                return files
        except duckdb.Error:
            pass
        good = []
        for f in files:  # one at a time, to name the broken ones
            try:
                why = wrong(describe([f]))
            except duckdb.Error as exc:
                why = [str(exc).strip().splitlines()[0]]
            if why and not os.path.exists(f):
                continue  # merged away by a live compaction since it was listed: its rows are in another
            if why:
                self.warnings.append(f"skipped the corrupt chunk {self.relpath(f)} ({'; '.join(why)[:200]})")
            else:
                good.append(f)
        return good

    def relpath(self, path: str) -> str:
        """A chunk's path relative to the run, as text to show."""
        return printable_text(os.path.relpath(path, self.root))

    def _infer_status(self) -> str:
        status, dead = hosts.run_state(self.manifest)
        #: the hosts whose launcher stopped before its job ended
        self.dead_hosts = dead
        if dead:
            self.warnings.append(
                f"the launcher of host{'s' if len(dead) > 1 else ''} {', '.join(printable_text(h) for h in dead)} "
                "stopped before its job ended (killed, or the node went down); everything flushed before "
                "that is shown"
            )
        elif status == "crashed" and self.manifest.get("status") == "running":
            self.warnings.append(
                "the run never finished cleanly (its launcher is gone: killed?); everything flushed "
                "before that is shown"
            )
        return status

    # tables -----------------------------------------------------------------------------------------
    def table(self, name: str) -> Any:
        """A table (:data:`holoprof.model.TABLES`) or a view (:data:`VIEWS`) as a DuckDB relation."""
        if name not in model.TABLES + VIEWS:
            raise HoloprofError(
                f"unknown table {name!r}; the tables are: {', '.join(model.TABLES)}; the views: {', '.join(VIEWS)}"
            )
        return self.con.table(name)

    @property
    def io_file_totals(self) -> Any:
        """The last snapshot of every process and file: what each process did to each file."""
        return self.table("io_file_totals")

    def file_totals(self) -> Any:
        """One row per file (``module``, ``path``) over every process: the counters that add up
        (counts, bytes, times) summed, ``*_MAX_*`` the largest, start timestamps the first and end
        timestamps the last, and ``processes`` (how many processes used the file). A DuckDB relation,
        largest ``bytes`` (read and written) first."""
        aggs = []
        for name, _ in model.IO_COUNTERS:
            if name.endswith("START_TIMESTAMP"):
                aggs.append(f'min(nullif("{name}", 0)) AS "{name}"')
            elif name.endswith("END_TIMESTAMP") or "_MAX_" in name:
                aggs.append(f'max("{name}") AS "{name}"')
            elif not any(k in name for k in _NOT_ADDITIVE):
                aggs.append(f'sum(greatest("{name}", 0)) AS "{name}"')
        return self.con.sql(
            f"""SELECT * FROM (SELECT module, path, count(*) AS processes, {", ".join(aggs)}
                FROM io_file_totals GROUP BY module, path)
                ORDER BY coalesce("POSIX_BYTES_READ", 0) + coalesce("POSIX_BYTES_WRITTEN", 0)
                       + coalesce("STDIO_BYTES_READ", 0) + coalesce("STDIO_BYTES_WRITTEN", 0) DESC, path"""
        )

    @property
    def spans(self) -> Any:
        return self.table("spans")

    @property
    def samples(self) -> Any:
        return self.table("samples")

    @property
    def io_files(self) -> Any:
        return self.table("io_files")

    @property
    def io_ops(self) -> Any:
        return self.table("io_ops")

    @property
    def processes(self) -> Any:
        return self.table("processes")

    def sql(self, query: str, params: list[Any] | None = None) -> Any:
        # On a cursor of its own: a result left half-read must not block the relations of this run.
        return self.con.cursor().execute(query, params or [])

    def rows(self, query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        return self.con.execute(query, params or []).fetchall()

    @contextmanager
    def lean_memory(self, limit: int | None = None) -> Iterator[bool]:
        """Run the queries inside with DuckDB's memory limit lowered to ``limit`` bytes, by default
        :func:`lean_memory_limit` (for the big aggregations, whose hash tables spill to disk past it).
        Yields whether the limit was lowered; a query that still runs out should be run again outside
        (at the default limit). DuckDB keeps what it has read in memory up to its limit, so a
        streamed scan is lean under a small one (:func:`scan_memory_limit`)."""
        if self.user_memory_limit:  # the user's limit holds for every query
            yield False
            return
        before = self.memory_limit
        limit = lean_memory_limit(self.disk_bytes) if limit is None else limit
        self.memory_limit = f"{max(1, limit // 2**20)}MiB"
        self.con.execute(f"SET memory_limit = {_sql_str(self.memory_limit)}")
        try:
            yield True
        finally:
            self.memory_limit = before
            self.con.execute(f"SET memory_limit = {_sql_str(before)}")

    def lean(self, query: Callable[[], T], limit: int | None = None) -> T:
        """``query()`` under :meth:`lean_memory`, and again at the run's limit if it runs out there."""
        lowered = False
        try:
            with self.lean_memory(limit) as lowered:
                return query()
        except Exception as exc:
            if not lowered or not is_out_of_memory(exc):
                raise
        return query()

    @contextmanager
    def ordered(self) -> Iterator[None]:
        """Run the queries inside with their rows in file order, on one thread: a streamed scan in
        order gains little from a second reader (0.54 s against 0.78 s for 10 M spans) and would hold
        its row groups too (20 MiB more). Insertion order is off otherwise, as it costs the parallel
        operators memory."""
        row = self.con.execute("SELECT current_setting('preserve_insertion_order')").fetchone()
        order = bool(row[0]) if row else False
        self.con.execute("SET preserve_insertion_order = true")
        try:
            with self.threads_at_most(1):
                yield
        finally:
            self.con.execute(f"SET preserve_insertion_order = {str(order).lower()}")

    @contextmanager
    def threads_at_most(self, n: int) -> Iterator[None]:
        """Run the queries inside on ``n`` DuckDB threads at most (each holds buffers of its own)."""
        row = self.con.execute("SELECT current_setting('threads')").fetchone()
        threads = int(row[0]) if row else self.threads
        self.con.execute(f"SET threads = {max(1, min(n, threads))}")
        try:
            yield
        finally:
            self.con.execute(f"SET threads = {threads}")

    @property
    def temp_dir(self) -> str:
        """The run's private temporary folder (DuckDB spills there too), removed with the Run."""
        return self._tmp.name

    @cached_property
    def disk_bytes(self) -> int:
        total = 0
        for fs in self.chunks.files.values():
            for f in fs:
                try:
                    total += os.path.getsize(f)
                except OSError:  # merged away by a live compaction since it was listed
                    pass
        return total

    def __repr__(self) -> str:
        return f"Run({self.path!r}, status={self.status!r})"


#: DuckDB's memory limit when HOLOPROF_MEMORY_LIMIT is not set: twice the run's size on disk, at
#: least 1 GiB (some analyses use operators that cannot spill) and at most 4 GiB. Past it, joins,
#: aggregates and sorts spill to a temporary directory.
MEMORY_FLOOR = 2**30
MEMORY_CAP = 4 * 2**30
#: the lower limit of the big per-step aggregations (:meth:`Run.lean_memory`): the run's size on
#: disk, at least 128 MiB and at most 1 GiB
LEAN_FLOOR = 128 * 2**20
LEAN_CAP = 2**30


def default_memory_limit(disk_bytes: int) -> int:
    return max(MEMORY_FLOOR, min(2 * int(disk_bytes), MEMORY_CAP))


def lean_memory_limit(disk_bytes: int) -> int:
    return max(LEAN_FLOOR, min(int(disk_bytes), LEAN_CAP))


def scan_memory_limit(threads: int) -> int:
    """DuckDB's limit for a streamed scan that keeps nothing (a Parquet reader per thread): 32 MiB
    and 16 MiB per thread. Given more, DuckDB keeps what it read up to the limit."""
    return (32 + 16 * max(1, threads)) * 2**20


def is_out_of_memory(exc: BaseException) -> bool:
    """DuckDB ran out of its memory limit: raised as is, or through an Arrow stream (as OSError by
    pyarrow, as RuntimeError by nanoarrow) with DuckDB's message."""
    return type(exc).__name__ == "OutOfMemoryException" or (
        isinstance(exc, (OSError, RuntimeError)) and "Out of Memory Error" in str(exc)
    )


#: NumPy's type for each Arrow format string of a fixed-width number
_NUMPY_TYPES = {"c": "i1", "C": "u1", "s": "i2", "S": "u2", "i": "i4", "I": "u4", "l": "i8", "L": "u8"}
_NUMPY_TYPES.update({"f": "f4", "g": "f8"})


class Batch:
    """One batch of a query's result as NumPy arrays, for numeric columns. Read through the Arrow C
    stream interface with nanoarrow (a 2 MiB library), so the commands that only read a run never
    load pyarrow (about 27 MiB). The arrays are views of DuckDB's buffers: no copy is made."""

    def __init__(self, array: Any) -> None:
        import numpy as np  # lazy: numpy loads only where arrays are built

        self.num_rows = int(array.length)
        self.names: list[str] = []
        self._cols: dict[str, tuple[Any, Any]] = {}
        schema = array.schema
        for i in range(array.n_children):
            child, field = array.child(i), schema.child(i)
            dtype = _NUMPY_TYPES.get(field.format)
            if dtype is None:
                raise TypeError(f"column {field.name!r} is not a fixed-width number (Arrow {field.format!r})")
            view = child.view()
            at, n = int(child.offset), int(child.length)
            nulls = None
            if child.null_count:
                bits = np.frombuffer(view.buffer(0), dtype=np.uint8)
                nulls = ~np.unpackbits(bits, bitorder="little", count=at + n)[at:].astype(bool)
            self.names.append(field.name)
            self._cols[field.name] = (np.frombuffer(view.buffer(1), dtype=dtype)[at : at + n], nulls)

    def column(self, name: str) -> Any:
        """The column's values (where a value is null, what is there is unspecified)."""
        return self._cols[name][0]

    def nulls(self, name: str) -> Any:
        """True where the column is null; None when it has no null."""
        return self._cols[name][1]


def numpy_batches(cur: Any, sql: str, params: dict[str, Any] | None = None) -> Iterator[Batch]:
    """The rows of ``sql`` (numeric columns only) streamed as :class:`Batch` es of NumPy arrays."""
    import nanoarrow as na  # lazy: loaded only where Arrow streams are read

    stream = na.c_array_stream(cur.sql(sql, params=params))
    try:
        for array in stream:
            if array.length:
                yield Batch(array)
    finally:
        stream.release()


def row_batches(
    cur: Any, sql: str, params: Any = None, size: int = 20_000
) -> Iterator[list[tuple[Any, ...]]]:
    """The rows of ``sql`` on the DuckDB cursor ``cur`` as Python tuples, ``size`` at a time; the
    cursor is closed at the end (or when the caller stops early)."""
    try:
        cur.execute(sql, params if params is not None else [])
        while True:
            rows = cur.fetchmany(size)
            if not rows:
                return
            yield rows
    finally:
        cur.close()


@dataclass(frozen=True)
class Filter:
    """What part of a run to read. DuckDB pushes these predicates into the Parquet scans, so row
    groups outside the window are skipped (spans are sorted by start time after compaction)."""

    start_s: float | None = None  # seconds from the run's start
    end_s: float | None = None
    ranks: tuple[int, ...] | None = None
    steps: tuple[int, int] | None = None  # inclusive range of step indices (spans only)
    run_start_ns: int = 0

    def sql(self, table: str, shift: int = 0) -> str:
        """The filter as a condition on the columns of ``table`` as recorded by a host whose clock is
        ``shift`` ns ahead (the window is given on the aligned timeline)."""
        conds = []
        t_col = {"spans": "start_ns", "samples": "ts_ns", "io_files": "ts_ns", "io_ops": "start_ns"}.get(
            table
        )
        if t_col is not None:
            if self.start_s is not None:
                conds.append(f"{t_col} >= {self.run_start_ns + int(self.start_s * 1e9) + shift}")
            if self.end_s is not None:
                conds.append(f"{t_col} <= {self.run_start_ns + int(self.end_s * 1e9) + shift}")
        if self.ranks is not None and table != "processes":
            conds.append(f"rank IN ({', '.join(str(int(r)) for r in self.ranks) or 'NULL'})")
        if self.steps is not None and table == "spans":
            a, b = self.steps
            conds.append(f"(step BETWEEN {int(a)} AND {int(b)} OR step < 0)")
        return " AND ".join(conds)


def corrupt_chunks(path: str) -> list[str]:
    """The chunks of the run ``path`` whose data cannot be decoded, each read whole (slow: for an
    error message, or to leave them out: :func:`skip_corrupt`). Chunks left out already are not
    read again."""
    return list(_find_corrupt(path))


def _find_corrupt(path: str) -> dict[str, str]:
    """The chunks of ``path`` whose data cannot be decoded, with DuckDB's reason."""
    import duckdb  # lazy: DuckDB loads only where a run is queried

    try:
        run = load(path)
    except HoloprofError:
        return {}
    bad = {}
    for files in run.chunks.files.values():
        for f in files:
            if f in _CORRUPT:
                continue
            try:
                run.con.execute(f"SELECT max(hash(COLUMNS(*))) FROM read_parquet({_sql_str(f)})").fetchall()
            except duckdb.Error as exc:
                bad[f] = " ".join(str(exc).split())[:160]
    run.con.close()
    return bad


#: Chunks whose data turned out not to decode in this process (path -> why): every later load leaves
#: them out, with a warning. A chunk is never changed once written (compaction writes new files).
_CORRUPT: dict[str, str] = {}
_corrupt_lock = threading.Lock()


def is_corrupt_data(exc: BaseException) -> bool:
    """``exc`` is DuckDB failing to read a chunk's data (its footer read fine when it was loaded)."""
    return type(exc).__module__.split(".")[0] in ("duckdb", "_duckdb") and type(exc).__name__ in (
        "Error",
        "IOException",
        "InvalidInputException",
        "SerializationException",
    )


def skip_corrupt(compute: Callable[[], T], runs: Sequence[str], failed: BaseException | None = None) -> T:
    """``compute()`` (which loads ``runs`` and reads them); when it fails on a chunk whose data does not
    decode (a damaged disk, bytes overwritten in the middle), the chunks of ``runs`` that do not are
    found, left out of every later load (each run's warnings name them) and ``compute()`` runs
    again: a corrupt chunk is skipped and reported as a truncated one is. ``failed`` is the error of
    a first call of ``compute()`` made already. Other errors, and this one when no chunk is found
    corrupt, are raised."""
    while True:
        if failed is None:
            try:
                return compute()
            except Exception as exc:
                failed = exc
        if not is_corrupt_data(failed):
            raise failed
        found = {f: why for r in runs for f, why in _find_corrupt(r).items()}
        with _corrupt_lock:
            new = {f: why for f, why in found.items() if f not in _CORRUPT}
            _CORRUPT.update(new)
        if not new:
            raise failed
        failed = None


def load(
    path: str | os.PathLike[str],
    threads: int | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    ranks: list[int] | tuple[int, ...] | None = None,
    steps: tuple[int, int] | None = None,
) -> Run:
    """Load the run directory ``path`` (or a packed run). Raises HoloprofError on bad input.

    ``start_s``/``end_s`` (seconds from the start of the run), ``ranks`` and ``steps`` (an inclusive
    range) restrict what is read; the filters are pushed down into the Parquet scans.
    """

    p = open_run(os.path.abspath(os.fspath(path)))  # a packed run is unpacked to a private temp dir
    manifest = rundir.read_manifest(p)
    if start_s is not None and end_s is not None and end_s < start_s:
        raise HoloprofError(f"the time window ends ({end_s} s) before it starts ({start_s} s); swap them")
    where = Filter(
        start_s=start_s,
        end_s=end_s,
        ranks=tuple(ranks) if ranks is not None else None,
        steps=steps,
        run_start_ns=int(manifest.get("start_ns") or 0),
    )
    # a live run's launcher converts its raw chunks: a reader doing it too would only compete with it
    live = hosts.run_state(manifest)[0] == "running"
    return Run(p, manifest, convert.find_chunks(p, convert=not live), threads=threads, where=where)
