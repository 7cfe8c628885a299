"""Goodput: the whole wall time of the training process, cut into what it went to.

For each process with training steps (every rank of a multi-rank job), from the moment it was
created (read from ``/proc`` by its agent, to 10 ms; where the system does not say, from the agent's
start, a little after the interpreter's) to the moment its agent ended:

============================  =======================================================================
``startup``                   before the first step: imports, model build, data preparation (less
                              the phases recorded there: a checkpoint loaded, an evaluation)
``compile``                   ``torch.compile``'s compilation (the ``compile`` phase), in steps or not
``productive``                the steps' forward, backward, optimizer and the rest of the loop's
                              own code (``other``): the training itself
``data_wait``                 waiting for the next batch
``communication``             collectives not hidden behind compute
``checkpoint``                saving and loading checkpoints
``eval``                      evaluation
``idle``                      between steps, in no phase: a hang, a sleep, work of the job's own
                              outside the loop
``after_last_step``           from the end of the last step to the end of the process (less the
                              phases recorded there: the final evaluation and checkpoint)
============================  =======================================================================

The categories add up to the process's wall time by construction (the step breakdown sums to each
step; what lies outside the steps is split at the first and last step). ``fraction`` is
``productive`` over the wall time. The report's top-level table is the main loop's process; every
step process is in ``per_rank``.
"""

from __future__ import annotations

import json
from typing import Any

from holoprof.analyze.engine import Aggregation, aggregate
from holoprof.analyze.steps import NS, ProcKey, StepStats, outside_steps
from holoprof.store.reader import Run

CATEGORIES = (
    "startup",
    "compile",
    "productive",
    "data_wait",
    "communication",
    "checkpoint",
    "eval",
    "idle",
    "after_last_step",
)
#: phase name -> goodput category (the others are productive)
_OF_PHASE = {
    "data_wait": "data_wait",
    "communication": "communication",
    "checkpoint": "checkpoint",
    "eval": "eval",
    "compile": "compile",
}


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _ends_agg(bounds: dict[ProcKey, tuple[int, int]]) -> Aggregation:
    """Per process and phase name, the loop thread's phase time (ns) before its first step and after
    its last (``bounds``: each process's first step start and last step end), in one scan of the
    spans for every process."""
    values = ", ".join(
        f"({_sql_str(p.host)}, {int(p.pid)}, {int(p.tid)}, {int(f)}, {int(last)})"
        for p, (f, last) in bounds.items()
    )
    return Aggregation(
        name="goodput-ends",
        table="spans",
        columns=("host", "pid", "tid", "kind", "name", "start_ns", "end_ns"),
        chunk=f"""WITH b(host, pid, tid, f, l) AS (VALUES {values})
                 SELECT p.host, p.pid, p.name,
                   CAST(coalesce(sum(least(p.end_ns, b.f) - p.start_ns) FILTER (WHERE p.start_ns < b.f), 0)
                        AS BIGINT) AS before_ns,
                   CAST(coalesce(sum(p.end_ns - greatest(p.start_ns, b.l)) FILTER (WHERE p.end_ns > b.l), 0)
                        AS BIGINT) AS after_ns
                 FROM {{t}} p JOIN b ON p.host = b.host AND p.pid = b.pid AND p.tid = b.tid
                 WHERE p.kind = 'phase' AND p.end_ns >= p.start_ns
                 GROUP BY p.host, p.pid, p.name""",
        combine="""SELECT host, pid, name, CAST(sum(before_ns) AS BIGINT) AS before_ns,
                   CAST(sum(after_ns) AS BIGINT) AS after_ns FROM {t} GROUP BY host, pid, name""",
        order="host, pid, name",
        pids=tuple(sorted({p.pid for p in bounds})),
    )


def _lifetimes(run: Run) -> dict[tuple[str, int], tuple[int, int]]:
    """(start, end) in ns of every process: from its creation (recorded by its agent; else the agent's
    start) to its end (while it runs, or when it did not end cleanly: minus its last update)."""
    rows = run.rows("SELECT host, pid, start_ns, end_ns, updated_ns, info FROM processes")
    out = {}
    for host, pid, s, e, u, info in rows:
        start = int(s or 0)
        try:
            created = int((json.loads(info) if info else {}).get("created_ns") or 0)
        except (ValueError, TypeError, AttributeError):
            created = 0
        if 0 < created < start:
            start = created
        out[(str(host), int(pid))] = (start, int(e or 0) or -int(u or 0))  # negative: still running
    return out


def process_goodput(
    run: Run,
    ctx: dict[str, Any],
    proc: ProcKey,
    st: StepStats,
    life: tuple[int, int],
    ends: dict[str, tuple[float, float]],
) -> dict[str, Any] | None:
    """The goodput table of one step process (``ends``: per phase name, its seconds before the first
    step and after the last); None when its lifetime is unknown."""
    p0, p1 = life
    first, last = st.first_start_ns, st.last_end_ns
    if p1 < 0:  # still running (or ended without a last record): up to what it recorded last
        p1 = max(-p1, last)
    if not (0 < p0 <= first <= last) or p1 < last:
        return None
    cats = dict.fromkeys(CATEGORIES, 0.0)
    for name, ph in st.phases.items():
        cats[_OF_PHASE.get(name, "productive")] += ph.total_s
    before = sum(b for b, _a in ends.values())
    after = sum(a for _b, a in ends.values())
    outside = outside_steps(run, proc, st, engine=ctx.get("engine"))
    for name, s in outside.items():
        cats[_OF_PHASE.get(name, "productive")] += s
    between = sum(outside.values()) - before - after
    cats["startup"] = max(0.0, (first - p0) / NS - before)
    cats["after_last_step"] = max(0.0, (p1 - last) / NS - after)
    cats["idle"] = max(0.0, (last - first) / NS - st.total_s - max(0.0, between))
    wall = (p1 - p0) / NS
    return {
        "host": proc.host,
        "pid": proc.pid,
        "rank": proc.rank,
        "wall_s": round(wall, 6),
        "categories": {k: round(v, 6) for k, v in cats.items()},
        "fraction": round(cats["productive"] / wall, 6) if wall > 0 else 0.0,
    }


def goodput_section(run: Run, ctx: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    main: ProcKey | None = ctx.get("main")
    st: StepStats | None = ctx.get("steps")
    if main is None or st is None or not st.count:
        return {}, []
    lives = _lifetimes(run)
    stats: dict[ProcKey, StepStats] = {
        p: s for p, s in (ctx.get("rank_stats") or {main: st}).items() if s.count
    }
    ends: dict[tuple[str, int], dict[str, tuple[float, float]]] = {}
    if stats:
        agg = _ends_agg({p: (s.first_start_ns, s.last_end_ns) for p, s in stats.items()})
        for host, pid, name, b, a in aggregate(run, ctx, agg):
            ends.setdefault((str(host), int(pid)), {})[str(name)] = (int(b or 0) / NS, int(a or 0) / NS)
    rows = []
    for p, s in stats.items():
        life = lives.get((p.host, p.pid))
        g = process_goodput(run, ctx, p, s, life, ends.get((p.host, p.pid), {})) if life is not None else None
        if g is not None:
            rows.append(g)
    top = next((r for r in rows if r["host"] == main.host and r["pid"] == main.pid), None)
    if top is None:
        return {}, []
    doc = {k: top[k] for k in ("wall_s", "categories", "fraction")}
    doc["process"] = {"host": main.host, "pid": main.pid, "rank": main.rank}
    doc["per_rank"] = rows if len(rows) > 1 else []
    return doc, []
