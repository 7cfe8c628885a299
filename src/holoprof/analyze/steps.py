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
from holoprof.store.reader import Run

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
_BATCH_ROWS = 1 << 16


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


class _Column:
    """A column of per-step integers gathered batch by batch, kept as int32 where the values fit and
    not at all while it is only zeros (most phase names never occur in a run)."""

    def __init__(self) -> None:
        self.parts: list[Any] = []  # arrays, or ints: a run of that many zeros
        self.nonzero = False

    def add(self, values: Any) -> None:
        import numpy as np

        if len(values) == 0:
            return
        lo, hi = int(values.min()), int(values.max())
        if lo == 0 and hi == 0:
            self.parts.append(len(values))
            return
        self.nonzero = True
        fits = lo >= -(2**31) and hi < 2**31
        self.parts.append(values.astype(np.int32) if fits else np.asarray(values, dtype=np.int64))

    def array(self, zeros_as_none: bool = True) -> Any:
        """The whole column (int32 or int64); None when it is all zeros (if ``zeros_as_none``)."""
        import numpy as np

        if not self.nonzero and zeros_as_none:
            return None
        wide = any(not isinstance(p, int) and p.dtype == np.int64 for p in self.parts)
        dtype = np.int64 if wide else np.int32
        n = sum(p if isinstance(p, int) else len(p) for p in self.parts)
        out = np.zeros(n, dtype=dtype)
        i = 0
        for p in self.parts:
            if isinstance(p, int):
                i += p
            else:
                out[i : i + len(p)] = p
                i += len(p)
        self.parts = []
        return out


@dataclass
class _PerStep:
    """The main loop's per-step table as arrays (one entry per step, in no particular order)."""

    step: Any
    dur: Any
    phases: dict[str, Any]  # clipped ns per step, None for a phase that never occurs
    first_start_ns: int
    last_end_ns: int
    epochs: int
    outside_ns: dict[str, float]  # phase time recorded outside any step, by name
    unique_steps: bool  # no step index appears twice


class _Gather:
    """The per-step columns being gathered, batch by batch, and the window of the steps seen."""

    def __init__(self) -> None:
        self.step, self.dur = _Column(), _Column()
        self.cols = {p: _Column() for p in _PHASE_COLS}
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

    def add_joined(self, b: Any, step: Any) -> None:
        """A batch of the exact join (columns step, s, e, dur and one per phase)."""
        self.add(
            step,
            b.column("s").to_numpy(),
            b.column("e").to_numpy(),
            {p: b.column(p).to_numpy() for p in _PHASE_COLS},
        )

    def result(self, epochs: int, outside_ns: dict[str, float], unique: bool) -> _PerStep:
        return _PerStep(
            step=self.step.array(zeros_as_none=False),
            dur=self.dur.array(zeros_as_none=False),
            phases={p: c.array() for p, c in self.cols.items()},
            first_start_ns=int(self.first or 0),
            last_end_ns=int(self.last or 0),
            epochs=epochs,
            outside_ns=outside_ns,
            unique_steps=unique,
        )


def _arrow_reader(cur: Any, sql: str, params: dict[str, Any]) -> Any:
    return cur.sql(sql, params=params).to_arrow_reader(_BATCH_ROWS)


