"""Export a run as a Chrome trace (JSON trace event format): opens in Perfetto and chrome://tracing.

Tracks: one process per traced or sampled process (``process_name`` and ``process_labels`` metadata:
command, role, rank), one thread per thread that recorded spans (``thread_name``). Spans become
complete events (``"ph": "X"``, category = span kind) on their thread, epochs on an ``epochs`` track
of their process; spans of asynchronous work (DDP's gradient buckets, collectives with
``async_op=True``), which overlap one another on the thread that started them, become async events
(``"b"``/``"e"`` with the span id as ``id2.local``). So the slices of every track nest. Resource
samples become counter events (``"C"``: the job-wide ones on the launcher's track, ``proc.*`` ones on
the process they measure), and per-operation I/O records (``io_ops``, when traced) complete events on
an ``I/O`` thread of their process. Timestamps are microseconds since the run start; integers beyond
2**53 in args (ids, nanosecond times such as ``ready_ns``) are strings, which JavaScript viewers
would otherwise round.

DuckDB writes the events of the spans, samples and I/O operations (:func:`span_event`,
:func:`sample_event`, :func:`io_op_event`) as it reads them ordered by time, and their text goes to
the file a batch at a time, with no Python object per event. It sorts them under a memory limit of its
own (:data:`SORT_MEMORY`) and spills to disk past it, so memory stays flat however long the run is.
The order is total (time first, then every column written), so the file is deterministic: the DuckDB
engine (default) and the Dask engine (``engine=DaskEngine``, see :mod:`holoprof.analyze.engine_dask`)
give the rows through the same seam (:mod:`holoprof.analyze.engine`) and write the same bytes. Times
are written exactly, as decimal microseconds of whole nanoseconds; a sample's value that is not
finite is null (JSON has no NaN).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from holoprof import model
from holoprof.analyze.engine import Aggregation, Engine, engine_for
from holoprof.progress import Bar
from holoprof.store.reader import Bound, Run, _sql_str, bounds_sql, is_out_of_memory

BATCH = 20_000
#: The thread id of the synthetic I/O track of each process.
IO_TID = 2**31 - 2
#: Pids of processes on other hosts are moved by this much per host so that tracks never collide.
HOST_STRIDE = 1 << 22

#: The columns written of each kind of event, and their order: (column, ascending). Time first; the
#: other columns only break ties, so that the order (and the file) is the same whatever engine
#: reads the run.
SPAN_COLS = (
    "host",
    "pid",
    "tid",
    "kind",
    "name",
    "start_ns",
    "end_ns",
    "step",
    "attrs",
    "span_id",
    "parent_id",
)
SPAN_ORDER: tuple[tuple[str, bool], ...] = (
    ("start_ns", True),
    ("end_ns", False),
    ("host", True),
    ("pid", True),
    ("tid", True),
    ("span_id", True),
    ("kind", True),
    ("name", True),
    ("step", True),
    ("parent_id", True),
    ("attrs", True),
)
SAMPLE_COLS = ("host", "pid", "target_pid", "name", "ts_ns", "value")
SAMPLE_ORDER: tuple[tuple[str, bool], ...] = tuple(
    (c, True) for c in ("ts_ns", "host", "pid", "target_pid", "name", "value")
)
IO_OP_COLS = ("host", "pid", "module", "path", "op", "offset", "size_bytes", "start_ns", "end_ns")
IO_OP_ORDER: tuple[tuple[str, bool], ...] = tuple(
    (c, True) for c in ("start_ns", "end_ns", "host", "pid", "module", "path", "op", "offset", "size_bytes")
)


#: DuckDB's memory limit and threads while an export sorts (unless HOLOPROF_MEMORY_LIMIT is set).
#: Measured: 10 M spans sort in 256 MiB on 2 threads (peak 265 MiB at 128 MiB, but 64 MiB runs out
#: while merging), 100 M spans in 256 MiB (peak 429 MiB). Each thread needs buffers of its own, and
#: a second thread is enough: writing the events takes several times longer than the sort.
SORT_MEMORY = 256 * 2**20
SORT_THREADS = 2


def order_by(order: tuple[tuple[str, bool], ...]) -> str:
    return ", ".join(f'"{c}"{"" if asc else " DESC"}' for c, asc in order)


@dataclass
class TraceStats:
    events: int = 0
    spans: int = 0
    counters: int = 0
    io_ops: int = 0
    processes: int = 0
    threads: int = 0


def _window_ns(run: Run, t0: int, start_s: float | None, end_s: float | None) -> tuple[int, int]:
    lo = t0 + int(start_s * 1e9) if start_s is not None else -(2**62)
    hi = t0 + int(end_s * 1e9) if end_s is not None else 2**62
    return lo, hi


def run_start_ns(run: Run) -> int:
    """The run start (manifest), or the earliest record when the manifest has none."""
    t0 = run.manifest.get("start_ns")
    if t0:
        return int(t0)
    row = (
        run.rows("SELECT min(start_ns) FROM spans")[0][0] or run.rows("SELECT min(ts_ns) FROM samples")[0][0]
    )
    return int(row or 0)


class _Pids:
    def __init__(self) -> None:
        self.hosts: dict[str, int] = {}

    def __call__(self, host: str, pid: int) -> int:
        idx = self.hosts.setdefault(host, len(self.hosts))
        return int(pid) + idx * HOST_STRIDE


def _threads_agg(lo: int, hi: int) -> Aggregation:
    """``(host, pid, tid, steps, spans)`` of every thread with spans in [lo, hi], sorted."""
    return Aggregation(
        name="trace-threads",
        table="spans",
        columns=("host", "pid", "tid", "kind", "start_ns", "end_ns"),
        chunk="""SELECT host, pid, tid, count(*) FILTER (WHERE kind = 'step') AS steps, count(*) AS n
                 FROM {t} WHERE end_ns >= $lo AND start_ns <= $hi GROUP BY host, pid, tid""",
        combine="""SELECT host, pid, tid, CAST(sum(steps) AS BIGINT) AS steps, CAST(sum(n) AS BIGINT) AS n
                   FROM {t} GROUP BY host, pid, tid""",
        order="host, pid, tid",
        params={"lo": lo, "hi": hi},
    )


def sorted_events(
    run: Run,
    source: str,
    columns: tuple[str, ...],
    bounds: tuple[Bound, ...],
    order: tuple[tuple[str, bool], ...],
    event: str,
    hosts: list[str],
) -> Iterator[tuple[str, int]]:
    """The rows of ``source`` (a table, a view or a table function of ``run``'s DuckDB) within
    ``bounds``, sorted by ``order``, each written by DuckDB as the text of its trace event (``event``,
    a SQL expression over ``columns`` that is never null), in pieces of BATCH events: ``(text,
    events)``, where every event is preceded by ``",\n"``. The ``host`` column is replaced by
    ``host_index``, the position of the row's host in ``hosts`` (which holds every host of the rows),
    in the columns and in the order: joined before the sort, it costs one hash lookup per row however
    many hosts there are, and the sorted runs hold a number instead of a string.

    DuckDB sorts the rows under SORT_MEMORY on SORT_THREADS threads: past it, sorted runs go to the
    run's temporary folder and are merged as the rows are fetched, so memory stays flat however long
    the run is. The events are formatted after the sort (the sorted runs hold the columns, not the
    text), and their text is read from the Arrow buffers of each batch at once. A sort that runs out
    of memory there before its first rows is run again at the run's limit."""
    where, where_params = bounds_sql(bounds)
    index = "coalesce(hp_hosts.i, 0)::BIGINT AS host_index"
    cols = ", ".join(index if c == "host" else f'"{c}"' for c in columns)
    known = ", ".join(f"({_sql_str(h)}, {i})" for i, h in enumerate(hosts)) or "(NULL::VARCHAR, 0)"
    order = tuple(("host_index" if c == "host" else c, asc) for c, asc in order)
    sql = (
        f"SELECT {event} FROM (SELECT {cols} FROM {source}"
        f" LEFT JOIN (VALUES {known}) AS hp_hosts(h, i) ON coalesce(host, 'None') = hp_hosts.h"
        f" WHERE {where} ORDER BY {order_by(order)})"
    )
    with run.lean_memory(SORT_MEMORY) as lowered, run.threads_at_most(SORT_THREADS):
        pieces = _text_batches(run.con.cursor(), sql, where_params)
        try:
            first = next(pieces, None)  # the whole sort happens here; then its runs are merged
        except Exception as exc:
            if not lowered or not is_out_of_memory(exc):
                raise
        else:
            if first is not None:
                yield first
                yield from pieces
            return
    yield from _text_batches(run.con.cursor(), sql, where_params)


def _text_batches(cur: Any, sql: str, params: list[Any]) -> Iterator[tuple[str, int]]:
    """The one text column of ``sql``'s rows, BATCH rows at a time, joined: ``(text, rows)``."""
    import numpy as np  # lazy: numpy loads with the first analysis that needs it
    import pyarrow as pa

    try:
        rel = cur.sql(sql, params=params)
        reader = getattr(rel, "to_arrow_reader", None) or rel.fetch_arrow_reader  # DuckDB 2 or 1
        for batch in reader(BATCH):
            col = batch.column(0)
            n = len(col)
            if not n:
                continue
            if col.null_count:
                raise RuntimeError(f"{col.null_count} trace events were null: {sql}")
            if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
                col = col.cast(pa.large_string())  # a string view (DuckDB's arrow_output_version 1.4)
            _, offsets, data = col.buffers()
            width = 8 if pa.types.is_large_string(col.type) else 4
            at = np.frombuffer(offsets, dtype=f"<i{width}", count=n + 1, offset=col.offset * width)
            yield str(memoryview(data)[int(at[0]) : int(at[-1])], "utf-8"), n
    finally:
        cur.close()


def _us(ns: str) -> str:
    """SQL: the text of a whole number of nanoseconds ``ns`` in microseconds, exactly (no trailing
    zero in the fraction: 1234500 is 1234.5)."""
    a = f"abs({ns})"
    return (
        f"(CASE WHEN {ns} < 0 THEN '-' ELSE '' END || ({a} // 1000)::VARCHAR || "
        f"CASE WHEN {a} % 1000 = 0 THEN '' ELSE '.' || rtrim(lpad(({a} % 1000)::VARCHAR, 3, '0'), '0') END)"
    )


def _exact_us(diff: Callable[[str], str], *cols: str) -> str:
    """SQL: :func:`_us` of ``diff(cast)``, a difference of the nanosecond columns ``cols`` (each
    followed by ``cast``): in BIGINT while every column is within 2**62 of 0 (no overflow there),
    else in HUGEINT (at the ends of BIGINT: corrupt or synthetic times), which costs about 10% more."""
    safe = " AND ".join(f"coalesce({c}, 0) BETWEEN -{2**62} AND {2**62}" for c in cols)
    return f"(CASE WHEN {safe} THEN {_us(diff(''))} ELSE {_us(diff('::HUGEINT'))} END)"


def _since(col: str, t0: int) -> str:
    """SQL: the time of ``col`` since ``t0``, in microseconds."""
    if abs(int(t0)) > 2**62:
        return _us(f"(coalesce({col}, 0)::HUGEINT - {int(t0)})")
    return _exact_us(lambda cast: f"(coalesce({col}, 0){cast} - {int(t0)})", col)


#: SQL: a span's or an I/O operation's duration (0 when it ends before it starts)
_DUR = _exact_us(
    lambda cast: f"greatest(0, coalesce(end_ns, 0){cast} - coalesce(start_ns, 0))", "end_ns", "start_ns"
)


def _pid(pid: str) -> str:
    """SQL: the trace pid of ``pid`` of the row's host (see :func:`sorted_events`)."""
    return f"(coalesce({pid}, 0) + host_index * {HOST_STRIDE})"


def _text(x: str) -> str:
    """SQL: ``x`` as a JSON string literal (``""`` for null)."""
    return f"to_json(coalesce({x}, ''))"


#: the attributes without the white space around them (Python's str.strip for ASCII and NBSP)
_ATTRS_TRIMMED = "trim(attrs, ' ' || chr(9) || chr(10) || chr(11) || chr(12) || chr(13) || chr(160))"
#: RE2: a JSON string or a number that is not an integer (kept as they are), or an integer of 16
#: digits or more (group 2: written as a string). Strings come first, so digits inside them are kept.
_BIG_INT_RE = r'("(?:[^"\\]|\\.)*"|-?[0-9]+[.eE][-+0-9.eE]*)|(-?[0-9]{16,})'
#: the trimmed attributes with every integer of 16 digits or more (all those beyond 2**53, which
#: JavaScript viewers would round) as a JSON string: the first pass marks each such integer with
#: chr(1)..chr(2) (and leaves an empty mark after the rest), the next passes drop the empty marks and
#: quote the marked integers. A JSON document holds no raw control characters, so no mark is mistaken.
_ATTRS = (
    f"(CASE WHEN NOT regexp_matches({_ATTRS_TRIMMED}, '[0-9]{{16}}') THEN {_ATTRS_TRIMMED} ELSE "
    f"regexp_replace(regexp_replace(regexp_replace({_ATTRS_TRIMMED}, '{_BIG_INT_RE}', '\\1' || chr(1) || '\\2' || chr(2), 'g'),"
    f" chr(1) || chr(2), '', 'g'), chr(1) || '(-?[0-9]+)' || chr(2), '\"\\1\"', 'g') END)"
)
#: The thread id of the synthetic track of each process's epochs: an epoch runs from the first batch
#: of a training loader to the fetch that finds it empty, while a step runs from one fetch to the
#: next, so the first step of every later epoch starts at that last fetch, inside the previous epoch
#: (and holds whatever ran between the epochs); on one thread the two would not nest.
EPOCH_TID = 2**31 - 3
#: SQL: a span the agent records from its start to the completion of asynchronous work (DDP's
#: gradient buckets, collectives with ``async_op=True``): such spans overlap one another on the
#: thread that started them, so they are written as async events (``"b"``/``"e"``, one id each),
#: which viewers lay out on tracks of their own.
_ASYNC = "(kind = 'comm' AND (name = 'ddp_bucket' OR contains(coalesce(attrs, ''), '\"async\": true')))"


def _int_json(x: str) -> str:
    """SQL: the integer ``x`` as JSON: a number, or a string beyond 2**53 (JavaScript's exact range)."""
    return f"(CASE WHEN abs({x}::HUGEINT) > {2**53} THEN '\"' || {x}::VARCHAR || '\"' ELSE {x}::VARCHAR END)"


def span_event(t0: int) -> str:
    """SQL: a span's event. Its kind is its category; its attributes (a JSON object written by the
    agent) are spliced into its args, followed by its span id, step and parent span; integers beyond
    2**53 in them are strings. A complete event (``"X"``) on its thread (epochs on the process's epoch
    track), or a pair of async events for a span of asynchronous work (see :data:`_ASYNC`): the
    begin with the args, then its end. The args are written once, whichever the kind of event."""
    head = "',\n{\"name\":' || " + _text("name") + " || ',\"cat\":' || " + _text("kind")
    where = (
        " || ',\"pid\":' || "
        + _pid("pid")
        + "::VARCHAR || ',\"tid\":' || "
        + f"(CASE WHEN kind = 'epoch' THEN {EPOCH_TID} ELSE coalesce(tid, 0) END)::VARCHAR"
    )
    args = (
        " || ',\"args\":{' || CASE WHEN attrs IS NULL OR attrs = '' THEN ''"
        + f" WHEN {_ATTRS_TRIMMED} LIKE '{{%}}' AND length({_ATTRS_TRIMMED}) > 2 THEN {_ATTRS}[2:-2] || ','"
        + f" WHEN {_ATTRS_TRIMMED} = '{{}}' THEN '' ELSE '\"attrs\":' || to_json({_ATTRS_TRIMMED}) || ',' END"
        + " || '\"span_id\":' || "
        + _int_json("coalesce(span_id, 0)")
        + " || CASE WHEN step >= 0 THEN ',\"step\":' || "
        + _int_json("step")
        + " ELSE '' END"
        + " || CASE WHEN parent_id <> 0 THEN ',\"parent_id\":' || "
        + _int_json("parent_id")
        + " ELSE '' END || '}}'"
    )
    async_id = '\',"id2":{"local":"\' || coalesce(span_id, 0)::VARCHAR || \'"}\''
    timing = (
        f' || CASE WHEN {_ASYNC} THEN \',"ph":"b","ts":\' || '
        + _since("start_ns", t0)
        + ' ELSE \',"ph":"X","ts":\' || '
        + _since("start_ns", t0)
        + " || ',\"dur\":' || "
        + _DUR
        + " END"
    )
    end = (
        f" || CASE WHEN {_ASYNC} THEN "
        + head
        + ' || \',"ph":"e","ts":\' || '
        + _since("greatest(end_ns, start_ns)", t0)
        + where
        + " || "
        + async_id
        + " || '}' ELSE '' END"
    )
    return head + timing + where + f" || CASE WHEN {_ASYNC} THEN {async_id} ELSE '' END" + args + end


def sample_event(t0: int, launcher_pid: int | None) -> str:
    """SQL: a resource sample's counter event, on the process it measures (``proc.*`` samples) or
    else on the launcher's track (the sampling process's when there is no launcher, or one launcher
    per host). A value that is not finite is null."""
    job = _pid("pid") if launcher_pid is None else str(int(launcher_pid))
    return (
        "',\n{\"name\":' || " + _text("name") + " || ',\"ph\":\"C\",\"ts\":' || "
        + _since("ts_ns", t0) + " || ',\"pid\":' || (CASE WHEN target_pid >= 0 THEN "
        + _pid("target_pid") + f" ELSE {job} END)::VARCHAR || ',\"tid\":0,\"args\":{{\"value\":' || "
        + "CASE WHEN value IS NULL THEN '0.0' WHEN isfinite(value::DOUBLE) THEN value::DOUBLE::VARCHAR"
        + " ELSE 'null' END || '}}'"
    )  # fmt: skip


def io_op_event(t0: int) -> str:
    """SQL: an I/O operation's complete event, on the I/O thread of its process, named by the
    operation and the file's name, with the whole record in its args."""

    def value(c: str, number: bool = False) -> str:
        return f"coalesce(\"{c}\"::VARCHAR, 'null')" if number else f"coalesce(to_json(\"{c}\"), 'null')"

    return (
        "',\n{\"name\":' || to_json(coalesce(op, '') || ' ' || regexp_replace(coalesce(path, ''), '^.*/', '', 's'))"
        + " || ',\"cat\":\"io\",\"ph\":\"X\",\"ts\":' || " + _since("start_ns", t0)
        + " || ',\"dur\":' || " + _DUR + " || ',\"pid\":' || " + _pid("pid") + f"::VARCHAR || ',\"tid\":{IO_TID},\"args\":{{\"path\":' || "
        + value("path") + " || ',\"op\":' || " + value("op") + " || ',\"module\":' || " + value("module")
        + " || ',\"offset\":' || " + value("offset", True) + " || ',\"size_bytes\":' || "
        + value("size_bytes", True) + " || '}}'"
    )  # fmt: skip


class _Trace:
    """The trace being written to ``out``: its events (as JSON text), the numbering of its tracks and
    what it counted."""

    def __init__(self, run: Run, out: IO[str], bar: Bar) -> None:
        self.run, self.out, self.bar = run, out, bar
        self.pid_of = _Pids()
        self.stats = TraceStats()
        self.first = True
        self.known: set[int] = set()  # trace pids named already
        self.launcher_pid: int | None = None
        self.launchers = 0

    def emit(self, ev: dict[str, Any]) -> None:
        self.out.write(("" if self.first else ",\n") + json.dumps(ev, separators=(",", ":"), default=str))
        self.first = False
        self.stats.events += 1

    def meta(self, name: str, pid: int, tid: int, args: dict[str, Any]) -> None:
        self.emit({"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args})

    def track(self, pid: int, tid: int, name: str, sort_index: int) -> None:
        """A thread's name and place among its process's threads."""
        self.meta("thread_name", pid, tid, {"name": name})
        self.meta("thread_sort_index", pid, tid, {"sort_index": sort_index})
        self.stats.threads += 1

    def processes(self) -> None:
        """A process's name, labels and place for every process of the run."""
        procs = self.run.rows(
            "SELECT host, pid, ppid, role, rank, argv, info FROM processes ORDER BY start_ns, pid, host"
        )
        for host, pid, _ppid, role, rank, argv, info in procs:
            p = self.pid_of(str(host), int(pid))
            self.known.add(p)
            try:
                argl = json.loads(argv) if argv else []
            except ValueError:
                argl = []
            if not isinstance(argl, list):
                argl = []
            cmd = " ".join(os.path.basename(str(a)) if i == 0 else str(a) for i, a in enumerate(argl))[:200]
            if role == "launcher":
                # one launcher per host in a run of several (--join): each host's job-wide samples
                # stay on the track of the launcher that took them (the row's own process)
                self.launcher_pid = p if self.launchers == 0 else None
                self.launchers += 1
            self.meta("process_name", p, 0, {"name": f"{cmd or 'pid ' + str(pid)} (pid {pid})"})
            labels = [f"role={role}"]
            if rank is not None and int(rank) >= 0:
                labels.append(f"rank={rank}")
            if len(self.pid_of.hosts) > 1 or host:
                labels.append(f"host={host}")
            if model.sampler_row(info):
                labels.append("sampled")
            self.meta("process_labels", p, 0, {"labels": ", ".join(labels)})
            sort = -1 if role == "launcher" else (0 if role == "main" else 1)
            self.meta("process_sort_index", p, 0, {"sort_index": sort})
            self.stats.processes += 1

    def threads(self, threads: list[tuple[Any, ...]]) -> None:
        """A track for every thread with spans (``(host, pid, tid, steps, spans)``), the loop thread
        of each process named "training loop"."""
        loop_tid: dict[int, int] = {}
        for host, pid, tid, steps, _n in threads:
            p = self.pid_of(str(host), int(pid))
            if steps and (p not in loop_tid):
                loop_tid[p] = int(tid)
        for host, pid, tid, steps, _n in threads:
            p = self.pid_of(str(host), int(pid))
            if p not in self.known:
                self.known.add(p)
                self.meta("process_name", p, 0, {"name": f"pid {pid}"})
                self.stats.processes += 1
            name = "training loop" if steps and loop_tid.get(p) == int(tid) else f"thread {tid}"
            self.track(p, int(tid), name, 0 if steps else 1)

    def table(self, table: str, source: str, where: tuple[Bound, ...], columns: tuple[str, ...],
              order: tuple[tuple[str, bool], ...], event: str, counted: str) -> None:  # fmt: skip
        """The events of the rows of ``table`` read from ``source`` within ``where``, sorted by time
        and written by DuckDB, after the tracks they need (I/O and epoch threads)."""
        run = self.run
        cond, params = bounds_sql(where)
        tracks = run.rows(
            f"SELECT DISTINCT coalesce(host, 'None') AS h, pid FROM {source} WHERE {cond} ORDER BY h, pid",
            params,
        )
        if self.bar.active:
            self.bar.add_total(run.rows(f"SELECT count(*) FROM {source} WHERE {cond}", params)[0][0])
        for host, pid in tracks:
            p = self.pid_of(host, int(pid))  # the hosts first seen here are numbered in name order
            if table == "io_ops":
                self.track(p, IO_TID, "I/O", 2)
        if table == "spans":  # the epoch track of each process with epochs
            for host, pid in run.rows(
                f"SELECT DISTINCT coalesce(host, 'None') AS h, pid FROM {source} WHERE {cond} AND kind = 'epoch'"
                " ORDER BY h, pid",
                params,
            ):
                self.track(self.pid_of(host, int(pid)), EPOCH_TID, "epochs", -1)
        for text, n in sorted_events(run, source, columns, where, order, event, list(self.pid_of.hosts)):
            self.out.write(text[2:] if self.first else text)  # each event follows ",\n"
            self.first = False
            self.stats.events += n + (text.count(',"ph":"e",') if table == "spans" else 0)  # async ends
            setattr(self.stats, counted, getattr(self.stats, counted) + n)
            self.bar.advance(n)


def write_chrome_trace(
    run: Run,
    out: IO[str],
    start_s: float | None = None,
    end_s: float | None = None,
    engine: Engine | None = None,
    bar: Bar | None = None,
) -> TraceStats:
    """Write ``run`` (optionally the window [start_s, end_s] seconds from its start) to ``out``.

    ``engine`` (DuckDB by default) reads the threads and gives where DuckDB reads the spans, samples
    and I/O operations to sort and write (``sorted_source``): the run's views on DuckDB, a file of
    the rows its cluster read on Dask. The small process table is read with DuckDB. ``out`` must take
    any Unicode text (the names are written as they are, not escaped to ASCII). ``bar`` (a progress
    bar) counts the events as they are written.
    """
    eng = engine_for(run, engine)
    trace = _Trace(run, out, bar or Bar())
    t0 = run_start_ns(run)
    lo, hi = _window_ns(run, t0, start_s, end_s)
    out.write('{"displayTimeUnit":"ms","otherData":')
    out.write(
        json.dumps(
            {
                "generator": "holoprof",
                "run": run.path,
                "command": run.manifest.get("command"),
                "start_ns": t0,
                "window_s": [start_s, end_s],
            },
            default=str,
        )
    )
    out.write(',"traceEvents":[\n')
    trace.processes()
    trace.threads(eng.aggregate(_threads_agg(lo, hi)))
    # spans, counters and per-operation I/O, each sorted by time and written by DuckDB
    kinds = (  # table, its columns, the window, the order, each row's event, the TraceStats field
        ("spans", SPAN_COLS, (("end_ns", ">=", lo), ("start_ns", "<=", hi)), SPAN_ORDER, span_event(t0), "spans"),
        ("samples", SAMPLE_COLS, (("ts_ns", ">=", lo), ("ts_ns", "<=", hi)), SAMPLE_ORDER,
         sample_event(t0, trace.launcher_pid), "counters"),
        ("io_ops", IO_OP_COLS, (("end_ns", ">=", lo), ("start_ns", "<=", hi)), IO_OP_ORDER, io_op_event(t0), "io_ops"),
    )  # fmt: skip
    for table, columns, bounds, order, event, counted in kinds:
        with eng.sorted_source(table, columns, bounds) as found:
            if found is not None:
                source, where = found
                trace.table(table, source, where, columns, order, event, counted)
    out.write("\n]}\n")
    return trace.stats
