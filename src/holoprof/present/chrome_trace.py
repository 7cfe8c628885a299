"""Export a run as a Chrome trace (JSON trace event format): opens in Perfetto and chrome://tracing.

Tracks: one process per traced or sampled process (``process_name`` and ``process_labels`` metadata:
command, role, rank), one thread per thread that recorded spans (``thread_name``). Spans become
complete events (``"ph": "X"``, category = span kind), resource samples counter events (``"C"``: the
job-wide ones on the launcher's track, ``proc.*`` ones on the process they measure), and per-operation
I/O records (``io_ops``, when traced) complete events on an ``I/O`` thread of their process.
Timestamps are microseconds since the run start.

The file is written event by event while the spans, samples and I/O operations are read in batches
ordered by time. DuckDB sorts them under a memory limit of its own (:data:`SORT_MEMORY`) and spills
to disk past it, so memory stays flat however long the run is. The order is total (time first, then
every column written), so the file is deterministic: the DuckDB engine (default) and the Dask engine
(``engine=DaskEngine``, see :mod:`holoprof.analyze.engine_dask`) write the same bytes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from holoprof.store.reader import Bound, Run, bounds_sql, is_out_of_memory, row_batches

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


class DuckDBRows:
    """The rows of the trace from the run's DuckDB views (the default engine)."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def trace_threads(self, lo: int, hi: int) -> list[tuple[Any, ...]]:
        return self.run.rows(
            """SELECT host, pid, tid, count(*) FILTER (WHERE kind = 'step') AS steps, count(*) AS n
               FROM spans WHERE end_ns >= ? AND start_ns <= ? GROUP BY host, pid, tid
               ORDER BY host, pid, tid""",
            [lo, hi],
        )

    def sorted_rows(
        self,
        table: str,
        columns: tuple[str, ...],
        bounds: tuple[Bound, ...],
        order: tuple[tuple[str, bool], ...],
    ) -> Iterator[list[tuple[Any, ...]]]:
        """``columns`` of the rows of ``table`` within ``bounds``, sorted by ``order``, in batches."""
        return sorted_batches(self.run, table, columns, bounds, order)


def sorted_batches(
    run: Run,
    source: str,
    columns: tuple[str, ...],
    bounds: tuple[Bound, ...],
    order: tuple[tuple[str, bool], ...],
) -> Iterator[list[tuple[Any, ...]]]:
    """``columns`` of the rows of ``source`` (a table, a view or a table function of ``run``'s
    DuckDB) within ``bounds``, sorted by ``order``, in batches of BATCH. DuckDB sorts them under
    SORT_MEMORY on SORT_THREADS threads: past it, sorted runs go to the run's temporary folder and
    are merged as the rows are fetched, so memory stays flat however long the run is. A sort that
    runs out of memory there before its first rows is run again at the run's limit."""
    where, params = bounds_sql(bounds)
    cols = ", ".join(f'"{c}"' for c in columns)
    sql = f"SELECT {cols} FROM {source} WHERE {where} ORDER BY {order_by(order)}"
    with run.lean_memory(SORT_MEMORY) as lowered, run.threads_at_most(SORT_THREADS):
        batches = row_batches(run.con.cursor(), sql, params, BATCH)
        try:
            first = next(batches, None)  # the whole sort happens here; then its runs are merged
        except Exception as exc:
            if not lowered or not is_out_of_memory(exc):
                raise
        else:
            if first is not None:
                yield first
                yield from batches
            return
    yield from row_batches(run.con.cursor(), sql, params, BATCH)


_JSTR: dict[str, str] = {}


def _jstr(x: object) -> str:
    """A JSON string literal, cached (span names and kinds repeat)."""
    k = str(x)
    v = _JSTR.get(k)
    if v is None:
        v = json.dumps(k)
        if len(_JSTR) < 10_000:
            _JSTR[k] = v
    return v


def _us(ns: int, t0: int) -> float:
    return round((ns - t0) / 1000.0, 3)