def _scan_steps(run: Run, proc: ProcKey) -> _PerStep:
    """One aggregation of the spans by step index gives each step's window and the summed duration
    of each of its phases. When every phase of a step lies inside the step's window (the usual
    case) that sum is exactly the clipped sum; the other steps (phases crossing the window, a step
    index used twice) are computed by the exact join, restricted to them. Results stream in batches
    into compact arrays: DuckDB's aggregate stays within its memory limit, Python holds the arrays."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    params = {"host": proc.host, "pid": proc.pid, "tid": proc.tid}
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
    cur = run.con.cursor()
    g = _Gather()
    epochs = 0
    outside = dict.fromkeys(_PHASE_COLS, 0)
    fallback: list[Any] = []  # step indices to compute with the exact join
    orphan: list[Any] = []  # step indices (with phases of unknown names) that no step span has
    orphan_null = False
    null_steps = False
    for b in _arrow_reader(cur, sql, params):
        d = {name: b.column(i) for i, name in enumerate(b.schema.names)}
        epochs += int(pc.sum(d["n_epoch"]).as_py() or 0)
        step = d["step"].to_numpy(zero_copy_only=False)  # float with NaN where null
        n_step = d["n_step"].to_numpy()
        if d["step"].null_count:
            nulls = np.asarray(d["step"].is_null())
            if (n_step[nulls] > 0).any():
                null_steps = True  # steps without an index: only the plain join handles them
            if (d["n_unknown"].to_numpy()[nulls] > 0).any():
                orphan_null = True
            for p in _PHASE_COLS:
                outside[p] += int(pc.sum(d[p].filter(pa.array(nulls))).as_py() or 0)
            keep = pa.array(~nulls)
            d = {k: v.filter(keep) for k, v in d.items()}
            step = d["step"].to_numpy()
            n_step = d["n_step"].to_numpy()
        s = d["s"].fill_null(0).to_numpy()
        e = d["e"].fill_null(-1).to_numpy()
        p_lo = d["p_lo"].fill_null(np.iinfo(np.int64).max).to_numpy()
        p_hi = d["p_hi"].fill_null(np.iinfo(np.int64).min).to_numpy()
        p_min = d["p_min"].fill_null(0).to_numpy()
        none = n_step == 0
        exact = (n_step == 1) & (s <= e) & (p_min >= 0) & (p_lo >= s) & (p_hi <= e)
        if none.any():  # phases whose step index no step span has: all outside
            for p in _PHASE_COLS:
                outside[p] += int(np.nansum(d[p].fill_null(0).to_numpy()[none]))
            unknown = none & (d["n_unknown"].to_numpy() > 0)
            orphan.extend(step[unknown].tolist())
        redo = ~none & ~exact
        if redo.any():
            fallback.extend(step[redo].tolist())
        g.add(step[exact], s[exact], e[exact], {p: d[p].fill_null(0).to_numpy()[exact] for p in _PHASE_COLS})
    if null_steps or len(fallback) > _FALLBACK_MAX:
        return _join_steps(run, proc, epochs)
    unique = True
    if fallback:
        # the exact join for those steps only: a step index repeated gives one row per step span
        cur.register("hp_redo_steps", pa.table({"step": pa.array(fallback, pa.int64())}))
        cond = "step IN (SELECT step FROM hp_redo_steps)"
        sel = ", ".join(f"{p}::BIGINT AS {p}" for p in _PHASE_COLS)
        for b in _arrow_reader(cur, _per_step_sql(cond) + f"SELECT step, s, e, dur, {sel} FROM raw", params):
            g.add_joined(b, b.column("step").to_numpy())
        unique = False
        rows = cur.execute(
            _OUTSIDE_SQL.format(extra=f" AND {cond}", pextra=f" AND p.{cond}"), params
        ).fetchall()
        for name, ns in rows:
            outside[str(name)] = outside.get(str(name), 0) + int(ns or 0)
    if orphan or orphan_null:
        # phases of names outside the known ones, whose step no step span has: by name
        cur.register("hp_orphan_steps", pa.table({"step": pa.array(orphan, pa.int64())}))
        rows = cur.execute(
            f"""SELECT name, sum(end_ns - start_ns) FROM spans
                WHERE kind = 'phase' AND host = $host AND pid = $pid AND tid = $tid
                  AND name NOT IN ({known})
                  AND (step IN (SELECT step FROM hp_orphan_steps){" OR step IS NULL" if orphan_null else ""})
                GROUP BY name""",
            params,
        ).fetchall()
        for name, ns in rows:
            outside[str(name)] = outside.get(str(name), 0) + int(ns or 0)
    cur.close()
    return g.result(epochs, {k: float(v) for k, v in outside.items() if v}, unique)


def _join_steps(run: Run, proc: ProcKey, epochs: int) -> _PerStep:
    """The per-step table by the plain join over all steps (when the shortcut does not apply)."""
    import numpy as np

    params = {"host": proc.host, "pid": proc.pid, "tid": proc.tid}
    cur = run.con.cursor()
    g = _Gather()
    sel = ", ".join(f"{p}::BIGINT AS {p}" for p in _PHASE_COLS)
    for b in _arrow_reader(cur, _per_step_sql() + f"SELECT step, s, e, dur, {sel} FROM raw", params):
        # a step span without an index sorts last, as ORDER BY step puts it
        g.add_joined(b, b.column("step").fill_null(np.iinfo(np.int64).max).to_numpy())
    rows = cur.execute(_OUTSIDE_SQL.format(extra="", pextra=""), params).fetchall()
    cur.close()
    return g.result(epochs, {str(n): float(v or 0) for n, v in rows if v}, False)


def step_stats(run: Run, proc: ProcKey, timeline_points: int = 120) -> StepStats:
    """Step and phase statistics of ``proc``'s training loop (medians over its steps)."""
    import duckdb

    try:
        with run.lean_memory() as lowered:
            ps = _scan_steps(run, proc)
    except duckdb.OutOfMemoryException:
        if not lowered:
            raise
        ps = _scan_steps(run, proc)  # again at the run's default limit
    return _stats(ps, proc, timeline_points)


