"""The per-step table of a process: the time of every phase in each of its steps.

How a step is cut into phases: the phase spans recorded by the thread that ran the training loop,
clipped to the step's window, are summed per phase; ``other`` is the rest of the step. If measured
phases add up to more than the step (overlapping records), they are scaled down so the breakdown
still sums to exactly 100% and ``other`` is 0 (:func:`leftover`, the one place that rule is written).

The table is defined once, as SQL (:func:`per_step_agg`: the clipped sums of the join of phases and
steps), and runs on either engine (:mod:`holoprof.analyze.engine`). For the statistics, one cheaper
scan gives it for most steps (:func:`scan_steps`): the spans aggregated by step index
(:func:`groups_agg`, decomposable: on the Dask cluster per partition, merged), or on DuckDB one
streamed pass in file order; only the steps whose phases cross their window take the join. Its
columns go batch by batch to files (:class:`Spilled`), so a long run's steps take no memory while
its spans are scanned. The exports read the table a window of steps at a time
(:func:`per_step_tables`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from holoprof import model
from holoprof.analyze.engine import Aggregation, Engine, engine_for, used_params
from holoprof.store.reader import (
    Batch,
    Bound,
    Run,
    is_out_of_memory,
    numpy_batches,
    scan_memory_limit,
    windows,
)

if TYPE_CHECKING:
    from holoprof.analyze.steps import ProcKey

PHASE_COLS = list(model.MEASURED_PHASES)
#: above this many steps needing the exact join (phases crossing their step's window, repeated step
#: indices), the whole per-step table is computed by the join instead of step by step
_FALLBACK_MAX = 200_000
#: rows cut into groups at a time (the stream's batches are cut to this size)
_BATCH_ROWS = 1 << 15
#: Steps whose per-step table an export reads at a time (about 1 KiB of memory per step).
STEP_WINDOW = 100_000
#: One step index in this many of a partition is sampled to cut the steps into windows.
WINDOW_SAMPLE = 512
#: The columns of the spans the per-step aggregations read.
_SPAN_COLS = ("host", "pid", "tid", "kind", "name", "start_ns", "end_ns", "step")
_KNOWN = ", ".join(f"'{p}'" for p in PHASE_COLS)


def _params(proc: ProcKey, **more: Any) -> dict[str, Any]:
    return {"host": proc.host, "pid": proc.pid, "tid": proc.tid, **more}


def _loop_threads(proc: ProcKey) -> str:
    """SQL: the condition that keeps the spans of ``proc``'s loop threads (``$tid``, or the threads
    that each ran a loop of their own: integers of the run's own aggregation)."""
    threads = proc.threads
    if len(threads) == 1:
        return "tid = $tid"
    return f"tid IN ({', '.join(str(int(t)) for t in threads)})"


def _only(steps: list[int] | None, null: bool = False) -> str:
    """SQL: the condition that keeps the spans of the step indices ``$steps`` (and of no index with
    ``null``); empty for every step."""
    if steps is None:
        return ""
    return f" AND (step IN (SELECT unnest($steps::BIGINT[])){' OR step IS NULL' if null else ''})"


def per_step_agg(
    proc: ProcKey, steps: list[int] | None = None, bounds: tuple[Bound, ...] = ()
) -> Aggregation:
    """The per-step table of ``proc``: ``step, s, e, dur`` and the clipped time (ns) of every
    measured phase, one row per step span that does not end before it starts, ordered by step.
    ``steps``: of these step indices only; ``bounds``: of the steps within these. On Dask the spans
    are shuffled by step index, so a step's spans meet wherever they were written."""
    sums = ",\n".join(
        f"CAST(coalesce(sum(d) FILTER (WHERE name = '{p}'), 0) AS BIGINT) AS {p}" for p in PHASE_COLS
    )
    return Aggregation(
        name="per-step",
        table="spans",
        columns=_SPAN_COLS,
        chunk=f"""SELECT step, kind, name, start_ns, end_ns FROM {{t}}
            WHERE host = $host AND pid = $pid{_only(steps)}
              AND ((kind = 'step' AND end_ns >= start_ns) OR (kind = 'phase' AND {_loop_threads(proc)}))""",
        shuffle=("step",),
        group=f"""WITH st AS (SELECT step, start_ns AS s, end_ns AS e FROM {{t}} WHERE kind = 'step'),
            ph AS (
                SELECT p.step, p.name, least(p.end_ns, st.e) - greatest(p.start_ns, st.s) AS d
                FROM {{t}} p JOIN st ON p.step = st.step
                WHERE p.kind = 'phase' AND p.end_ns > st.s AND p.start_ns < st.e)
            SELECT st.step, st.s, st.e, st.e - st.s AS dur,
            {sums}
            FROM st LEFT JOIN ph USING (step) GROUP BY st.step, st.s, st.e""",
        order="step, s, e",
        params=_params(proc, steps=steps),
        pids=(proc.pid,),
        bounds=bounds,
        inline=True,
    )


