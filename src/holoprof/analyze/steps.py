"""Step statistics and the phase breakdown.

Pure functions of a loaded run. Everything heavy runs as one DuckDB query over the spans, so the
cost grows with the run's size on disk, not with Python loops.

How a step is cut into phases: the phase spans recorded by the thread that ran the training loop,
clipped to the step's window, are summed per phase; ``other`` is the rest of the step. If measured
phases add up to more than the step (overlapping records), they are scaled down so the breakdown
still sums to exactly 100% and ``other`` is 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from holoprof import model
from holoprof.store.reader import Run, is_out_of_memory, numpy_batches, scan_memory_limit

NS = 1e9


@dataclass(frozen=True)
class ProcKey:
    host: str
    pid: int
    rank: int
    tid: int


@dataclass
class PhaseStat:
    fraction: float  # of the total step time
    total_s: float
    median_s: float  # per step
    median_share: float = 0.0  # median over steps of (phase time / step time): robust to warm-up
    steps: int = 0  # steps in which the phase occurs (its total / steps: its time per occurrence)


@dataclass
class StepStats:
    proc: ProcKey
    count: int
    median_s: float
    p90_s: float
    mean_s: float
    per_s: float
    total_s: float
    first_start_ns: int
    last_end_ns: int
    phases: dict[str, PhaseStat]
    epochs: int = 0
    timeline: list[dict[str, float]] = field(default_factory=list)
    outside_ns: dict[str, float] | None = None  # phase time outside any step, by name (when known)


def step_processes(run: Run) -> list[ProcKey]:
    """Processes that ran training steps, the main training loop first.

    The main loop is the process with the most steps; among ranks with equally many, the lowest
    rank. Each process's loop thread is the thread that recorded most of its steps (the lowest thread
    id on a tie, as the Dask engine decides).
    """
    rows = run.rows(
        """WITH t AS (SELECT host, pid, tid, any_value(rank) AS rank, count(*) AS n
                      FROM spans WHERE kind = 'step' GROUP BY host, pid, tid)
           SELECT host, pid, any_value(rank) AS rank, first(tid ORDER BY n DESC, tid) AS tid, sum(n) AS n
           FROM t GROUP BY host, pid
           ORDER BY n DESC, CASE WHEN any_value(rank) < 0 THEN 1 << 30 ELSE any_value(rank) END, pid"""
    )
    return [ProcKey(str(h), int(p), int(r if r is not None else -1), int(t)) for h, p, r, t, _ in rows]


_PHASE_COLS = [p for p in model.MEASURED_PHASES]
#: above this many steps needing the exact join (phases crossing their step's window, repeated step
#: indices), the whole per-step table is computed by the join instead of step by step
_FALLBACK_MAX = 200_000
#: rows cut into groups at a time (the stream's batches are cut to this size)
_BATCH_ROWS = 1 << 15


def _per_step_sql(step_filter: str = "") -> str:
    """The per-step table as SQL CTEs (``raw``: clipped phase sums per step, ``per_step``: scaled
    so that phases never exceed their step). ``step_filter`` restricts the steps (an SQL condition)."""
    sums = ",\n".join(f"coalesce(sum(d) FILTER (WHERE name = '{p}'), 0) AS {p}" for p in _PHASE_COLS)
    measured = " + ".join(_PHASE_COLS)
    scaled = ",\n".join(f"{p} * f AS {p}" for p in _PHASE_COLS)
    extra = f" AND ({step_filter})" if step_filter else ""
    return f"""
    WITH st AS (
        SELECT step, start_ns AS s, end_ns AS e FROM spans
        WHERE kind = 'step' AND host = $host AND pid = $pid AND end_ns >= start_ns{extra}
    ),
    ph AS (
        SELECT p.step, p.name,
               least(p.end_ns, st.e) - greatest(p.start_ns, st.s) AS d
        FROM spans p JOIN st ON p.step = st.step
        WHERE p.kind = 'phase' AND p.host = $host AND p.pid = $pid AND p.tid = $tid
          AND p.end_ns > st.s AND p.start_ns < st.e
    ),
    raw AS (
        SELECT st.step, st.s, st.e, (st.e - st.s) AS dur,
        {sums}
        FROM st LEFT JOIN ph USING (step) GROUP BY st.step, st.s, st.e
    ),
    per_step AS (
        SELECT step, s, e, dur,
        {scaled},
        greatest(dur - ({measured}) * f, 0) AS other
        FROM (SELECT *, CASE WHEN ({measured}) > dur AND ({measured}) > 0
                             THEN dur / ({measured}) ELSE 1.0 END AS f FROM raw)
    )
    """


_OUTSIDE_SQL = """
    WITH st AS (SELECT step, start_ns AS s, end_ns AS e FROM spans
                WHERE kind = 'step' AND host = $host AND pid = $pid{extra})
    SELECT p.name, sum(p.end_ns - p.start_ns)
    FROM spans p LEFT JOIN st ON p.step = st.step
    WHERE p.kind = 'phase' AND p.host = $host AND p.pid = $pid AND p.tid = $tid{pextra}
      AND (st.step IS NULL OR p.end_ns <= st.s OR p.start_ns >= st.e)
    GROUP BY p.name ORDER BY p.name"""


class _Spilled:
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
        import numpy as np

        k = len(values)
        if k == 0:
            return
        lo, hi = int(values.min()), int(values.max())
        if self.file is None:
            if lo == 0 and hi == 0:
                self.zeros += k
                self.n += k
                return
            import tempfile

            # open until the column is dropped; the file has no name, and goes when it is closed
            self.file = tempfile.TemporaryFile(dir=self.folder, prefix="holoprof-steps-")  # noqa: SIM115
            for at in range(0, self.zeros, self._PIECE):
                self.file.write(np.zeros(min(self._PIECE, self.zeros - at), dtype=np.int64).data)
        self.lo, self.hi = min(self.lo, lo), max(self.hi, hi)
        self.file.write(np.ascontiguousarray(values, dtype=np.int64).data)
        self.n += k

    def load(self) -> Any:
        """The whole column, int32 when its values fit, else int64."""
        import numpy as np

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
        self.col: _Spilled | None = None

    def add(self, values: Any) -> None:
        import numpy as np

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
            self.col, first = _Spilled(self.folder), self.first or 0
            for at in range(0, self.n, _Spilled._PIECE):
                self.col.add(np.arange(first + at, first + min(self.n, at + _Spilled._PIECE)))
        if self.col is not None:
            self.col.add(values)

    def indices(self) -> Any:
        """The indices: a ``range`` while they run on one by one, else the column."""
        if self.col is None:
            return range(self.first or 0, (self.first or 0) + self.n)
        return self.col.load()


@dataclass
class _PerStep:
    """The main loop's per-step table: durations in memory, phases as spilled columns read back one at
    a time (one entry per step, in no particular order)."""

    step: Any  # a range when the steps are in order, one index after the other
    dur: Any
    phases: dict[str, _Spilled | None]  # clipped ns per step, None for a phase that never occurs
    first_start_ns: int
    last_end_ns: int
    epochs: int
    outside_ns: dict[str, float]  # phase time recorded outside any step, by name
    unique_steps: bool  # no step index appears twice
    how: str  # how the steps were scanned: "stream" (in file order), "hash" (DuckDB), "join"


class _Gather:
    """The per-step columns being gathered, batch by batch, and the window of the steps seen."""

    def __init__(self, folder: str | None) -> None:
        self.step, self.dur = _Steps(folder), _Spilled(folder)
        self.cols = {p: _Spilled(folder) for p in _PHASE_COLS}
        self.first: int | None = None
        self.last: int | None = None

    def add(self, step: Any, s: Any, e: Any, phases: dict[str, Any]) -> None:
        if len(step) == 0:
            return
        self.step.add(step)
        self.dur.add(e - s)
        for p in _PHASE_COLS:
            self.cols[p].add(phases[p])
        lo, hi = int(s.min()), int(e.max())
        self.first = lo if self.first is None else min(self.first, lo)
        self.last = hi if self.last is None else max(self.last, hi)

    def result(self, epochs: int, outside_ns: dict[str, float], unique: bool, how: str) -> _PerStep:
        return _PerStep(
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
_SUM_FIELDS = ("n_step", "n_unknown", *_PHASE_COLS)


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
        self.outside = dict.fromkeys(_PHASE_COLS, 0)
        self.fallback: list[Any] = []  # step indices to compute with the exact join
        self.orphan: list[Any] = []  # step indices (with phases of unknown names) that no step span has
        self.orphan_null = False
        self.null_steps = False  # step spans without an index: only the plain join handles them

    def null_group(self, n_step: int, n_unknown: int, sums: dict[str, int]) -> None:
        """The spans without a step index (their phases are all outside any step)."""
        self.null_steps = self.null_steps or n_step > 0
        self.orphan_null = self.orphan_null or n_unknown > 0
        for p in _PHASE_COLS:
            self.outside[p] += int(sums.get(p, 0))

    def add(self, d: dict[str, Any]) -> None:
        """Groups with a step index: numpy arrays ``step`` and the fields above, where a min or max
        over no span is the int64 bound that cannot win (s: max, e: min, ...)."""
        import numpy as np

        step, n_step = d["step"], d["n_step"]
        s = np.where(n_step > 0, d["s"], 0)
        e = np.where(n_step > 0, d["e"], -1)
        p_min = np.where(d["p_min"] == _I64_MAX, 0, d["p_min"])
        none = n_step == 0
        exact = (n_step == 1) & (s <= e) & (p_min >= 0) & (d["p_lo"] >= s) & (d["p_hi"] <= e)
        if none.any():  # phases whose step index no step span has: all outside
            for p in _PHASE_COLS:
                self.outside[p] += int(d[p][none].sum())
            self.orphan.extend(step[none & (d["n_unknown"] > 0)].tolist())
        redo = ~none & ~exact
        if redo.any():
            self.fallback.extend(step[redo].tolist())
        self.g.add(step[exact], s[exact], e[exact], {p: d[p][exact] for p in _PHASE_COLS})


def _sql_groups(cur: Any, params: dict[str, Any], acc: _Groups) -> None:
    """DuckDB's aggregation of the spans by step index (any order on disk; a hash table of one entry
    per step, which spills past the memory limit)."""
    import numpy as np

    known = ", ".join(f"'{p}'" for p in _PHASE_COLS)
    sums = ",\n".join(
        f"sum(end_ns - start_ns) FILTER (WHERE kind = 'phase' AND name = '{p}')::BIGINT AS {p}"
        for p in _PHASE_COLS
    )
    sql = f"""
        SELECT step,
               count(*) FILTER (WHERE kind = 'step') AS n_step,
               count(*) FILTER (WHERE kind = 'epoch') AS n_epoch,
               count(*) FILTER (WHERE kind = 'phase' AND name NOT IN ({known})) AS n_unknown,
               min(start_ns) FILTER (WHERE kind = 'step') AS s,
               max(end_ns) FILTER (WHERE kind = 'step') AS e,
               min(start_ns) FILTER (WHERE kind = 'phase') AS p_lo,
               max(end_ns) FILTER (WHERE kind = 'phase') AS p_hi,
               min(end_ns - start_ns) FILTER (WHERE kind = 'phase') AS p_min,
               {sums}
        FROM spans
        WHERE host = $host AND pid = $pid AND (kind IN ('step', 'epoch') OR (kind = 'phase' AND tid = $tid))
        GROUP BY step"""
    fill = {"s": _I64_MAX, "p_lo": _I64_MAX, "p_min": _I64_MAX, "e": _I64_MIN, "p_hi": _I64_MIN}
    for b in numpy_batches(cur, sql, params):
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


def _stream_groups(run: Run, cur: Any, params: dict[str, Any], acc: _Groups) -> None:
    """The same groups from one streamed pass over the spans in file order, with no hash table: after
    compaction a process's spans are sorted by start time, so the spans of a step (its step span, then
    its phases) follow one another and each group is cut where the step index changes. Memory is
    one batch. Raises :class:`_Unsorted` as soon as a step index goes back (a step's spans split)."""
    import numpy as np

    codes = " ".join(f"WHEN '{p}' THEN {i + 2}" for i, p in enumerate(_PHASE_COLS))
    sql = f"""
        SELECT step, (CASE kind WHEN 'step' THEN 0 WHEN 'epoch' THEN 1
                      ELSE CASE name {codes} ELSE -1 END END)::TINYINT AS c, start_ns, end_ns
        FROM spans
        WHERE host = $host AND pid = $pid AND (kind IN ('step', 'epoch') OR (kind = 'phase' AND tid = $tid))"""
    carry: dict[str, Any] | None = None  # the slice's last group: it may go on in the next slice
    with run.ordered():
        for b in numpy_batches(cur, sql, params):
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
                    sums = {p: int(dur[code[at] == i + 2].sum()) for i, p in enumerate(_PHASE_COLS)}
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
    if carry is not None:
        acc.add(carry)


def _segments(step: Any, code: Any, start: Any, end: Any) -> dict[str, Any]:
    """The groups of a batch sorted by step index (one per run of equal indices)."""
    import numpy as np

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
    seen = np.bincount(code + 1, minlength=len(_PHASE_COLS) + 3)
    for i, p in enumerate(_PHASE_COLS):
        if seen[i + 3]:
            g[p] = np.add.reduceat(np.where(code == i + 2, dur, 0), at)
        else:
            g[p] = np.zeros(len(at), dtype=np.int64)
    return g


def _scan_steps(run: Run, proc: ProcKey, stream: bool = True) -> _PerStep:
    """One scan of the spans by step index gives each step's window and the summed duration of each
    of its phases. When every phase of a step lies inside the step's window (the usual case) that sum
    is exactly the clipped sum; the other steps (phases crossing the window, a step index used twice)
    are computed by the exact join, restricted to them. The scan is one streamed pass in file order
    when each step's spans are contiguous there (runs compacted by holoprof), else DuckDB's
    aggregation by step; either way results go batch by batch into spilled columns (:class:`_Spilled`)."""
    import numpy as np

    params = {"host": proc.host, "pid": proc.pid, "tid": proc.tid}
    known = ", ".join(f"'{p}'" for p in _PHASE_COLS)
    cur = run.con.cursor()
    acc = _Groups(run.temp_dir)
    how = "stream" if stream else "hash"
    if stream:
        try:
            with run.lean_memory(scan_memory_limit(1)):  # one thread: see Run.ordered
                _stream_groups(run, cur, params, acc)
        except Exception as exc:  # spans out of order, or a scan that needs more memory than foreseen
            if not isinstance(exc, _Unsorted) and not is_out_of_memory(exc):
                raise
            acc, how = _Groups(run.temp_dir), "hash"
    if how == "hash":
        _sql_groups(cur, params, acc)
    epochs, outside, fallback, orphan = acc.epochs, acc.outside, acc.fallback, acc.orphan
    if acc.null_steps or len(fallback) > _FALLBACK_MAX:
        return _join_steps(run, proc, epochs)
    unique = True
    if fallback:
        # the exact join for those steps only: a step index repeated gives one row per step span
        cur.register("hp_redo_steps", {"step": np.asarray(fallback, dtype=np.int64)})
        cond = "step IN (SELECT step FROM hp_redo_steps)"
        _add_joined(cur, params, acc.g, cond)
        unique = False
        rows = cur.execute(
            _OUTSIDE_SQL.format(extra=f" AND {cond}", pextra=f" AND p.{cond}"), params
        ).fetchall()
        for name, ns in rows:
            outside[str(name)] = outside.get(str(name), 0) + int(ns or 0)
    if orphan or acc.orphan_null:
        # phases of names outside the known ones, whose step no step span has: by name
        cur.register("hp_orphan_steps", {"step": np.asarray(orphan, dtype=np.int64)})
        rows = cur.execute(
            f"""SELECT name, sum(end_ns - start_ns) FROM spans
                WHERE kind = 'phase' AND host = $host AND pid = $pid AND tid = $tid
                  AND name NOT IN ({known})
                  AND (step IN (SELECT step FROM hp_orphan_steps){" OR step IS NULL" if acc.orphan_null else ""})
                GROUP BY name""",
            params,
        ).fetchall()
        for name, ns in rows:
            outside[str(name)] = outside.get(str(name), 0) + int(ns or 0)
    cur.close()
    return acc.g.result(epochs, {k: float(v) for k, v in outside.items() if v}, unique, how)


def _add_joined(cur: Any, params: dict[str, Any], g: _Gather, step_filter: str = "") -> None:
    """The exact join's per-step rows (of the steps ``step_filter`` keeps) into ``g``."""
    import numpy as np

    sel = ", ".join(f"{p}::BIGINT AS {p}" for p in _PHASE_COLS)
    for b in numpy_batches(
        cur, _per_step_sql(step_filter) + f"SELECT step, s, e, dur, {sel} FROM raw", params
    ):
        # a step span without an index sorts last, as ORDER BY step puts it
        step, nulls = b.column("step"), b.nulls("step")
        step = step if nulls is None else np.where(nulls, np.iinfo(np.int64).max, step)
        g.add(step, b.column("s"), b.column("e"), {p: b.column(p) for p in _PHASE_COLS})


def _join_steps(run: Run, proc: ProcKey, epochs: int) -> _PerStep:
    """The per-step table by the plain join over all steps (when the shortcut does not apply)."""

    params = {"host": proc.host, "pid": proc.pid, "tid": proc.tid}
    cur = run.con.cursor()
    g = _Gather(run.temp_dir)
    _add_joined(cur, params, g)
    rows = cur.execute(_OUTSIDE_SQL.format(extra="", pextra=""), params).fetchall()
    cur.close()
    return g.result(epochs, {str(n): float(v or 0) for n, v in rows if v}, False, "join")


def step_stats(run: Run, proc: ProcKey, timeline_points: int = 120) -> StepStats:
    """Step and phase statistics of ``proc``'s training loop (medians over its steps)."""
    return _stats(run.lean(lambda: _scan_steps(run, proc)), proc, timeline_points)


def _stats(ps: _PerStep, proc: ProcKey, timeline_points: int) -> StepStats:
    """Statistics of the per-step columns. Written for memory: besides the step durations, ``other``
    and one float buffer, one phase column is in memory at a time (2 M steps: 8 MiB each); every
    median is taken on the buffer."""
    import numpy as np

    count = len(ps.step)
    dur = ps.dur
    present = {p: c for p, c in ps.phases.items() if c is not None}
    f: Any = None  # per-step scale factor where the phases add up to more than the step
    other: Any = dur
    if present:
        # the rest of each step, in the step's type when no value can leave it
        lowest = int(dur.min()) - sum(max(c.hi, 0) for c in present.values())
        highest = int(dur.max()) - sum(min(c.lo, 0) for c in present.values())
        wide = dur.dtype == np.int64 or lowest < -(2**31) or highest >= 2**31
        other = dur.astype(np.int64 if wide else dur.dtype)
        for c in present.values():
            other -= c.load()
        over = other < 0  # the phases add up to more than the step (which is never negative)
        if over.any():
            measured = dur.astype(np.int64) - other
            over &= measured > 0
            f = np.ones(count)
            f[over] = dur[over] / measured[over]
            other = np.maximum(dur - measured * f, 0)
            del measured
        else:
            np.maximum(other, 0, out=other)
        del over

    def values(p: str) -> Any:
        if p == "other":
            return other
        c = present.get(p)
        if c is None:
            return None
        return c.load() if f is None else c.load() * f

    buf = np.empty(count)  # every median's working copy, and each phase's share of its step
    safe_dur = dur if not count or int(dur.min()) >= 1 else np.maximum(dur, 1)

    def median(v: Any, share: bool = False) -> float:
        if share:
            np.divide(v, safe_dur, out=buf)
        else:
            buf[:] = v  # exact: a step's nanoseconds are far below 2**53
        return float(np.median(buf, overwrite_input=True))

    # the timeline: the steps in order, in ``timeline_points`` buckets of k steps, averaged
    k = max(1, -(-count // timeline_points))
    nb = -(-count // k)
    at = np.arange(0, count, k)
    bucket: Any = None
    cols: dict[str, Any] = {}
    if not count:
        pass
    elif isinstance(ps.step, range) or (ps.unique_steps and bool((ps.step[1:] > ps.step[:-1]).all())):
        # in step order already (the streamed scan): buckets are runs of k entries
        n_in = np.diff(np.append(at, count)).astype(np.float64)
        first_steps = ps.step.start + at if isinstance(ps.step, range) else ps.step[at]
        cols["step"] = first_steps.astype(np.float64)
    else:
        order = np.argsort(ps.step, kind="stable")
        bucket = np.empty(count, dtype=np.int64)
        bucket[order] = np.arange(count, dtype=np.int64) // k
        cols["step"] = np.minimum.reduceat(ps.step[order], at).astype(np.float64)
        del order
        n_in = np.bincount(bucket, minlength=nb).astype(np.float64)

    def bucket_means(v: Any) -> Any:
        if v is None:
            return np.zeros(nb)
        if bucket is not None:
            sums = np.bincount(bucket, weights=v, minlength=nb)
        else:
            sums = np.add.reduceat(v, at, dtype=np.int64 if v.dtype.kind == "i" else np.float64)
        return sums / n_in / 1e9

    total = float(dur.sum(dtype=np.int64)) if count else 0.0
    phases: dict[str, PhaseStat] = {}
    for p in (*_PHASE_COLS, "other"):
        v = values(p)
        if count:
            cols[p] = bucket_means(v)
        if v is None or not count:
            phases[p] = PhaseStat(fraction=0.0, total_s=0.0, median_s=0.0, median_share=0.0)
            continue
        tot = float(v.sum(dtype=np.int64 if v.dtype.kind == "i" else np.float64))
        phases[p] = PhaseStat(
            fraction=(tot / total) if total > 0 else 0.0,
            total_s=tot / NS,
            median_s=median(v) / NS,
            median_share=median(v, share=True),
            steps=int(np.count_nonzero(v)),
        )
        del v
    median_s = p90_s = 0.0
    timeline: list[dict[str, float]] = []
    if count:
        cols["step_s"] = bucket_means(dur)
        median_s = median(dur) / NS
        buf[:] = dur
        p90_s = float(np.quantile(buf, 0.9, overwrite_input=True)) / NS
        names = ["step", "step_s", *_PHASE_COLS, "other"]
        timeline = [{n: float(cols[n][i]) for n in names} for i in range(nb)]
    # make the fractions sum to exactly 1 despite float rounding: put the residue on `other`
    if total > 0:
        residue = 1.0 - sum(ps_.fraction for ps_ in phases.values())
        phases["other"].fraction = max(0.0, phases["other"].fraction + residue)
    first, last = ps.first_start_ns, ps.last_end_ns
    wall = (last - first) / NS if last > first else 0.0
    return StepStats(
        proc=proc,
        count=count,
        median_s=median_s,
        p90_s=p90_s,
        mean_s=(total / count) / NS if count else 0.0,
        per_s=(count / wall) if wall > 0 else 0.0,
        total_s=total / NS,
        first_start_ns=first,
        last_end_ns=last,
        phases=phases,
        epochs=ps.epochs,
        timeline=timeline,
        outside_ns=ps.outside_ns,
    )


def outside_steps(run: Run, proc: ProcKey | None, st: StepStats | None = None) -> dict[str, float]:
    """Seconds per phase recorded outside any step (e.g. the final eval and checkpoint).

    ``st``, the loop's StepStats from :func:`step_stats`, already holds them (no second scan)."""
    if proc is not None and st is not None and st.outside_ns is not None and st.proc == proc:
        return {k: v / NS for k, v in sorted(st.outside_ns.items())}
    if proc is None:
        rows = run.rows(
            "SELECT name, sum(end_ns - start_ns) FROM spans WHERE kind = 'phase' GROUP BY name ORDER BY name"
        )
    else:
        rows = run.con.execute(
            _OUTSIDE_SQL.format(extra="", pextra=""), {"host": proc.host, "pid": proc.pid, "tid": proc.tid}
        ).fetchall()
    return {str(n): float(d or 0) / NS for n, d in rows}


def loader_config(run: Run, proc: ProcKey) -> dict[str, Any]:
    """The configuration of the DataLoader whose fetches fed the training loop (the most data_wait)."""
    import json

    # most runs have no DataLoader record: say so without reading the phases' attributes
    has = run.con.execute(
        """SELECT count(*) FROM spans WHERE kind = 'op' AND name = 'dataloader' AND host = $host AND pid = $pid""",
        {"host": proc.host, "pid": proc.pid},
    ).fetchall()
    if not has or not has[0][0]:
        return {}
    rows = run.con.execute(
        """WITH dw AS (
             SELECT json_extract_string(attrs, '$.loader') AS loader, sum(end_ns - start_ns) AS t
             FROM spans WHERE kind = 'phase' AND name = 'data_wait' AND host = $host AND pid = $pid
             GROUP BY loader ORDER BY t DESC LIMIT 1)
           SELECT s.attrs FROM spans s JOIN dw ON json_extract_string(s.attrs, '$.loader') = dw.loader
           WHERE s.kind = 'op' AND s.name = 'dataloader' AND s.host = $host AND s.pid = $pid LIMIT 1""",
        {"host": proc.host, "pid": proc.pid},
    ).fetchall()
    if not rows or rows[0][0] is None:
        return {}
    try:
        cfg = json.loads(rows[0][0])
    except ValueError:
        return {}
    return cfg if isinstance(cfg, dict) else {}


def step_durations(run: Run) -> list[float]:
    """Durations (seconds) of the main training loop's steps, in step order."""
    procs = step_processes(run)
    if not procs:
        return []
    p = procs[0]
    rows = run.rows(
        """SELECT (end_ns - start_ns) / 1e9 FROM spans
           WHERE kind = 'step' AND host = ? AND pid = ? AND end_ns >= start_ns ORDER BY step, start_ns""",
        [p.host, p.pid],
    )
    return [float(r[0]) for r in rows]
