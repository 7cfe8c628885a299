"""Step statistics and the phase breakdown.

Pure functions of a loaded run, written once against the engine seam (:mod:`holoprof.analyze.engine`):
the process choice is one SQL aggregation, the per-step table comes from
:mod:`holoprof.analyze.per_step` (which says how a step is cut into phases), and the statistics
are taken here from its columns with NumPy, the same on DuckDB (the default) and on Dask.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field, replace
from typing import Any

from holoprof.analyze.engine import Aggregation, Engine, engine_for
from holoprof.analyze.per_step import PHASE_COLS, PerStep, Spilled, leftover, outside_agg, scan_steps
from holoprof.analyze.stats import WARMUP_STEPS, block_bounds, interval_of_block_means, median_interval_ranks
from holoprof.store.reader import Run

NS = 1e9


@dataclass(frozen=True)
class ProcKey:
    """A process that ran training steps: its loop thread ``tid`` (the one that ran most of its steps)
    and ``tids``, every thread that ran some (several when threads each train a model; empty: ``tid``
    alone)."""

    host: str
    pid: int
    rank: int
    tid: int
    tids: tuple[int, ...] = ()

    @property
    def threads(self) -> tuple[int, ...]:
        """The threads whose phases make the process's steps."""
        return self.tids or (self.tid,)


@dataclass
class PhaseStat:
    fraction: float  # of the total step time
    total_s: float
    median_s: float  # per step
    median_share: float = 0.0  # median over steps of (phase time / step time): robust to warm-up
    steps: int = 0  # steps in which the phase occurs (its total / steps: its time per occurrence)
    kept_total_s: float | None = None  # the total over the kept steps, when total_s is an exact count


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
    #: the run's noise: the relative half-width of the narrower 95% interval of its steady step (of the
    #: mean from block means, or of the median from order statistics); 0 with too few steps to know it
    noise: float = 0.0

    kept: int | None = None  # the steps whose spans were kept, when count is an exact count
    exact: bool = False  # count, totals, epochs and phase totals are the agent's exact counts

    @property
    def kept_count(self) -> int:
        """The steps the per-step figures (medians, percentiles, timeline) are taken over."""
        return self.count if self.kept is None else self.kept


#: Per process with steps: its rank, its loop thread (the thread that recorded most of its steps, the
#: lowest thread id on a tie), every thread that recorded steps (comma-separated) and its steps; the
#: main loop first (most steps, then the lowest rank).
STEP_THREADS = Aggregation(
    name="step-threads",
    table="spans",
    columns=("host", "pid", "rank", "tid", "kind"),
    chunk="""SELECT host, pid, tid, max(rank) AS rank, count(*) AS n FROM {t}
             WHERE kind = 'step' GROUP BY host, pid, tid""",
    combine="""SELECT host, pid, tid, max(rank) AS rank, CAST(sum(n) AS BIGINT) AS n FROM {t}
               GROUP BY host, pid, tid""",
    final="""SELECT host, pid, max(rank) AS rank, first(tid ORDER BY n DESC, tid) AS tid,
                    string_agg(CAST(tid AS VARCHAR), ',' ORDER BY tid) AS tids, CAST(sum(n) AS BIGINT) AS n
             FROM {t} GROUP BY host, pid""",
    order="n DESC, CASE WHEN coalesce(rank, -1) < 0 THEN 1 << 30 ELSE rank END, pid, host",
)


def step_processes(run: Run, engine: Engine | None = None) -> list[ProcKey]:
    """Processes that ran training steps, the main training loop first.

    The main loop is the process with the most steps (of all its threads); among ranks with equally
    many, the lowest rank. Each process's loop thread is the thread that recorded most of its steps
    (the lowest thread id on a tie); when several threads ran steps (each its own loop), the phases of
    all of them make the process's steps.
    """
    rows = engine_for(run, engine).aggregate(STEP_THREADS)
    out = []
    for h, p, r, t, ts, _ in rows:
        tids = tuple(int(x) for x in str(ts or "").split(",") if x)
        out.append(
            ProcKey(str(h), int(p), int(r if r is not None else -1), int(t), tids if len(tids) > 1 else ())
        )
    return out


def step_stats(
    run: Run, proc: ProcKey, timeline_points: int = 120, engine: Engine | None = None
) -> StepStats:
    """Step and phase statistics of ``proc``'s training loop (medians over its steps), on ``engine``
    (DuckDB by default)."""
    return _stats(run.lean(lambda: scan_steps(run, proc, engine=engine)), proc, timeline_points)