def outside_agg(proc: ProcKey, steps: list[int] | None = None) -> Aggregation:
    """Per phase name, the time (ns) of ``proc``'s phases outside their step's window (or of no
    step); ``steps``: of these step indices only."""
    return Aggregation(
        name="outside-steps",
        table="spans",
        columns=_SPAN_COLS,
        chunk=f"""SELECT step, kind, name, start_ns, end_ns FROM {{t}}
            WHERE host = $host AND pid = $pid{_only(steps)} AND (kind = 'step' OR (kind = 'phase' AND {_loop_threads(proc)}))""",
        shuffle=("step",),
        group="""WITH st AS (SELECT step, start_ns AS s, end_ns AS e FROM {t} WHERE kind = 'step')
            SELECT p.name, CAST(sum(p.end_ns - p.start_ns) AS BIGINT) AS ns
            FROM {t} p LEFT JOIN st ON p.step = st.step
            WHERE p.kind = 'phase' AND (st.step IS NULL OR p.end_ns <= st.s OR p.start_ns >= st.e)
            GROUP BY p.name""",
        final="SELECT name, CAST(sum(ns) AS BIGINT) AS ns FROM {t} GROUP BY name",
        order="name",
        params=_params(proc, steps=steps),
        pids=(proc.pid,),
        inline=True,
    )


def _orphan_agg(proc: ProcKey, steps: list[int], null: bool) -> Aggregation:
    """Per name, the time (ns) of ``proc``'s phases of names outside the known ones, of the step
    indices ``steps`` (which no step span has) and, with ``null``, of no index."""
    return Aggregation(
        name="orphan-phases",
        table="spans",
        columns=_SPAN_COLS,
        chunk=f"""SELECT name, CAST(sum(end_ns - start_ns) AS BIGINT) AS ns FROM {{t}}
            WHERE kind = 'phase' AND host = $host AND pid = $pid AND {_loop_threads(proc)}
              AND name NOT IN ({_KNOWN}){_only(steps, null)}
            GROUP BY name""",
        combine="SELECT name, CAST(sum(ns) AS BIGINT) AS ns FROM {t} GROUP BY name",
        order="name",
        params=_params(proc, steps=steps),
        pids=(proc.pid,),
    )


def groups_agg(proc: ProcKey) -> Aggregation:
    """``proc``'s step, epoch and phase spans aggregated by step index (see :class:`Groups`): one
    row per index, in no order. Decomposable (counts, sums, minima and maxima), so the Dask engine
    aggregates every partition and merges the parts; DuckDB holds a hash table of one entry per step,
    which spills past its memory limit."""
    sums = ",\n".join(
        f"CAST(sum(end_ns - start_ns) FILTER (WHERE kind = 'phase' AND name = '{p}') AS BIGINT) AS {p}"
        for p in PHASE_COLS
    )
    resum = ", ".join(f"CAST(sum({p}) AS BIGINT) AS {p}" for p in PHASE_COLS)
    return Aggregation(
        name="step-groups",
        table="spans",
        columns=_SPAN_COLS,
        chunk=f"""SELECT step,
               count(*) FILTER (WHERE kind = 'step') AS n_step,
               count(*) FILTER (WHERE kind = 'epoch') AS n_epoch,
               count(*) FILTER (WHERE kind = 'phase' AND name NOT IN ({_KNOWN})) AS n_unknown,
               min(start_ns) FILTER (WHERE kind = 'step') AS s,
               max(end_ns) FILTER (WHERE kind = 'step') AS e,
               min(start_ns) FILTER (WHERE kind = 'phase') AS p_lo,
               max(end_ns) FILTER (WHERE kind = 'phase') AS p_hi,
               min(end_ns - start_ns) FILTER (WHERE kind = 'phase') AS p_min,
               {sums}
            FROM {{t}}
            WHERE host = $host AND pid = $pid AND (kind IN ('step', 'epoch') OR (kind = 'phase' AND {_loop_threads(proc)}))
            GROUP BY step""",
        combine=f"""SELECT step, CAST(sum(n_step) AS BIGINT) AS n_step, CAST(sum(n_epoch) AS BIGINT) AS n_epoch,
               CAST(sum(n_unknown) AS BIGINT) AS n_unknown, min(s) AS s, max(e) AS e, min(p_lo) AS p_lo,
               max(p_hi) AS p_hi, min(p_min) AS p_min, {resum}
            FROM {{t}} GROUP BY step""",
        params=_params(proc),
        pids=(proc.pid,),
    )