def write_chrome_trace(
    run: Run,
    out: IO[str],
    start_s: float | None = None,
    end_s: float | None = None,
    engine: Any = None,
) -> TraceStats:
    """Write ``run`` (optionally the window [start_s, end_s] seconds from its start) to ``out``.

    ``engine`` reads the threads (``trace_threads``) and the sorted spans, samples and I/O
    operations (``sorted_rows``): DuckDB by default, or a
    :class:`~holoprof.analyze.engine_dask.DaskEngine`. The small process table is read with DuckDB.
    """
    src = engine if engine is not None else DuckDBRows(run)
    t0 = run_start_ns(run)
    lo, hi = _window_ns(run, t0, start_s, end_s)
    pid_of = _Pids()
    stats = TraceStats()
    first = True

    def emit(ev: dict[str, Any]) -> None:
        nonlocal first
        out.write(("" if first else ",\n") + json.dumps(ev, separators=(",", ":"), default=str))
        first = False
        stats.events += 1

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

    # processes ------------------------------------------------------------------------------------
    procs = run.rows(
        "SELECT host, pid, ppid, role, rank, argv, info FROM processes ORDER BY start_ns, pid, host"
    )
    known: set[int] = set()
    launcher_pid: int | None = None
    for host, pid, _ppid, role, rank, argv, info in procs:
        p = pid_of(str(host), int(pid))
        known.add(p)
        try:
            argl = json.loads(argv) if argv else []
        except ValueError:
            argl = []
        if not isinstance(argl, list):
            argl = []
        cmd = " ".join(os.path.basename(str(a)) if i == 0 else str(a) for i, a in enumerate(argl))[:200]
        if role == "launcher":
            launcher_pid = p
        label = f"{cmd or 'pid ' + str(pid)} (pid {pid})"
        emit({"name": "process_name", "ph": "M", "pid": p, "tid": 0, "args": {"name": label}})
        labels = [f"role={role}"]
        if rank is not None and int(rank) >= 0:
            labels.append(f"rank={rank}")
        if len(pid_of.hosts) > 1 or host:
            labels.append(f"host={host}")
        if info and '"source": "sampler"' in info:
            labels.append("sampled")
        emit({"name": "process_labels", "ph": "M", "pid": p, "tid": 0, "args": {"labels": ", ".join(labels)}})
        sort = -1 if role == "launcher" else (0 if role == "main" else 1)
        emit({"name": "process_sort_index", "ph": "M", "pid": p, "tid": 0, "args": {"sort_index": sort}})
        stats.processes += 1

    # threads --------------------------------------------------------------------------------------
    threads = src.trace_threads(lo, hi)
    loop_tid: dict[int, int] = {}
    for host, pid, tid, steps, _n in threads:
        p = pid_of(str(host), int(pid))
        if steps and (p not in loop_tid):
            loop_tid[p] = int(tid)
    for host, pid, tid, steps, _n in threads:
        p = pid_of(str(host), int(pid))
        if p not in known:
            known.add(p)
            emit({"name": "process_name", "ph": "M", "pid": p, "tid": 0, "args": {"name": f"pid {pid}"}})
            stats.processes += 1
        name = "training loop" if steps and loop_tid.get(p) == int(tid) else f"thread {tid}"
        emit({"name": "thread_name", "ph": "M", "pid": p, "tid": int(tid), "args": {"name": name}})
        emit(
            {
                "name": "thread_sort_index",
                "ph": "M",
                "pid": p,
                "tid": int(tid),
                "args": {"sort_index": 0 if steps else 1},
            }
        )
        stats.threads += 1

    # spans ----------------------------------------------------------------------------------------
    for rows in src.sorted_rows(
        "spans", SPAN_COLS, (("end_ns", ">=", lo), ("start_ns", "<=", hi)), SPAN_ORDER
    ):
        parts: list[str] = []
        for host, pid, tid, kind, name, s, e, step, attrs, sid, parent in rows:
            # Formatted directly (json.dumps of a whole dict per event is the bottleneck on big runs);
            # span attributes are already a JSON object written by the agent: spliced in as they are.
            extra = f',"step":{int(step)}' if step is not None and int(step) >= 0 else ""
            if parent:
                extra += f',"parent_id":{int(parent)}'
            body = f'"span_id":{int(sid)}{extra}'
            if attrs:
                a = str(attrs).strip()
                if a.startswith("{") and a.endswith("}") and len(a) > 2:
                    body = a[1:-1] + "," + body
                elif a != "{}":
                    body = f'"attrs":{json.dumps(a)},' + body
            parts.append(
                f'{{"name":{_jstr(name)},"cat":{_jstr(kind)},"ph":"X","ts":{_us(int(s), t0)},'
                f'"dur":{round(max(0, int(e) - int(s)) / 1000.0, 3)},"pid":{pid_of(str(host), int(pid))},'
                f'"tid":{int(tid)},"args":{{{body}}}}}'
            )
        if parts:
            out.write(("" if first else ",\n") + ",\n".join(parts))
            first = False
            stats.events += len(parts)
            stats.spans += len(parts)

    # counters -------------------------------------------------------------------------------------
    for rows in src.sorted_rows(
        "samples", SAMPLE_COLS, (("ts_ns", ">=", lo), ("ts_ns", "<=", hi)), SAMPLE_ORDER
    ):
        for host, pid, target, name, ts, value in rows:
            if target is not None and int(target) >= 0:
                p = pid_of(str(host), int(target))
            else:
                p = launcher_pid if launcher_pid is not None else pid_of(str(host), int(pid))
            emit(
                {
                    "name": str(name),
                    "ph": "C",
                    "ts": _us(int(ts), t0),
                    "pid": p,
                    "tid": 0,
                    "args": {"value": float(value) if value is not None else 0.0},
                }
            )
            stats.counters += 1

    # per-operation I/O ----------------------------------------------------------------------------
    io_named: set[int] = set()
    for rows in src.sorted_rows(
        "io_ops", IO_OP_COLS, (("end_ns", ">=", lo), ("start_ns", "<=", hi)), IO_OP_ORDER
    ):
        for host, pid, module, path, op, offset, size, s, e in rows:
            p = pid_of(str(host), int(pid))
            if p not in io_named:
                io_named.add(p)
                emit({"name": "thread_name", "ph": "M", "pid": p, "tid": IO_TID, "args": {"name": "I/O"}})
                emit(
                    {
                        "name": "thread_sort_index",
                        "ph": "M",
                        "pid": p,
                        "tid": IO_TID,
                        "args": {"sort_index": 2},
                    }
                )
                stats.threads += 1
            emit(
                {
                    "name": f"{op} {os.path.basename(str(path or ''))}",
                    "cat": "io",
                    "ph": "X",
                    "ts": _us(int(s), t0),
                    "dur": round(max(0, int(e) - int(s)) / 1000.0, 3),
                    "pid": p,
                    "tid": IO_TID,
                    "args": {"path": path, "op": op, "module": module, "offset": offset, "size_bytes": size},
                }
            )
            stats.io_ops += 1
    out.write("\n]}\n")
    return stats
