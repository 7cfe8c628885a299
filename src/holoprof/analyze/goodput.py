"""Goodput: the whole wall time of the training process, cut into what it went to.

For each process with training steps (every rank of a multi-rank job), from the moment its agent
started (interpreter start-up, before the job's first import) to the moment it ended:

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


def _ends_agg(proc: ProcKey, first: int, last: int) -> Aggregation:
    """Per phase name, ``proc``'s loop-thread phase time (ns) before ``first`` and after ``last``."""
    return Aggregation(
        name="goodput-ends",
        table="spans",
        columns=("host", "pid", "tid", "kind", "name", "start_ns", "end_ns"),
        chunk="""SELECT name,
                   CAST(coalesce(sum(least(end_ns, $first) - start_ns) FILTER (WHERE start_ns < $first), 0)
                        AS BIGINT) AS before_ns,
                   CAST(coalesce(sum(end_ns - greatest(start_ns, $last)) FILTER (WHERE end_ns > $last), 0)
                        AS BIGINT) AS after_ns
                 FROM {t} WHERE kind = 'phase' AND host = $host AND pid = $pid AND tid = $tid
                   AND end_ns >= start_ns
                 GROUP BY name""",
        combine="""SELECT name, CAST(sum(before_ns) AS BIGINT) AS before_ns, CAST(sum(after_ns) AS BIGINT)
                   AS after_ns FROM {t} GROUP BY name""",
        order="name",
        params={"host": proc.host, "pid": proc.pid, "tid": proc.tid, "first": first, "last": last},
        pids=(proc.pid,),
    )


def _lifetimes(run: Run) -> dict[tuple[str, int], tuple[int, int]]:
    """(start, end) in ns of every process (end: its last update when it did not end cleanly)."""
    rows = run.rows("SELECT host, pid, start_ns, end_ns, updated_ns FROM processes")
    out = {}
    for host, pid, s, e, u in rows:
        end = int(e or 0) or int(u or 0)
        out[(str(host), int(pid))] = (int(s or 0), end)
    return out


def process_goodput(
    run: Run, ctx: dict[str, Any], proc: ProcKey, st: StepStats, life: tuple[int, int]
) -> dict[str, Any] | None:
    """The goodput table of one step process; None when its lifetime is unknown."""
    p0, p1 = life
    first, last = st.first_start_ns, st.last_end_ns
    if not (0 < p0 <= first <= last) or p1 < last:
        return None
    cats = dict.fromkeys(CATEGORIES, 0.0)
    for name, ph in st.phases.items():
        cats[_OF_PHASE.get(name, "productive")] += ph.total_s
    before: dict[str, float] = {}
    after: dict[str, float] = {}
    for name, b, a in aggregate(run, ctx, _ends_agg(proc, first, last)):
        before[str(name)], after[str(name)] = int(b or 0) / NS, int(a or 0) / NS
    outside = outside_steps(run, proc, st, engine=ctx.get("engine"))
    for name, s in outside.items():
        cats[_OF_PHASE.get(name, "productive")] += s
    between = sum(outside.values()) - sum(before.values()) - sum(after.values())
    cats["startup"] = max(0.0, (first - p0) / NS - sum(before.values()))
    cats["after_last_step"] = max(0.0, (p1 - last) / NS - sum(after.values()))
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
    stats: dict[ProcKey, StepStats] = ctx.get("rank_stats") or {main: st}
    rows = []
    for p, s in stats.items():
        life = lives.get((p.host, p.pid))
        g = process_goodput(run, ctx, p, s, life) if life is not None and s.count else None
        if g is not None:
            rows.append(g)
    top = next((r for r in rows if r["host"] == main.host and r["pid"] == main.pid), None)
    if top is None:
        return {}, []
    doc = {k: top[k] for k in ("wall_s", "categories", "fraction")}
    doc["process"] = {"host": main.host, "pid": main.pid, "rank": main.rank}
    doc["per_rank"] = rows if len(rows) > 1 else []
    return doc, []