def step_sample_agg(proc: ProcKey) -> Aggregation:
    """Every WINDOW_SAMPLE-th step index of ``proc``'s step spans in each partition (the whole table
    on DuckDB), sorted: a sample of their distribution in which each value stands for WINDOW_SAMPLE
    steps."""
    return Aggregation(
        name="step-sample",
        table="spans",
        columns=("host", "pid", "kind", "start_ns", "end_ns", "step"),
        chunk="""SELECT step FROM (
                SELECT step, row_number() OVER (ORDER BY step) AS i FROM {t}
                WHERE kind = 'step' AND host = $host AND pid = $pid AND end_ns >= start_ns AND step IS NOT NULL)
            WHERE i % $every = 0""",
        order="step",
        params={"host": proc.host, "pid": proc.pid, "every": WINDOW_SAMPLE},
        pids=(proc.pid,),
    )


def leftover(dur: Any, phases: Iterable[Any], dtype: Any) -> tuple[Any, Any]:
    """The rule that splits a step (the one place it is written): ``other`` is the step's time
    (``dur``) that no measured phase covers, and where the ``phases`` add up to more than the step
    (overlapping records) they are scaled by ``f = dur / measured`` so that they fill it exactly and
    ``other`` is 0. Returns ``(other, f)``, f None when no step needs scaling (else 1 where none is
    scaled). ``phases`` are taken one at a time; ``other`` is computed in ``dtype``."""
    import numpy as np  # lazy: numpy loads with the first analysis

    other = dur.astype(dtype)
    for column in phases:
        other -= column
    over = other < 0  # the phases add up to more than the step (which is never negative)
    if not over.any():
        np.maximum(other, 0, out=other)
        return other, None
    measured = dur.astype(np.int64) - other
    over &= measured > 0
    f = np.ones(len(dur))
    f[over] = dur[over] / measured[over]
    return np.maximum(dur - measured * f, 0), f


class Spilled:
    """A column of per-step integers written batch by batch to a file in the run's private temporary
    folder, so that the columns of a long run take no memory while its spans are scanned (2 M steps:
    16 MiB a column); the statistics read them back one at a time, int32 when the values fit. A
    column of zeros (a phase that never occurs) writes nothing."""

    _PIECE = 1 << 18

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        self.file: Any = None
        self.n = 0
        self.zeros = 0  # zeros before the first other value, not written yet
        self.lo = self.hi = 0  # bounds of the values (with 0)

    def add(self, values: Any) -> None:
        import numpy as np  # lazy: numpy loads with the first analysis that needs it

        k = len(values)
        if k == 0:
            return
        lo, hi = int(values.min()), int(values.max())
        if self.file is None:
            if lo == 0 and hi == 0:
                self.zeros += k
                self.n += k
                return
            # open until the column is dropped; the file has no name, and goes when it is closed
            self.file = tempfile.TemporaryFile(dir=self.folder, prefix="holoprof-steps-")  # noqa: SIM115
            for at in range(0, self.zeros, self._PIECE):
                self.file.write(np.zeros(min(self._PIECE, self.zeros - at), dtype=np.int64).data)
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        self.file.write(np.ascontiguousarray(values, dtype=np.int64).data)
        self.n += k

    def load(self) -> Any:
        """The whole column, int32 when its values fit, else int64."""
        import numpy as np  # lazy: numpy loads with the first analysis that needs it

        fits = self.lo >= -(2**31) and self.hi < 2**31
        out = np.zeros(self.n, dtype=np.int32 if fits else np.int64)
        if self.file is None:
            return out
        self.file.flush()
        self.file.seek(0)
        piece = np.empty(min(self.n, self._PIECE), dtype=np.int64)
        for at in range(0, self.n, self._PIECE):
            k = min(self._PIECE, self.n - at)
            self.file.readinto(piece[:k].data)
            out[at : at + k] = piece[:k]
        return out


