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


def step_processes(run: Run) -> list[ProcKey]:
    """Processes that ran training steps, the main training loop first.

    The main loop is the process with the most steps; among ranks with equally many, the lowest
    rank. Each process's loop thread is the thread that recorded most of its steps.
    """
    rows = run.rows(
        """SELECT host, pid, any_value(rank) AS rank, mode(tid) AS tid, count(*) AS n
           FROM spans WHERE kind = 'step' GROUP BY host, pid
           ORDER BY n DESC, CASE WHEN any_value(rank) < 0 THEN 1 << 30 ELSE any_value(rank) END, pid"""
    )
    return [ProcKey(str(h), int(p), int(r if r is not None else -1), int(t)) for h, p, r, t, _ in rows]


_PHASE_COLS = [p for p in model.MEASURED_PHASES]


def _per_step_sql() -> str:
    sums = ",\n".join(f"coalesce(sum(d) FILTER (WHERE name = '{p}'), 0) AS {p}" for p in _PHASE_COLS)
    measured = " + ".join(_PHASE_COLS)
    scaled = ",\n".join(f"{p} * f AS {p}" for p in _PHASE_COLS)
    return f"""
    WITH st AS (
        SELECT step, start_ns AS s, end_ns AS e FROM spans
        WHERE kind = 'step' AND host = $host AND pid = $pid AND end_ns >= start_ns
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


def step_stats(run: Run, proc: ProcKey, timeline_points: int = 120) -> StepStats:
    params = {"host": proc.host, "pid": proc.pid, "tid": proc.tid}
    base = _per_step_sql()
    agg_cols = ", ".join(
        f"sum({p}), median({p}), median({p} / greatest(dur, 1))" for p in (*_PHASE_COLS, "other")
    )
    row = run.con.execute(
        base
        + f"""SELECT count(*), median(dur), quantile_cont(dur, 0.9), avg(dur), sum(dur), min(s), max(e),
                     {agg_cols}
              FROM per_step""",
        params,
    ).fetchone()
    assert row is not None
    count = int(row[0] or 0)
    total = float(row[4] or 0)
    phases: dict[str, PhaseStat] = {}
    for i, p in enumerate((*_PHASE_COLS, "other")):
        tot = float(row[7 + 3 * i] or 0)
        med = float(row[8 + 3 * i] or 0)
        share = float(row[9 + 3 * i] or 0)
        phases[p] = PhaseStat(
            fraction=(tot / total) if total > 0 else 0.0,
            total_s=tot / NS,
            median_s=med / NS,
            median_share=share,
        )
    # make the fractions sum to exactly 1 despite float rounding: put the residue on `other`
    if total > 0:
        residue = 1.0 - sum(ps.fraction for ps in phases.values())
        phases["other"].fraction = max(0.0, phases["other"].fraction + residue)
    first, last = int(row[5] or 0), int(row[6] or 0)
    wall = (last - first) / NS if last > first else 0.0
    timeline: list[dict[str, float]] = []
    if count:
        k = max(1, -(-count // timeline_points))
        cols = ", ".join(f"avg({p}) / 1e9 AS {p}" for p in (*_PHASE_COLS, "other"))
        rows = run.con.execute(
            base
            + f"""SELECT min(step) AS step, avg(dur) / 1e9 AS step_s, {cols}
                  FROM (SELECT *, row_number() OVER (ORDER BY step) - 1 AS i FROM per_step)
                  GROUP BY i // {k} ORDER BY 1""",
            params,
        ).fetchall()
        names = ["step", "step_s", *_PHASE_COLS, "other"]
        timeline = [dict(zip(names, (float(v or 0) for v in r), strict=True)) for r in rows]
    epochs = run.rows(
        "SELECT count(*) FROM spans WHERE kind = 'epoch' AND host = ? AND pid = ?", [proc.host, proc.pid]
    )[0][0]
    return StepStats(
        proc=proc,
        count=count,
        median_s=float(row[1] or 0) / NS,
        p90_s=float(row[2] or 0) / NS,
        mean_s=float(row[3] or 0) / NS,
        per_s=(count / wall) if wall > 0 else 0.0,
        total_s=total / NS,
        first_start_ns=first,
        last_end_ns=last,
        phases=phases,
        epochs=int(epochs or 0),
        timeline=timeline,
    )


def outside_steps(run: Run, proc: ProcKey | None) -> dict[str, float]:
    """Seconds per phase recorded outside any step (e.g. the final eval and checkpoint)."""
    if proc is None:
        rows = run.rows(
            "SELECT name, sum(end_ns - start_ns) FROM spans WHERE kind = 'phase' GROUP BY name ORDER BY name"
        )
    else:
        rows = run.con.execute(
            """WITH st AS (SELECT step, start_ns AS s, end_ns AS e FROM spans
                           WHERE kind = 'step' AND host = $host AND pid = $pid)
               SELECT p.name, sum(p.end_ns - p.start_ns)
               FROM spans p LEFT JOIN st ON p.step = st.step
               WHERE p.kind = 'phase' AND p.host = $host AND p.pid = $pid AND p.tid = $tid
                 AND (st.step IS NULL OR p.end_ns <= st.s OR p.start_ns >= st.e)
               GROUP BY p.name ORDER BY p.name""",
            {"host": proc.host, "pid": proc.pid, "tid": proc.tid},
        ).fetchall()
    return {str(n): float(d or 0) / NS for n, d in rows}


def loader_config(run: Run, proc: ProcKey) -> dict[str, Any]:
    """The configuration of the DataLoader whose fetches fed the training loop (the most data_wait)."""
    import json

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