def _stats(ps: _PerStep, proc: ProcKey, timeline_points: int) -> StepStats:
    import numpy as np

    count = len(ps.step)
    dur = ps.dur
    present = {p: v for p, v in ps.phases.items() if v is not None}
    measured: Any = None
    for v in present.values():
        measured = v.astype(np.int64) if measured is None else measured + v
    f: Any = None  # per-step scale factor where the phases add up to more than the step
    if measured is not None:
        over = (measured > dur) & (measured > 0)
        if over.any():
            f = np.ones(count)
            f[over] = dur[over] / measured[over]

    def values(p: str) -> Any:
        if p == "other":
            if measured is None:
                return dur
            return np.maximum(dur - measured, 0) if f is None else np.maximum(dur - measured * f, 0)
        v = present.get(p)
        return v if v is None or f is None else v * f

    total = float(dur.sum(dtype=np.int64)) if count else 0.0
    safe_dur = np.maximum(dur, 1) if count else dur
    phases: dict[str, PhaseStat] = {}
    for p in (*_PHASE_COLS, "other"):
        v = values(p)
        if v is None or not count:
            phases[p] = PhaseStat(fraction=0.0, total_s=0.0, median_s=0.0, median_share=0.0)
            continue
        tot = float(v.sum(dtype=np.int64 if v.dtype.kind == "i" else np.float64))
        phases[p] = PhaseStat(
            fraction=(tot / total) if total > 0 else 0.0,
            total_s=tot / NS,
            median_s=float(np.median(v)) / NS,
            median_share=float(np.median(v / safe_dur)),
        )
    # make the fractions sum to exactly 1 despite float rounding: put the residue on `other`
    if total > 0:
        residue = 1.0 - sum(ps_.fraction for ps_ in phases.values())
        phases["other"].fraction = max(0.0, phases["other"].fraction + residue)
    first, last = ps.first_start_ns, ps.last_end_ns
    wall = (last - first) / NS if last > first else 0.0
    timeline: list[dict[str, float]] = []
    if count:
        k = max(1, -(-count // timeline_points))
        nb = -(-count // k)
        lo = int(ps.step.min())
        if ps.unique_steps and int(ps.step.max()) - lo + 1 == count:
            bucket = (ps.step - lo) // k  # indices 0..n-1 with none missing: the rank is the index
            starts = lo + np.arange(nb, dtype=np.int64) * k
        else:
            order = np.argsort(ps.step, kind="stable")
            bucket = np.empty(count, dtype=np.int64)
            bucket[order] = np.arange(count, dtype=np.int64) // k
            starts = np.minimum.reduceat(ps.step[order], np.arange(0, count, k))
            del order
        n_in = np.bincount(bucket, minlength=nb).astype(np.float64)
        cols: dict[str, Any] = {"step": starts.astype(np.float64)}
        cols["step_s"] = np.bincount(bucket, weights=dur, minlength=nb) / n_in / 1e9
        for p in (*_PHASE_COLS, "other"):
            v = values(p)
            cols[p] = np.zeros(nb) if v is None else np.bincount(bucket, weights=v, minlength=nb) / n_in / 1e9
        names = ["step", "step_s", *_PHASE_COLS, "other"]
        timeline = [{n: float(cols[n][i]) for n in names} for i in range(nb)]
    return StepStats(
        proc=proc,
        count=count,
        median_s=float(np.median(dur)) / NS if count else 0.0,
        p90_s=float(np.quantile(dur, 0.9)) / NS if count else 0.0,
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