class _Steps:
    """The step index column: only its first index and length while the indices run on one by one
    (the usual case: the streamed scan, every step inside its window), a spilled column from the
    first gap."""

    def __init__(self, folder: str | None) -> None:
        self.folder = folder
        self.first: int | None = None  # while a run of indices: its first
        self.n = 0
        self.col: Spilled | None = None

    def add(self, values: Any) -> None:
        import numpy as np  # lazy: numpy loads with the first analysis that needs it

        k = len(values)
        if self.col is None and k:
            nxt = int(values[0]) if self.first is None else self.first + self.n
            if (
                int(values[0]) == nxt
                and int(values[-1]) == nxt + k - 1
                and (k < 3 or bool((np.diff(values) == 1).all()))
            ):
                self.first = nxt if self.first is None else self.first
                self.n += k
                return
            self.col, first = Spilled(self.folder), self.first or 0
            for at in range(0, self.n, Spilled._PIECE):
                self.col.add(np.arange(first + at, first + min(self.n, at + Spilled._PIECE)))
        if self.col is not None:
            self.col.add(values)

    def indices(self) -> Any:
        """The indices: a ``range`` while they run on one by one, else the column."""
        if self.col is None:
            return range(self.first or 0, (self.first or 0) + self.n)
        return self.col.load()


@dataclass
class PerStep:
    """The main loop's per-step table: durations in memory, phases as spilled columns read back one at
    a time (one entry per step, in no particular order)."""

    step: Any  # a range when the steps are in order, one index after the other
    dur: Any
    phases: dict[str, Spilled | None]  # clipped ns per step, None for a phase that never occurs
    first_start_ns: int
    last_end_ns: int
    epochs: int
    outside_ns: dict[str, float]  # phase time recorded outside any step, by name
    unique_steps: bool  # no step index appears twice
    how: str  # how the steps were scanned: "stream" (in file order), "hash" (DuckDB), "join"


class _Gather:
    """The per-step columns being gathered, batch by batch, and the window of the steps seen."""

    def __init__(self, folder: str | None) -> None:
        self.step, self.dur = _Steps(folder), Spilled(folder)
        self.cols = {p: Spilled(folder) for p in PHASE_COLS}
        self.first: int | None = None
        self.last: int | None = None

    def add(self, step: Any, s: Any, e: Any, phases: dict[str, Any]) -> None:
        if len(step) == 0:
            return
        self.step.add(step)
        self.dur.add(e - s)
        for p in PHASE_COLS:
            self.cols[p].add(phases[p])
        lo, hi = int(s.min()), int(e.max())
        self.first = lo if self.first is None else min(self.first, lo)
        self.last = hi if self.last is None else max(self.last, hi)

    def result(self, epochs: int, outside_ns: dict[str, float], unique: bool, how: str) -> PerStep:
        return PerStep(
            step=self.step.indices(),
            dur=self.dur.load(),
            phases={p: c if c.file is not None else None for p, c in self.cols.items()},
            first_start_ns=int(self.first or 0),
            last_end_ns=int(self.last or 0),
            epochs=epochs,
            outside_ns=outside_ns,
            unique_steps=unique,
            how=how,
        )


_I64_MAX = (1 << 63) - 1
_I64_MIN = -(1 << 63)
#: the per-step aggregates, as both scans give them (see :class:`_Groups`)
_MIN_FIELDS = ("s", "p_lo", "p_min")
_MAX_FIELDS = ("e", "p_hi")
_SUM_FIELDS = ("n_step", "n_unknown", *PHASE_COLS)


class _Unsorted(Exception):
    """The streamed pass cannot take these spans (a step's spans not one after another in file order, a
    span without a start or an end): DuckDB's aggregation by step runs instead."""


