"""Stragglers: the rank × step table of a multi-rank job and the ``straggler`` finding.

A synchronous job (DDP, FSDP: any job whose ranks meet at collectives every step) goes at the pace of
its slowest rank: the others reach the collective first and wait there, and that wait is exposed
communication of theirs. Per rank and step (one scan of the spans for every rank,
:func:`rank_steps_agg`):

* ``step``: the step's time, split as the step breakdown splits it (:mod:`holoprof.analyze.per_step`)
  into ``compute`` (forward, backward, optimizer, a fused ``compute`` phase, compilation),
  ``data_wait``, ``communication`` (exposed: what the loop waited for at its collectives, the wait for
  slower ranks included) and ``other`` (the rest: checkpoints, evaluation, host code);
* ``busy``: ``step - communication``, the rank's own work. In each step the rank with the largest
  busy time is the slowest: the last to arrive at the collectives.

Over the steady steps that every rank ran (the first :data:`~holoprof.analyze.stats.WARMUP_STEPS`
left out when enough remain), in means per step, so that the parts add up:

* the **median rank** is the rank in the middle (the lower middle for an even count) when the ranks
  are ordered by their busy time; a rank's ``excess`` is its busy time minus the median rank's, split
  by part (``excess_by_phase``: compute, data_wait, other);
* the **straggler** is the rank of the largest excess; ranks whose excess is at least half of its are
  slow with it (one slow host's ranks). ``slowest_fraction``: the share of the steps in which the
  slowest rank is one of them. The **gain**: in each step the job would drop from the slowest busy
  time to the slowest of the other ranks' (what it would be if the slow ranks ran at the median
  rank's pace, which those other ranks already keep up with), over the job's step time (the mean over
  those steps of the longest rank's step). That is the time the fast ranks wait for the slow ones, so
  it is not communication the network could speed up: ``communication_bound`` takes it out
  (:func:`wait_for_slower`).

The finding needs :data:`MIN_STEPS` steps, a ``slowest_fraction`` of :data:`CONSISTENCY` that ranks
all alike would reach by chance with a probability of at most :data:`MAX_CHANCE` (a few steps of two
ranks never do: one of them is the slowest in every step), and a gain of :data:`MIN_GAIN_SHARE`; the
report's gain gate (:func:`~holoprof.analyze.findings.measurable`)
applies on top. The heatmap (``heatmap``: ranks × steps, the step time and each part) bins the steps
into at most :data:`MAX_COLUMNS` columns (fewer for many ranks: at most :data:`MAX_CELLS` cells),
each the mean of its consecutive steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from holoprof import model
from holoprof.analyze.engine import (
    Aggregation,
    Engine,
    engine_for,
    rows_in,
    sql_value,
    step_windows,
    values_table,
)
from holoprof.analyze.findings import Finding, severity_of_gain
from holoprof.analyze.stats import WARMUP_STEPS
from holoprof.analyze.steps import NS, ProcKey
from holoprof.store.reader import Run

#: Phases that are the rank's computation (``compute``: a fused train step that cannot be split).
COMPUTE_PHASES = ("forward", "backward", "optimizer", "compute", "compile")
#: The parts of a step in the table, in this order (``other`` is the rest of the step).
PARTS = ("compute", "data_wait", "communication", "other")
#: The parts a straggler's excess is split into (its communication is not its own work).
EXCESS_PARTS = ("compute", "data_wait", "other")
MIN_STEPS = 3
#: The slow ranks are the slowest in at least this share of the steps ...
CONSISTENCY = 0.75
#: ... so often that ranks all alike would be that often by chance with at most this probability
#: (the binomial tail, times the number of ranks: any of them could have been the one) ...
MAX_CHANCE = 0.01
#: ... and running them at the median rank's pace would save at least this share of the step.
MIN_GAIN_SHARE = 0.05
#: A rank is slow with the straggler when its excess is at least this share of the straggler's.
GROUP_SHARE = 0.5
MAX_COLUMNS = 200
MAX_CELLS = 12_000
MIN_COLUMNS = 20


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(sql_value(n) for n in names)


_KEYS = "host, pid, step"


def rank_steps_agg(keys: list[ProcKey]) -> Aggregation:
    """Per step of each process of ``keys`` (``proc``: its index there): its window (of several step
    spans with one index, the last to start), its duration and the clipped time (ns) of its loop
    threads' phases: compute, data_wait, communication and all measured phases (``measured``; the
    rest of the step is ``other``). The spans of a step meet in one partition on Dask."""
    procs = (
        rows_in(("host", "pid"), [(k.host, k.pid) for k in keys])
        + " AND (kind = 'step' OR "
        + rows_in(("host", "pid", "tid"), [(k.host, k.pid, t) for k in keys for t in k.threads])
        + ")"
    )
    index = values_table("k", ("host", "pid", "proc"), [(k.host, k.pid, i) for i, k in enumerate(keys)])
    measured = _names(model.MEASURED_PHASES)
    return Aggregation(
        name="rank-steps",
        table="spans",
        columns=("host", "pid", "tid", "kind", "name", "start_ns", "end_ns", "step"),
        chunk=f"""SELECT host, pid, step, kind, name, start_ns, end_ns FROM {{t}}
            WHERE step >= 0 AND ((kind = 'step' AND end_ns >= start_ns)
                                 OR (kind = 'phase' AND name IN ({measured})))
              AND ({procs})""",
        shuffle=("host", "pid", "step"),
        group=f"""WITH w AS ({step_windows(_KEYS)}),
            x AS (
              SELECT {{t}}.host, {{t}}.pid, {{t}}.step, {{t}}.name,
                     least({{t}}.end_ns, w.e) - greatest({{t}}.start_ns, w.s) AS d
              FROM {{t}} JOIN w USING ({_KEYS})
              WHERE {{t}}.kind = 'phase' AND {{t}}.end_ns > w.s AND {{t}}.start_ns < w.e)
            SELECT CAST(k.proc AS BIGINT) AS proc, step, CAST(w.e - w.s AS BIGINT) AS dur,
              CAST(coalesce(sum(d) FILTER (WHERE name IN ({_names(COMPUTE_PHASES)})), 0) AS BIGINT) AS compute,
              CAST(coalesce(sum(d) FILTER (WHERE name = 'data_wait'), 0) AS BIGINT) AS data_wait,
              CAST(coalesce(sum(d) FILTER (WHERE name = 'communication'), 0) AS BIGINT) AS communication,
              CAST(coalesce(sum(d), 0) AS BIGINT) AS measured
            FROM w JOIN {index} USING (host, pid) LEFT JOIN x USING ({_KEYS})
            GROUP BY host, pid, step, w.s, w.e, k.proc""",
        order="proc, step",
        pids=tuple(sorted({int(k.pid) for k in keys})),
    )


@dataclass
class RankSteps:
    """The rank × step table: the ranks (in rank order) and, per rank and step index (the union of
    the ranks' steps, in order), the step time and its parts in seconds (NaN: the rank has no such
    step)."""

    keys: list[ProcKey]
    steps: Any  # int64 step indices
    parts: dict[str, Any]  # "step" and each of PARTS -> float64 array (ranks, steps)
    counts: list[int]  # steps of each rank

    def common(self) -> Any:
        """The columns of the steps that every rank ran, the steady ones when enough remain."""
        import numpy as np  # lazy: numpy loads with the first analysis

        cols = np.flatnonzero(~np.isnan(self.parts["step"]).any(axis=0))
        return cols[WARMUP_STEPS:] if len(cols) >= 3 * WARMUP_STEPS + 2 else cols


def load_rank_steps(run: Run, keys: list[ProcKey], engine: Engine | None = None) -> RankSteps | None:
    """The rank × step table of the step processes ``keys`` that are ranks (None for fewer than two)."""
    import numpy as np  # lazy: numpy loads with the first analysis

    ranked = sorted((k for k in keys if k.rank >= 0), key=lambda k: (k.rank, k.host, k.pid))
    if len(ranked) < 2:
        return None
    cols: dict[str, list[Any]] = {c: [] for c in ("proc", "step", "dur", *PARTS[:3], "measured")}
    for b in engine_for(run, engine).aggregate_batches(rank_steps_agg(ranked)):
        for c in cols:
            cols[c].append(np.array(b.column(c), dtype=np.int64))  # a copy: the batch's buffers go
    arr = {c: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for c, v in cols.items()}
    steps = np.unique(arr["step"])
    if not len(steps):
        return None
    at = np.searchsorted(steps, arr["step"])
    dur = arr["dur"].astype(np.float64)
    measured = arr["measured"].astype(np.float64)
    # the per-step rule (per_step.leftover): phases that add up to more than the step are scaled to it
    scale = np.where(measured > dur, dur / np.maximum(measured, 1.0), 1.0)
    values = {
        "step": dur,
        **{p: arr[p] * scale for p in PARTS[:3]},
        "other": np.maximum(dur - measured * scale, 0.0),
    }
    parts = {}
    for name, v in values.items():
        m = np.full((len(ranked), len(steps)), np.nan)
        m[arr["proc"], at] = v / NS
        parts[name] = m
    counts = np.bincount(arr["proc"], minlength=len(ranked)).tolist()
    return RankSteps(keys=ranked, steps=steps, parts=parts, counts=[int(c) for c in counts])


@dataclass
class Straggler:
    """The slow rank (``index`` in the table) and what it costs; see the module's docstring."""

    index: int
    slow: list[int]  # the slow ranks' indices, the straggler first
    median: int  # the median rank's index
    steps: int  # the steady steps every rank ran
    slowest_fraction: float
    job_step_s: float  # mean per step of the longest rank's step
    gain_s: float  # per step
    excess_s: float  # busy time above the median rank's, per step
    excess_by_phase: dict[str, float]
    others_wait_s: float  # the other ranks' exposed communication above the straggler's, per step

    @property
    def gain(self) -> float:
        return self.gain_s / self.job_step_s if self.job_step_s > 0 else 0.0