def _other(ps: PerStep) -> tuple[Any, Any, dict[str, Spilled]]:
    """``other`` per step and the scale factor of :func:`~holoprof.analyze.per_step.leftover` (None:
    no step is scaled), in the steps' type when no value can leave it; and the phases that occur."""
    import numpy as np  # lazy: numpy loads with the first analysis

    dur = ps.dur
    present = {p: c for p, c in ps.phases.items() if c is not None}
    if not present:
        return dur, None, present
    lowest = int(dur.min()) - sum(max(c.hi, 0) for c in present.values())
    highest = int(dur.max()) - sum(min(c.lo, 0) for c in present.values())
    wide = dur.dtype == np.int64 or lowest < -(2**31) or highest >= 2**31
    other, f = leftover(dur, (c.load() for c in present.values()), np.int64 if wide else dur.dtype)
    return other, f, present


class _Medians:
    """Medians of per-step columns, each taken on one float buffer (also each phase's share of its
    step)."""

    def __init__(self, dur: Any, count: int) -> None:
        import numpy as np  # lazy: numpy loads with the first analysis

        self.buf = np.empty(count)
        self.safe_dur = dur if not count or int(dur.min()) >= 1 else np.maximum(dur, 1)

    def median(self, v: Any, share: bool = False) -> float:
        import numpy as np  # lazy: numpy loads with the first analysis

        if share:
            np.divide(v, self.safe_dur, out=self.buf)
        else:
            self.buf[:] = v  # exact: a step's nanoseconds are far below 2**53
        return float(np.median(self.buf, overwrite_input=True))

    def p90(self, v: Any) -> float:
        import numpy as np  # lazy: numpy loads with the first analysis

        self.buf[:] = v
        return float(np.quantile(self.buf, 0.9, overwrite_input=True))