class _Groups:
    """What one scan of a process's step, epoch and phase spans tells, group by group (a group: the
    spans of one step index). Both scans feed it: the streamed pass (:func:`_stream_groups`) and
    DuckDB's aggregation by step. Steps whose phases lie inside their window go to the per-step
    columns; the others are listed for the exact join."""

    def __init__(self, folder: str | None) -> None:
        self.g = _Gather(folder)
        self.epochs = 0
        self.outside = dict.fromkeys(PHASE_COLS, 0)
        self.fallback: list[Any] = []  # step indices to compute with the exact join
        self.orphan: list[Any] = []  # step indices (with phases of unknown names) that no step span has
        self.orphan_null = False
        self.null_steps = False  # step spans without an index: only the plain join handles them

    def null_group(self, n_step: int, n_unknown: int, sums: dict[str, int]) -> None:
        """The spans without a step index (their phases are all outside any step)."""
        self.null_steps = self.null_steps or n_step > 0
        self.orphan_null = self.orphan_null or n_unknown > 0
        for p in PHASE_COLS:
            self.outside[p] += int(sums.get(p, 0))

    def add(self, d: dict[str, Any]) -> None:
        """Groups with a step index: numpy arrays ``step`` and the fields above, where a min or max
        over no span is the int64 bound that cannot win (s: max, e: min, ...)."""
        import numpy as np  # lazy: numpy loads with the first analysis that needs it

        step, n_step = d["step"], d["n_step"]
        s = np.where(n_step > 0, d["s"], 0)
        e = np.where(n_step > 0, d["e"], -1)
        p_min = np.where(d["p_min"] == _I64_MAX, 0, d["p_min"])
        none = n_step == 0
        exact = (n_step == 1) & (s <= e) & (p_min >= 0) & (d["p_lo"] >= s) & (d["p_hi"] <= e)
        if none.any():  # phases whose step index no step span has: all outside
            for p in PHASE_COLS:
                self.outside[p] += int(d[p][none].sum())
            self.orphan.extend(step[none & (d["n_unknown"] > 0)].tolist())
        redo = ~none & ~exact
        if redo.any():
            self.fallback.extend(step[redo].tolist())
        self.g.add(step[exact], s[exact], e[exact], {p: d[p][exact] for p in PHASE_COLS})


def _add_groups(batches: Iterator[Batch], acc: _Groups) -> None:
    """The rows of :func:`groups_agg` into ``acc``."""
    import numpy as np  # lazy: numpy loads with the first analysis

    fill = {"s": _I64_MAX, "p_lo": _I64_MAX, "p_min": _I64_MAX, "e": _I64_MIN, "p_hi": _I64_MIN}
    for b in batches:
        cols = {}
        for k in b.names:  # a min, max or sum over no span is null: the value that cannot win, or 0
            v, nulls = b.column(k), b.nulls(k)
            cols[k] = v if nulls is None else np.where(nulls, fill.get(k, 0), v)
        acc.epochs += int(cols.pop("n_epoch").sum())
        nulls = b.nulls("step")
        if nulls is not None:
            at = {k: int(v[nulls].sum()) for k, v in cols.items() if k in _SUM_FIELDS}
            acc.null_group(at["n_step"], at["n_unknown"], at)
            cols = {k: v[~nulls] for k, v in cols.items()}
        acc.add(cols)