def _means(rs: RankSteps, cols: Any) -> dict[str, Any]:
    return {p: rs.parts[p][:, cols].mean(axis=1) for p in ("step", *PARTS)}


def median_rank(busy_means: Any) -> int:
    """The index of the rank in the middle of the order of busy times (the lower middle)."""
    import numpy as np  # lazy: numpy loads with the first analysis

    order = np.argsort(busy_means, kind="stable")
    return int(order[(len(order) - 1) // 2])


def find_straggler(rs: RankSteps | None) -> Straggler | None:
    """The slow rank of a synchronous job, if one holds the others back (see the module's docstring)."""
    import numpy as np  # lazy: numpy loads with the first analysis

    if rs is None:
        return None
    cols = rs.common()
    if len(cols) < MIN_STEPS:
        return None
    means = _means(rs, cols)
    busy = rs.parts["step"][:, cols] - rs.parts["communication"][:, cols]
    busy_mean = busy.mean(axis=1)
    med = median_rank(busy_mean)
    excess = busy_mean - busy_mean[med]
    top = int(np.argmax(excess))
    if excess[top] <= 0:
        return None
    slow = [top] + [
        i
        for i in np.argsort(-excess, kind="stable").tolist()
        if i != top and excess[i] >= GROUP_SHARE * excess[top]
    ]
    rest = [i for i in range(len(rs.keys)) if i not in slow]
    slowest_fraction = float(np.isin(busy.argmax(axis=0), slow).mean())
    gain_s = float(np.maximum(busy.max(axis=0) - busy[rest].max(axis=0), 0.0).mean())
    job_step_s = float(rs.parts["step"][:, cols].max(axis=0).mean())
    comm = means["communication"]
    s = Straggler(
        index=top,
        slow=slow,
        median=med,
        steps=len(cols),
        slowest_fraction=slowest_fraction,
        job_step_s=job_step_s,
        gain_s=gain_s,
        excess_s=float(excess[top]),
        excess_by_phase={p: float(means[p][top] - means[p][med]) for p in EXCESS_PARTS},
        others_wait_s=float(np.mean([comm[i] - comm[top] for i in rest])) if rest else 0.0,
    )
    if s.slowest_fraction < CONSISTENCY or s.gain < MIN_GAIN_SHARE:
        return None
    hits = round(slowest_fraction * len(cols))
    if chance(len(cols), hits, len(slow) / len(rs.keys)) * len(rs.keys) > MAX_CHANCE:
        return None
    return s


def chance(n: int, k: int, p: float) -> float:
    """The probability of ``k`` or more successes in ``n`` trials of probability ``p`` (binomial; in
    logarithms, so that long runs neither overflow nor underflow before the sum)."""
    if p >= 1:
        return 1.0
    lp, lq, top = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    return min(
        1.0,
        sum(
            math.exp(top - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
            for i in range(max(0, k), n + 1)
        ),
    )


def wait_for_slower(rs: RankSteps | None, key: ProcKey) -> float:
    """The share of ``key``'s step time (over the steps every rank ran) it spent in exposed
    communication waiting for slower ranks: per step, how far the slowest rank's busy time exceeds its
    own, at most its exposed communication."""
    import numpy as np  # lazy: numpy loads with the first analysis

    if rs is None or key not in rs.keys:
        return 0.0
    cols = np.flatnonzero(~np.isnan(rs.parts["step"]).any(axis=0))
    i = rs.keys.index(key)
    step = rs.parts["step"][:, cols]
    comm = rs.parts["communication"][:, cols]
    busy = step - comm
    wait = np.minimum(comm[i], np.maximum(busy.max(axis=0) - busy[i], 0.0))
    total = float(step[i].sum())
    return float(wait.sum()) / total if total > 0 else 0.0


def _ms(s: float) -> str:
    return f"{1000 * s:.1f} ms"


def _ranks_text(rs: RankSteps, idx: list[int]) -> str:
    ranks = [rs.keys[i].rank for i in idx]
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(str(r) for r in ranks[:8]) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f"ranks {shown}"


_WHY = {
    "compute": (
        "it computes longer than the median rank: more work on it (uneven shards, longer sequences or "
        "larger samples: balance the work per rank, e.g. bucket samples by length) or a slower device or "
        "CPU on {host} (throttled clocks, other jobs sharing it: check with nvidia-smi / top there)"
    ),
    "data_wait": (
        "it waits longer for its batches: its input pipeline is slower (more DataLoader workers for it, "
        "its data on a slower file system or a busier disk on {host}: stage the data locally)"
    ),
    "other": (
        "it spends longer outside compute and loading: code that runs on that rank only (logging, "
        "metrics, evaluation or checkpoints on rank 0: do them every N steps, asynchronously, or on "
        "all ranks) or a busier host {host}"
    ),
}


def straggler_finding(rs: RankSteps, s: Straggler) -> Finding:
    """The ``straggler`` finding of :func:`find_straggler`'s result."""
    key = rs.keys[s.index]
    who = _ranks_text(rs, s.slow)
    where = max(EXCESS_PARTS, key=lambda p: s.excess_by_phase[p])
    gain = round(min(1.0, s.gain), 4)
    evidence: dict[str, Any] = {
        "rank": key.rank,
        "host": key.host,
        "slow_ranks": [rs.keys[i].rank for i in s.slow],
        "slowest_fraction": round(s.slowest_fraction, 3),
        "last_to_arrive_fraction": round(s.slowest_fraction, 3),
        "median_rank": rs.keys[s.median].rank,
        "excess_s_per_step": round(s.excess_s, 6),
        "excess_by_phase": {p: round(v, 6) for p, v in s.excess_by_phase.items()},
        "slower_phase": where,
        "others_wait_per_step_s": round(s.others_wait_s, 6),
        "cost_per_step_s": round(s.gain_s, 6),
        "job_step_mean_s": round(s.job_step_s, 6),
        "steps": s.steps,
    }
    # the network is named only where the ranks crossed one (advice fits the machine)
    comm = (
        "no faster network or gradient compression shortens"
        if len({k.host for k in rs.keys}) > 1
        else "no change to the communication itself shortens"
    )
    return Finding(
        id="straggler",
        severity=severity_of_gain(gain),
        title=(
            f"straggler: {who} {'is' if len(s.slow) == 1 else 'are'} the slowest in "
            f"{100 * s.slowest_fraction:.0f}% of steps; at the median rank's pace each step would take "
            f"{_ms(s.gain_s)} less ({100 * gain:.0f}% of {_ms(s.job_step_s)}), its excess mostly "
            f"{where.replace('_', ' ')} (+{_ms(s.excess_by_phase[where])})"
        ),
        evidence=evidence,
        recommendation=(
            f"find out why {who} is slower: "
            + _WHY[where].format(host=key.host)
            + ". The other ranks wait for it at their collectives: that wait is their exposed "
            f"communication, which {comm}; compare the ranks in the report's stragglers table and heatmap"
        ),
        estimated_gain=gain,
        threshold={
            "slowest_fraction": CONSISTENCY,
            "chance": MAX_CHANCE,
            "gain": MIN_GAIN_SHARE,
            "min_steps": MIN_STEPS,
            "measure": "per step, the slowest rank's busy time (step - exposed communication) minus the "
            "slowest of the other ranks', over the job's step time",
        },
        gain_basis={
            "model": "slow ranks at the median rank's pace: the others stop waiting for them",
            "inputs": {
                "gain_s_per_step": round(s.gain_s, 6),
                "job_step_mean_s": round(s.job_step_s, 6),
                "steps": s.steps,
            },
        },
    )


def _columns(rs: RankSteps) -> int:
    return max(MIN_COLUMNS, min(MAX_COLUMNS, MAX_CELLS // len(rs.keys)))


def heatmap(rs: RankSteps) -> dict[str, Any]:
    """Ranks × steps: the mean step time and each part of every bin of ``bin_steps`` consecutive steps
    (of the union of the ranks' step indices), per rank; None where a rank ran none of them."""
    import numpy as np  # lazy: numpy loads with the first analysis

    n = len(rs.steps)
    k = max(1, math.ceil(n / _columns(rs)))
    starts = np.arange(0, n, k)
    out: dict[str, Any] = {
        "ranks": [key.rank for key in rs.keys],
        "hosts": [key.host for key in rs.keys],
        "steps": [int(rs.steps[i]) for i in starts],
        "last_step": int(rs.steps[-1]),
        "bin_steps": int(k),
        "binned": k > 1,
    }
    for name in ("step", *PARTS):
        m = rs.parts[name]
        have = ~np.isnan(m)
        sums = np.add.reduceat(np.where(have, m, 0.0), starts, axis=1)
        cnt = np.add.reduceat(have.astype(np.int64), starts, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = sums / cnt
        out[f"{name}_s"] = [
            [None if c == 0 else round(float(v), 6) for v, c in zip(row, crow, strict=True)]
            for row, crow in zip(mean, cnt, strict=True)
        ]
    return out


def per_rank(rs: RankSteps) -> list[dict[str, Any]]:
    """Each rank over the steady steps every rank ran: its mean step and parts, its busy time and its
    excess over the median rank's (split by part), and the share of steps in which it was the
    slowest."""
    import numpy as np  # lazy: numpy loads with the first analysis

    cols = rs.common()
    if not len(cols):
        return []
    means = _means(rs, cols)
    busy = rs.parts["step"][:, cols] - rs.parts["communication"][:, cols]
    busy_mean = busy.mean(axis=1)
    med = median_rank(busy_mean)
    slowest = np.bincount(busy.argmax(axis=0), minlength=len(rs.keys)) / len(cols)
    out = []
    for i, key in enumerate(rs.keys):
        out.append(
            {
                "rank": key.rank,
                "host": key.host,
                "pid": key.pid,
                "steps": rs.counts[i],
                "step_median_s": round(float(np.median(rs.parts["step"][i, cols])), 6),
                "step_mean_s": round(float(means["step"][i]), 6),
                **{f"{p}_s": round(float(means[p][i]), 6) for p in PARTS},
                "busy_s": round(float(busy_mean[i]), 6),
                "excess_s": round(float(busy_mean[i] - busy_mean[med]), 6),
                "excess_by_phase": {p: round(float(means[p][i] - means[p][med]), 6) for p in EXCESS_PARTS},
                "slowest_fraction": round(float(slowest[i]), 3),
            }
        )
    return out


def rank_steps(run: Run, ctx: dict[str, Any]) -> RankSteps | None:
    """The run's rank × step table, computed once per report (kept in ``ctx``: the communication
    section reads it too)."""
    if "rank_steps" not in ctx:
        keys = list(ctx.get("step_processes") or [])
        ctx["rank_steps"] = load_rank_steps(run, keys, ctx.get("engine")) if len(keys) > 1 else None
    rs: RankSteps | None = ctx["rank_steps"]
    return rs


def stragglers_section(run: Run, ctx: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    """The ``stragglers`` section (``{}`` for fewer than two ranks) and the ``straggler`` finding."""
    rs = rank_steps(run, ctx)
    if rs is None:
        return {}, []
    s = find_straggler(rs)
    cols = rs.common()
    busy = (rs.parts["step"][:, cols] - rs.parts["communication"][:, cols]).mean(axis=1)
    section = {
        "steps": len(cols),
        "median_rank": rs.keys[median_rank(busy)].rank if len(cols) else None,
        "per_rank": per_rank(rs),
        "heatmap": heatmap(rs),
    }
    return section, ([straggler_finding(rs, s)] if s is not None else [])