class _Timeline:
    """The steps in order, in ``points`` buckets of k steps: the mean of every column per bucket."""

    NAMES = ("step", "step_s", *PHASE_COLS, "other")

    def __init__(self, ps: PerStep, points: int) -> None:
        import numpy as np  # lazy: numpy loads with the first analysis

        count = self.count = len(ps.step)
        k = max(1, -(-count // points))
        self.nb = -(-count // k)
        self.at = np.arange(0, count, k)
        self.bucket: Any = None
        self.cols: dict[str, Any] = {}
        if not count:
            return
        if isinstance(ps.step, range) or (ps.unique_steps and bool((ps.step[1:] > ps.step[:-1]).all())):
            # in step order already (the streamed scan): buckets are runs of k entries
            self.n_in = np.diff(np.append(self.at, count)).astype(np.float64)
            first_steps = ps.step.start + self.at if isinstance(ps.step, range) else ps.step[self.at]
            self.cols["step"] = first_steps.astype(np.float64)
        else:
            order = np.argsort(ps.step, kind="stable")
            self.bucket = np.empty(count, dtype=np.int64)
            self.bucket[order] = np.arange(count, dtype=np.int64) // k
            self.cols["step"] = np.minimum.reduceat(ps.step[order], self.at).astype(np.float64)
            del order
            self.n_in = np.bincount(self.bucket, minlength=self.nb).astype(np.float64)

    def add(self, name: str, v: Any) -> None:
        """The bucket means of ``v`` (seconds; None: zeros)."""
        import numpy as np  # lazy: numpy loads with the first analysis

        if not self.count:
            return
        if v is None:
            self.cols[name] = np.zeros(self.nb)
            return
        if self.bucket is not None:
            sums = np.bincount(self.bucket, weights=v, minlength=self.nb)
        else:
            sums = np.add.reduceat(v, self.at, dtype=np.int64 if v.dtype.kind == "i" else np.float64)
        self.cols[name] = sums / self.n_in / 1e9

    def rows(self) -> list[dict[str, float]]:
        if not self.count:
            return []
        return [{n: float(self.cols[n][i]) for n in self.NAMES} for i in range(self.nb)]


def _phase_stat(v: Any, total: float, med: _Medians) -> PhaseStat:
    import numpy as np  # lazy: numpy loads with the first analysis

    tot = float(v.sum(dtype=np.int64 if v.dtype.kind == "i" else np.float64))
    return PhaseStat(
        fraction=(tot / total) if total > 0 else 0.0,
        total_s=tot / NS,
        median_s=med.median(v) / NS,
        median_share=med.median(v, share=True),
        steps=int(np.count_nonzero(v)),
    )


def _stats(ps: PerStep, proc: ProcKey, timeline_points: int) -> StepStats:
    """Statistics of the per-step columns. Written for memory: besides the step durations, ``other``
    and one float buffer, one phase column is in memory at a time (2 M steps: 8 MiB each); every
    median is taken on the buffer."""
    import numpy as np  # lazy: numpy loads with the first analysis

    count = len(ps.step)
    dur = ps.dur
    other, f, present = _other(ps)
    med = _Medians(dur, count)
    timeline = _Timeline(ps, timeline_points)
    total = float(dur.sum(dtype=np.int64)) if count else 0.0
    phases: dict[str, PhaseStat] = {}
    for p in (*PHASE_COLS, "other"):
        c = present.get(p)
        v = other if p == "other" else None if c is None else c.load() if f is None else c.load() * f
        timeline.add(p, v)
        if v is None or not count:
            phases[p] = PhaseStat(fraction=0.0, total_s=0.0, median_s=0.0, median_share=0.0)
        else:
            phases[p] = _phase_stat(v, total, med)
        del v
    timeline.add("step_s", dur)
    # make the fractions sum to exactly 1 despite float rounding: put the residue on `other`
    if total > 0:
        residue = 1.0 - sum(ps_.fraction for ps_ in phases.values())
        phases["other"].fraction = max(0.0, phases["other"].fraction + residue)
    first, last = ps.first_start_ns, ps.last_end_ns
    wall = (last - first) / NS if last > first else 0.0
    return StepStats(
        proc=proc,
        count=count,
        median_s=med.median(dur) / NS if count else 0.0,
        p90_s=med.p90(dur) / NS if count else 0.0,
        mean_s=(total / count) / NS if count else 0.0,
        per_s=(count / wall) if wall > 0 else 0.0,
        total_s=total / NS,
        first_start_ns=first,
        last_end_ns=last,
        phases=phases,
        epochs=ps.epochs,
        timeline=timeline.rows(),
        outside_ns=ps.outside_ns,
        noise=_noise(dur),
    )


def _noise(dur: Any) -> float:
    """How precisely the run knows its step (``dur``: ns per step): the relative half-width of the
    narrower of two 95% intervals of the steady steps (all but the first two), the mean's (block means,
    Student's t: right for loops whose steps alternate, as batches from workers make them) and the
    median's (order statistics: right for loops with a few long steps, an epoch's start or an
    evaluation). 0 (unknown) when there are too few steps for either."""
    import numpy as np  # lazy: numpy loads with the first analysis

    n = len(dur)
    s = np.asarray(dur[WARMUP_STEPS:] if n >= 3 * WARMUP_STEPS + 2 else dur, dtype=np.float64)
    widths = []
    bounds = block_bounds(len(s))
    if len(bounds) > 2:  # two blocks or more
        means = [float(np.mean(s[a:b])) for a, b in itertools.pairwise(bounds) if b > a]
        lo, hi = interval_of_block_means(means)
        mean = float(np.mean(s))
        if mean > 0:
            widths.append((hi - lo) / 2 / mean)
    ranks = median_interval_ranks(len(s))
    if ranks is not None:
        m = len(s)
        mids = sorted({(m - 1) // 2, m // 2})
        part = np.partition(s, sorted({*ranks, *mids}))
        med = float(np.mean(part[mids]))
        if med > 0:
            widths.append(float(part[ranks[1]] - part[ranks[0]]) / 2 / med)
    return min(widths, default=0.0)


@dataclass(frozen=True)
class Counted:
    """A process's exact counts from its agent (the ``counters`` of its ``processes`` row), over the
    threads that ran steps: steps, their total time, the first start and last end (wall-clock ns),
    epochs, and the time (ns) of each phase inside steps and outside them."""

    steps: int
    step_ns: int
    first_ns: int
    last_ns: int
    epochs: int
    phases: dict[str, int]
    outside: dict[str, int]


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"not an integer: {v!r}")
    return v


def parse_counts(text: str) -> Counted | None:
    """The counters JSON of a processes row (see :mod:`holoprof.agent.steps`), summed over its loop
    threads; None when it holds no step (or is not what the agent writes)."""
    try:
        doc = json.loads(text)
        steps = step_ns = epochs = 0
        firsts, lasts = [], []
        phases: dict[str, int] = {}
        outside: dict[str, int] = {}
        for c in dict(doc["threads"]).values():
            epochs += _int(c.get("epochs", 0))
            if _int(c["steps"]) <= 0:
                continue
            steps += _int(c["steps"])
            step_ns += _int(c["step_ns"])
            firsts.append(_int(c["first_ns"]))
            lasts.append(_int(c["last_ns"]))
            for into, key in ((phases, "phases"), (outside, "outside")):
                for name, (_, ns) in dict(c.get(key) or {}).items():
                    into[str(name)] = into.get(str(name), 0) + _int(ns)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    if not steps:
        return None
    return Counted(steps, step_ns, min(firsts), max(lasts), epochs, phases, outside)


def counted(run: Run, proc: ProcKey) -> Counted | None:
    """``proc``'s exact counts when its spans are incomplete (it dropped events and its agent wrote its
    counts), else None: with every span kept, the spans give the same counts and more."""
    rows = run.rows(
        "SELECT dropped_events, counters FROM processes WHERE host = ? AND pid = ?", [proc.host, proc.pid]
    )
    if not rows or not rows[0][0] or not isinstance(rows[0][1], str):
        return None
    return parse_counts(rows[0][1])


def counted_all(run: Run) -> dict[tuple[str, int], Counted]:
    """:func:`counted` of every process that has exact counts, by (host, pid), in one query (a run of
    many ranks reads its processes once, not once per rank)."""
    rows = run.rows(
        "SELECT host, pid, counters FROM processes WHERE dropped_events > 0 AND counters IS NOT NULL"
    )
    out = {}
    for host, pid, text in rows:
        c = parse_counts(str(text)) if isinstance(text, str) else None
        if c is not None:
            out[(str(host), int(pid))] = c
    return out


def counted_loop(run: Run) -> ProcKey | None:
    """The process whose agent counted the most steps among those that dropped events, as a loop to
    report when no step span at all was kept (every one was dropped), else None."""
    rows = run.rows(
        """SELECT host, pid, rank, counters FROM processes
           WHERE dropped_events > 0 AND counters IS NOT NULL ORDER BY start_ns, pid"""
    )
    best: tuple[int, ProcKey] | None = None
    for host, pid, rank, text in rows:
        c = parse_counts(str(text))
        if c is None:
            continue
        threads = json.loads(text)["threads"]
        tids = tuple(sorted(int(t) for t, v in threads.items() if v.get("steps")))
        key = ProcKey(
            str(host), int(pid), int(rank if rank is not None else -1), tids[0], tids if len(tids) > 1 else ()
        )
        if best is None or c.steps > best[0]:
            best = (c.steps, key)
    return best[1] if best is not None else None


def with_counts(st: StepStats, c: Counted | None) -> StepStats:
    """``st`` (of the kept spans) with the exact counts ``c``: the step count, total and mean step time,
    steps/s, epochs, phase totals and fractions and the time outside steps are exact; medians,
    percentiles and the timeline stay those of the kept steps (``kept``). The phases' exact totals
    follow the per-step rule: ``other`` is the rest of the steps' time, and phases that add up to more
    (overlapping records) are scaled to fill it (:func:`~holoprof.analyze.per_step.leftover`). Counts
    older than the spans (a process killed after its last counts were written) leave ``st`` as it is."""
    if c is None or c.steps < st.count or c.step_ns <= 0:
        return st
    total = c.step_ns
    measured = sum(c.phases.get(p, 0) for p in PHASE_COLS)
    f = total / measured if measured > total else 1.0
    phases: dict[str, PhaseStat] = {}
    for p in PHASE_COLS:
        ns = c.phases.get(p, 0) * f
        phases[p] = replace(
            st.phases[p], fraction=ns / total, total_s=ns / NS, kept_total_s=st.phases[p].total_s
        )
    rest = 1.0 - sum(v.fraction for v in phases.values())
    other = st.phases["other"]
    phases["other"] = replace(
        other,
        fraction=max(0.0, rest),
        total_s=max(0.0, total - measured * f) / NS,
        kept_total_s=other.total_s,
    )
    wall = (c.last_ns - c.first_ns) / NS
    return replace(
        st,
        count=c.steps,
        total_s=total / NS,
        mean_s=total / c.steps / NS,
        per_s=c.steps / wall if wall > 0 else 0.0,
        first_start_ns=c.first_ns,
        last_end_ns=c.last_ns,
        phases=phases,
        epochs=c.epochs or st.epochs,
        outside_ns={k: float(v) for k, v in c.outside.items() if v},
        kept=st.count,
        exact=True,
    )


#: Per phase name, the time of every phase span (when there is no training loop).
_ALL_PHASES = Aggregation(
    name="phases",
    table="spans",
    columns=("kind", "name", "start_ns", "end_ns"),
    chunk="SELECT name, CAST(sum(end_ns - start_ns) AS BIGINT) AS ns FROM {t} WHERE kind = 'phase' GROUP BY name",
    combine="SELECT name, CAST(sum(ns) AS BIGINT) AS ns FROM {t} GROUP BY name",
    order="name",
)


def outside_steps(
    run: Run, proc: ProcKey | None, st: StepStats | None = None, engine: Engine | None = None
) -> dict[str, float]:
    """Seconds per phase recorded outside any step (e.g. the final eval and checkpoint).

    ``st``, the loop's StepStats from :func:`step_stats`, already holds them (no second scan)."""
    if proc is not None and st is not None and st.outside_ns is not None and st.proc == proc:
        return {k: v / NS for k, v in sorted(st.outside_ns.items())}
    agg = _ALL_PHASES if proc is None else outside_agg(proc)
    return {str(n): float(d or 0) / NS for n, d in engine_for(run, engine).aggregate(agg)}


def loader_config(run: Run, proc: ProcKey) -> dict[str, Any]:
    """The configuration of the DataLoader whose fetches fed the training loop (the most data_wait)."""
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