def _stream_groups(run: Run, proc: ProcKey, acc: _Groups) -> None:
    """The same groups as :func:`groups_agg` from one streamed pass over the spans in file order, with
    no hash table: after compaction a process's spans are sorted by start time, so the spans of a step
    (its step span, then its phases) follow one another and each group is cut where the step index
    changes. Memory is one batch. Raises :class:`_Unsorted` as soon as a step index goes back (a
    step's spans split).

    NumPy beside the SQL on purpose: SQL has no aggregation by runs of equal keys in file order, and
    this pass keeps a report of 100 M spans at a flat memory (DuckDB's hash table of steps does not).
    It needs the run's DuckDB reading in file order, so only the DuckDB engine takes it
    (:attr:`~holoprof.analyze.engine.Engine.streams`); the groups it gives are the aggregation's,
    which the tests check (tests/test_scale.py)."""
    import numpy as np  # lazy: numpy loads with the first analysis that needs it

    codes = " ".join(f"WHEN '{p}' THEN {i + 2}" for i, p in enumerate(PHASE_COLS))
    sql = f"""
        SELECT step, (CASE kind WHEN 'step' THEN 0 WHEN 'epoch' THEN 1
                      ELSE CASE name {codes} ELSE -1 END END)::TINYINT AS c, start_ns, end_ns
        FROM {run.process_source("spans", proc.host, proc.pid)}
        WHERE host = $host AND pid = $pid AND (kind IN ('step', 'epoch') OR (kind = 'phase' AND {_loop_threads(proc)}))"""
    carry: dict[str, Any] | None = None  # the slice's last group: it may go on in the next slice
    cur = run.con.cursor()
    try:
        with run.ordered():
            for b in numpy_batches(cur, sql, used_params(sql, _params(proc))):
                if b.nulls("start_ns") is not None or b.nulls("end_ns") is not None:
                    raise _Unsorted  # a span without a start or an end: DuckDB's aggregation skips it
                nulls = b.nulls("step")
                for lo in range(0, b.num_rows, _BATCH_ROWS):
                    cut = slice(lo, lo + _BATCH_ROWS)
                    step, code = b.column("step")[cut], b.column("c")[cut]
                    start, end = b.column("start_ns")[cut], b.column("end_ns")[cut]
                    acc.epochs += int(np.count_nonzero(code == 1))
                    keep = code != 1
                    if nulls is not None and nulls[cut].any():
                        at = nulls[cut] & keep
                        dur = end[at] - start[at]
                        sums = {p: int(dur[code[at] == i + 2].sum()) for i, p in enumerate(PHASE_COLS)}
                        acc.null_group(
                            int(np.count_nonzero(code[at] == 0)), int(np.count_nonzero(code[at] == -1)), sums
                        )
                        keep &= ~nulls[cut]
                    if not keep.all():
                        step, code, start, end = step[keep], code[keep], start[keep], end[keep]
                    if len(step) == 0:
                        continue
                    if (step[1:] < step[:-1]).any() or (carry is not None and step[0] < carry["step"][0]):
                        raise _Unsorted
                    g = _segments(step, code, start, end)
                    if carry is not None:
                        if g["step"][0] == carry["step"][0]:
                            for k in _MIN_FIELDS:
                                g[k][0] = min(g[k][0], carry[k][0])
                            for k in _MAX_FIELDS:
                                g[k][0] = max(g[k][0], carry[k][0])
                            for k in _SUM_FIELDS:
                                g[k][0] += carry[k][0]
                        else:
                            acc.add(carry)
                    carry = {k: v[-1:].copy() for k, v in g.items()}
                    acc.add({k: v[:-1] for k, v in g.items()})
    finally:
        cur.close()
    if carry is not None:
        acc.add(carry)


def _segments(step: Any, code: Any, start: Any, end: Any) -> dict[str, Any]:
    """The groups of a batch sorted by step index (one per run of equal indices)."""
    import numpy as np  # lazy: numpy loads with the first analysis that needs it

    at = np.concatenate(([0], np.flatnonzero(step[1:] != step[:-1]) + 1))
    is_step = code == 0
    dur = end - start
    g: dict[str, Any] = {
        "step": step[at],
        "n_step": np.add.reduceat(is_step.astype(np.int64), at),
        "n_unknown": np.add.reduceat((code == -1).astype(np.int64), at),
        "s": np.minimum.reduceat(np.where(is_step, start, _I64_MAX), at),
        "e": np.maximum.reduceat(np.where(is_step, end, _I64_MIN), at),
        "p_lo": np.minimum.reduceat(np.where(is_step, _I64_MAX, start), at),
        "p_hi": np.maximum.reduceat(np.where(is_step, _I64_MIN, end), at),
        "p_min": np.minimum.reduceat(np.where(is_step, _I64_MAX, dur), at),
    }
    seen = np.bincount(code + 1, minlength=len(PHASE_COLS) + 3)
    for i, p in enumerate(PHASE_COLS):
        if seen[i + 3]:
            g[p] = np.add.reduceat(np.where(code == i + 2, dur, 0), at)
        else:
            g[p] = np.zeros(len(at), dtype=np.int64)
    return g


def scan_steps(run: Run, proc: ProcKey, stream: bool = True, engine: Engine | None = None) -> PerStep:
    """One scan of the spans by step index gives each step's window and the summed duration of each
    of its phases. When every phase of a step lies inside the step's window (the usual case) that sum
    is exactly the clipped sum; the other steps (phases crossing the window, a step index used twice)
    are computed by the exact join (:func:`per_step_agg`), restricted to them. On DuckDB the scan is
    one streamed pass in file order when each step's spans are contiguous there (runs compacted by
    holoprof), else (and on Dask) :func:`groups_agg`; either way results go batch by batch into
    spilled columns (:class:`Spilled`)."""
    eng = engine_for(run, engine)
    acc = _Groups(run.temp_dir)
    how = "stream" if stream and eng.streams else "hash"
    if how == "stream":
        try:
            with run.lean_memory(scan_memory_limit(1)):  # one thread: see Run.ordered
                _stream_groups(run, proc, acc)
        except Exception as exc:  # spans out of order, or a scan that needs more memory than foreseen
            if not isinstance(exc, _Unsorted) and not is_out_of_memory(exc):
                raise
            acc, how = _Groups(run.temp_dir), "hash"
    if how == "hash":
        _add_groups(eng.aggregate_batches(groups_agg(proc)), acc)
    epochs, outside, fallback, orphan = acc.epochs, acc.outside, acc.fallback, acc.orphan
    if acc.null_steps or len(fallback) > _FALLBACK_MAX:
        return join_steps(run, proc, epochs, eng)
    unique = True
    if fallback:
        # the exact join for those steps only: a step index repeated gives one row per step span
        _add_joined(eng, proc, acc.g, fallback)
        unique = False
        for name, ns in eng.aggregate(outside_agg(proc, fallback)):
            outside[str(name)] = outside.get(str(name), 0) + int(ns or 0)
    if orphan or acc.orphan_null:
        # phases of names outside the known ones, whose step no step span has: by name
        for name, ns in eng.aggregate(_orphan_agg(proc, orphan, acc.orphan_null)):
            outside[str(name)] = outside.get(str(name), 0) + int(ns or 0)
    return acc.g.result(epochs, {k: float(v) for k, v in outside.items() if v}, unique, how)


def _add_joined(eng: Engine, proc: ProcKey, g: _Gather, steps: list[int] | None = None) -> None:
    """The exact join's per-step rows (of the step indices ``steps``, or all) into ``g``."""
    import numpy as np  # lazy: numpy loads with the first analysis

    for b in eng.aggregate_batches(per_step_agg(proc, steps)):
        # a step span without an index sorts last, as ORDER BY step puts it
        step, nulls = b.column("step"), b.nulls("step")
        step = step if nulls is None else np.where(nulls, np.iinfo(np.int64).max, step)
        g.add(step, b.column("s"), b.column("e"), {p: b.column(p) for p in PHASE_COLS})


def join_steps(run: Run, proc: ProcKey, epochs: int, engine: Engine | None = None) -> PerStep:
    """The per-step table by the plain join over all steps (when the shortcut does not apply)."""
    eng = engine_for(run, engine)
    g = _Gather(run.temp_dir)
    _add_joined(eng, proc, g)
    rows = eng.aggregate(outside_agg(proc))
    return g.result(epochs, {str(n): float(v or 0) for n, v in rows if v}, False, "join")


@dataclass
class PerStepTable:
    """A piece of the per-step table, in step order: step indices, ends and durations (ns), and the
    time of every phase in each step (``other`` included) after :func:`leftover`."""

    step: Any
    e: Any
    dur: Any
    phases: dict[str, Any]


def per_step_tables(
    run: Run, proc: ProcKey, engine: Engine | None = None, size: int | None = None
) -> Iterator[PerStepTable]:
    """``proc``'s per-step table in step order, in pieces: one window of about ``size`` (default
    STEP_WINDOW) steps at a time (cut at quantiles of a sample of the step indices,
    :func:`step_sample_agg`), each as the batches its query gives, so that memory holds one window
    however long the run is. Step spans without an index are left out."""
    import numpy as np  # lazy: numpy loads with the first analysis

    eng = engine_for(run, engine)
    sample = [int(s) for (s,) in eng.aggregate(step_sample_agg(proc))]

    def quantiles(qs: list[float]) -> list[int | None]:
        return [sample[min(len(sample) - 1, int(q * len(sample)))] for q in qs] if sample else []

    for window in windows(len(sample) * WINDOW_SAMPLE, "step", quantiles, size or STEP_WINDOW):
        for b in eng.aggregate_batches(per_step_agg(proc, bounds=window)):
            keep = None if b.nulls("step") is None else ~b.nulls("step")
            cols = {
                c: b.column(c) if keep is None else b.column(c)[keep]
                for c in ("step", "e", "dur", *PHASE_COLS)
            }
            other, f = leftover(cols["dur"], (cols[p] for p in PHASE_COLS), np.int64)
            phases = {p: cols[p] if f is None else cols[p] * f for p in PHASE_COLS}
            phases["other"] = other
            yield PerStepTable(step=cols["step"], e=cols["e"], dur=cols["dur"], phases=phases)
