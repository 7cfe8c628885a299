"""Communication of distributed jobs: collectives, exposed and overlapped time, DDP buckets, stragglers.

Pure functions of a loaded run (``communication(run, ctx)`` is the ``communication`` section of the
report). The scans of ``spans`` (per collective, per step of every rank, DDP buckets, the ranks' last
activity) are :class:`~holoprof.analyze.engine.Aggregation` queries: under ``--engine dask``
they run on the Dask cluster, with the same SQL and the same rows. Definitions, per step of a process:

* ``exposed``: communication the training loop waited for — its ``communication`` phase: synchronous
  collectives and waits (``Work.wait()``, a functional collective's wait: DTensor) outside any other
  phase; the same inside forward, backward or the optimizer step, carved out of that phase (FSDP's
  all-gathers and reduce-scatters; an asynchronous collective counts for its wait, not its issue);
  and, for DDP, the end of backward after the last gradient bucket was ready (backward's compute is
  over; it waits for the allreduce). It is the very phase of the step breakdown, so the phase table,
  this section and ``communication_bound`` give one figure, and it is never more than the step.
* ``total``: the union of its ``comm`` spans (collectives and DDP buckets) and of its exposed
  communication within the step (``exposed <= total``).
* ``overlapped``: ``total - exposed`` (communication hidden behind compute).
* ``wait`` (per rank): its ``total`` minus the smallest ``total`` of any rank in the same step — time
  spent waiting at collectives for slower ranks. The rank that waits least in most steps arrives last:
  when the others wait for it long enough, it is the straggler.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any

from holoprof.analyze.engine import Aggregation, aggregate, rows_in, step_windows
from holoprof.analyze.findings import Finding
from holoprof.analyze.steps import NS, ProcKey, StepStats, step_stats
from holoprof.analyze.stragglers import find_straggler, rank_steps, wait_for_slower
from holoprof.store.reader import Run

COMM_BOUND_MEDIUM = 0.10
COMM_BOUND_HIGH = 0.25
#: communication_bound speaks of bandwidth (compressing gradients, a faster network) only when moving
#: the step's bytes over a slow link (this many bits per second: 1 Gbit/s Ethernet) would take at least
#: BANDWIDTH_SHARE of the exposed time; below that the wait is per-call latency and ranks arriving at
#: different times, which neither makes shorter.
SLOW_LINK_BITS_PER_S = 1e9
BANDWIDTH_SHARE = 0.5


@dataclass
class ProcComm:
    """One process's steps and, per step, its communication time (total and exposed, ns)."""

    key: ProcKey
    stats: StepStats
    steps: dict[int, tuple[int, int]]  # step -> (start, end)
    total: dict[int, int] = field(default_factory=dict)  # step -> comm union ns
    exposed: dict[int, int] = field(default_factory=dict)
    bytes: dict[int, int] = field(default_factory=dict)  # step -> bytes of its collectives (no DDP buckets)


def _union(intervals: list[tuple[int, int]]) -> int:
    total = 0
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None and cur_s is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None and cur_s is not None:
        total += cur_e - cur_s
    return total


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


_STEP_KEYS = "host, pid, step"


def _per_step(keys: list[ProcKey]) -> Aggregation:
    """Per step of each of these processes: its window (of several step spans with one index, the
    last to start), ``exposed`` (the union of the ``communication`` phases of its training loop's
    thread, clipped to the window: exactly the ``communication`` phase of the step breakdown),
    ``total`` (the union of those phases and of its comm spans, clipped: exposed communication is
    communication, so ``exposed <= total <= step``) and the bytes of its collectives (DDP buckets
    aside). A union adds, for each interval in order, what extends past the ends before it. The
    spans of a step meet in one partition (shuffled on host, pid, step) on Dask."""
    procs = (
        rows_in(("host", "pid"), [(k.host, k.pid) for k in keys])
        + " AND (kind <> 'phase' OR "
        + rows_in(("host", "pid", "tid"), [(k.host, k.pid, k.tid) for k in keys])
        + ")"
    )
    union_add = (
        "greatest(0, b - greatest(a, coalesce(max(b) OVER (PARTITION BY {part} ORDER BY a, b "
        "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), a)))"
    )
    return Aggregation(
        name="comm-steps",
        table="spans",
        columns=("host", "pid", "tid", "kind", "name", "start_ns", "end_ns", "step", "attrs"),
        chunk=f"""SELECT host, pid, step, kind, name, start_ns, end_ns,
            CASE WHEN kind = 'comm' AND name <> 'ddp_bucket'
                 THEN try_cast(json_extract(attrs, '$.bytes') AS BIGINT) END AS bytes
            FROM {{t}}
            WHERE (kind = 'step' OR (step >= 0 AND (kind = 'comm' OR (kind = 'phase' AND name = 'communication'))))
              AND ({procs})""",
        shuffle=("host", "pid", "step"),
        group=f"""WITH w AS ({step_windows(_STEP_KEYS)}),
            x AS (
              SELECT {{t}}.*, greatest({{t}}.start_ns, w.s) AS a, least({{t}}.end_ns, w.e) AS b
              FROM {{t}} JOIN w USING ({_STEP_KEYS}) WHERE {{t}}.kind <> 'step'),
            u AS (
              SELECT {_STEP_KEYS}, {union_add.format(part=_STEP_KEYS)} AS add_all,
                     CASE WHEN kind = 'phase' THEN {union_add.format(part=_STEP_KEYS + ", kind")} END AS add_phase
              FROM x WHERE b > a),
            agg AS (
              SELECT {_STEP_KEYS}, CAST(sum(add_all) AS BIGINT) AS total,
                     CAST(sum(add_phase) AS BIGINT) AS phase FROM u GROUP BY {_STEP_KEYS}),
            x2 AS (
              SELECT {_STEP_KEYS}, CAST(sum(bytes) AS BIGINT) AS bytes
              FROM x WHERE kind = 'comm' GROUP BY {_STEP_KEYS})
            SELECT {_STEP_KEYS}, w.s, w.e, coalesce(agg.total, 0) AS total,
                   coalesce(agg.phase, 0) AS exposed, coalesce(x2.bytes, 0) AS bytes
            FROM w LEFT JOIN agg USING ({_STEP_KEYS}) LEFT JOIN x2 USING ({_STEP_KEYS})""",
        order=_STEP_KEYS,
        pids=tuple(sorted({int(k.pid) for k in keys})),
    )


def load_procs(
    run: Run, keys: list[ProcKey], stats: list[StepStats], ctx: dict[str, Any] | None = None
) -> list[ProcComm]:
    """The communication of each process of ``keys`` (``stats``: its step statistics), from one
    per-step aggregation of all of them (on the Dask cluster under ``--engine dask``)."""
    if not keys:
        return []
    procs = {(k.host, k.pid): ProcComm(k, st, {}) for k, st in zip(keys, stats, strict=True)}
    for host, pid, step, s, e, total, exposed, nbytes in aggregate(run, ctx, _per_step(keys)):
        p = procs[(host, pid)]
        p.steps[step] = (s, e)
        p.total[step] = total
        p.exposed[step] = exposed
        p.bytes[step] = nbytes
    return [procs[(k.host, k.pid)] for k in keys]


def load_proc(run: Run, key: ProcKey, st: StepStats | None) -> ProcComm:
    stats = st if st is not None else step_stats(run, key, timeline_points=1)
    return load_procs(run, [key], [stats])[0]


_BYTES = "try_cast(json_extract(attrs, '$.bytes') AS BIGINT)"


def _collectives_agg(main: ProcKey | None) -> Aggregation:
    """Per collective: calls, bytes, time, processes, and the main loop's bytes within steps.
    Partial results are per (collective, pid), so that the processes can be counted after a merge."""
    return Aggregation(
        name="comm-collectives",
        table="spans",
        columns=("host", "pid", "kind", "name", "start_ns", "end_ns", "step", "attrs"),
        chunk=f"""SELECT name, pid, count(*) AS n, CAST(sum({_BYTES}) AS BIGINT) AS nbytes,
            CAST(sum(end_ns - start_ns) AS BIGINT) AS dur,
            CAST(sum({_BYTES}) FILTER (WHERE host = $host AND pid = $pid AND step >= 0) AS BIGINT) AS main_bytes
            FROM {{t}} WHERE kind = 'comm' GROUP BY name, pid""",
        combine="""SELECT name, pid, CAST(sum(n) AS BIGINT) AS n, CAST(sum(nbytes) AS BIGINT) AS nbytes,
            CAST(sum(dur) AS BIGINT) AS dur, CAST(sum(main_bytes) AS BIGINT) AS main_bytes
            FROM {t} GROUP BY name, pid""",
        final="""SELECT name, CAST(sum(n) AS BIGINT) AS n, CAST(coalesce(sum(nbytes), 0) AS BIGINT) AS nbytes,
            CAST(sum(dur) AS BIGINT) AS dur, count(pid) AS procs,
            CAST(coalesce(sum(main_bytes), 0) AS BIGINT) AS main_bytes FROM {t} GROUP BY name""",
        order="dur DESC, name",
        params={"host": main.host if main else "", "pid": main.pid if main else -1},
    )


def _collectives(rows: list[tuple[Any, ...]], nsteps: int) -> list[dict[str, Any]]:
    out = []
    for name, count, nbytes, dur, procs, main_bytes in rows:
        out.append(
            {
                "op": name,
                "count": int(count),
                "bytes": int(nbytes or 0),
                "total_s": round(float(dur or 0) / NS, 6),
                "processes": int(procs),
                "bytes_per_step": int(main_bytes or 0) // nsteps if nsteps else 0,
            }
        )
    return out


def _bucket_aggs(main: ProcKey) -> tuple[Aggregation, Aggregation]:
    """The main loop's DDP bucket spans, in time order, and the start of its backward phase per step."""
    params = {"host": main.host, "pid": main.pid, "tid": main.tid}
    rows = Aggregation(
        name="comm-buckets",
        table="spans",
        columns=("host", "pid", "kind", "name", "start_ns", "end_ns", "step", "attrs"),
        chunk="""SELECT step, start_ns, end_ns, attrs FROM {t}
            WHERE kind = 'comm' AND name = 'ddp_bucket' AND host = $host AND pid = $pid""",
        order="start_ns, end_ns, step, attrs",
        params=params,
        pids=(main.pid,),
    )
    back = Aggregation(
        name="comm-backward",
        table="spans",
        columns=("host", "pid", "tid", "kind", "name", "start_ns", "step"),
        chunk="""SELECT step, min(start_ns) AS t0 FROM {t} WHERE kind = 'phase' AND name = 'backward'
            AND host = $host AND pid = $pid AND tid = $tid GROUP BY step""",
        combine="SELECT step, min(t0) AS t0 FROM {t} GROUP BY step",
        order="step",
        params=params,
        pids=(main.pid,),
    )
    return rows, back


def _buckets(
    run: Run, main: ProcKey, ctx: dict[str, Any] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows_agg, back_agg = _bucket_aggs(main)
    back = {int(s): int(t) for s, t in aggregate(run, ctx, back_agg)}
    rows = aggregate(run, ctx, rows_agg)
    by_index: dict[int, dict[str, Any]] = {}
    for step, s, e, attrs in rows:
        try:
            a = json.loads(attrs) if attrs else {}
        except ValueError:
            a = {}
        idx = int(a.get("bucket_index", -1))
        b = by_index.setdefault(idx, {"bytes": [], "ready": [], "dur": [], "params": [], "pbytes": []})
        b["bytes"].append(int(a.get("bytes", 0)))
        b["dur"].append((int(e) - int(s)) / NS)
        t0 = back.get(int(step))
        if t0 is not None:
            b["ready"].append((int(s) - t0) / NS)
        if a.get("params"):
            b["params"] = list(a["params"])
            b["pbytes"] = list(a.get("param_bytes") or [])
    buckets = []
    layers: dict[str, dict[str, float]] = {}
    for idx in sorted(by_index):
        b = by_index[idx]
        nbytes = int(_median(b["bytes"]))
        allreduce_s = _median(b["dur"])
        names = [str(p).rsplit(".", 1)[0] if "." in str(p) else str(p) for p in b["params"]]
        layer_names = list(dict.fromkeys(names))
        buckets.append(
            {
                "index": idx,
                "bytes": nbytes,
                "params": len(b["params"]),
                "layers": layer_names,
                "ready_s": round(_median(b["ready"]), 6),
                "allreduce_s": round(allreduce_s, 6),
            }
        )
        total_b = sum(b["pbytes"]) or 1
        for layer, pb in zip(names, b["pbytes"], strict=False):
            d = layers.setdefault(layer, {"grad_bytes": 0.0, "comm_s": 0.0})
            d["grad_bytes"] += pb
            d["comm_s"] += allreduce_s * pb / total_b
    per_layer = [
        {"name": k, "grad_bytes": int(v["grad_bytes"]), "comm_s": round(v["comm_s"], 6)}
        for k, v in sorted(layers.items(), key=lambda kv: -kv[1]["grad_bytes"])
    ]
    return buckets, per_layer


_NEVER = 9223372036854775807
#: Per process: its steps, and the end of its last span other than a step (its last activity).
_ACTIVITY = Aggregation(
    name="comm-activity",
    table="spans",
    columns=("host", "pid", "kind", "end_ns"),
    chunk="""SELECT host, pid, count(*) FILTER (WHERE kind = 'step') AS n,
        max(end_ns) FILTER (WHERE kind <> 'step') AS last FROM {t} GROUP BY host, pid""",
    combine="SELECT host, pid, CAST(sum(n) AS BIGINT) AS n, max(last) AS last FROM {t} GROUP BY host, pid",
    order="host, pid",
)


def _failures(run: Run, ctx: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Ranks that ended with an error, the first to die first.

    "First" is by the last recorded activity (phases, ops, collectives), not by the exit time: a
    rank that dies takes a moment to flush, while a peer that fails at its next collective because
    of it may exit sooner, but its last activity (that collective) comes later.

    Once the run is over, a rank with no exit record failed too: it was killed by a signal it could
    not catch (SIGKILL, the kernel's OOM killer) or aborted in native code, so no Python code ran.
    Its ``exit_code`` is None and what it recorded in its last flush interval is missing.
    """
    over = run.status != "running"
    procs = run.rows(
        """SELECT rank, pid, host, exit_code, end_ns FROM processes
           WHERE rank >= 0 AND (exit_code NOT IN (0, -1)
                                OR (? AND coalesce(end_ns, 0) = 0 AND coalesce(exit_code, -1) = -1))""",
        [over],
    )
    if not procs:
        return []
    act = {(h, p): (n, last) for h, p, n, last in aggregate(run, ctx, _ACTIVITY)}
    rows = []
    for r, pid, host, code, end in procs:
        n, last = act.get((host, pid), (0, None))
        rows.append((r, pid, host, code, end, n, last))
    rows.sort(
        key=lambda x: (x[6] if x[6] is not None else x[4] if x[4] and x[4] > 0 else _NEVER, x[0], x[2], x[1])
    )
    start = run.manifest.get("start_ns") or 0
    out = []
    for r, pid, host, code, end, n, last in rows:
        recorded = code is not None and int(code) != -1
        out.append(
            {
                "rank": int(r),
                "pid": int(pid),
                "host": host,
                "exit_code": int(code) if recorded else None,
                "end_s": round((int(end) - start) / NS, 3) if end and start else None,
                "last_activity_s": round((int(last) - start) / NS, 3) if last and start else None,
                "steps": int(n),
            }
        )
    return out


def _how(f: dict[str, Any], short: bool = False) -> str:
    if f["exit_code"] is not None:
        return f"exit {f['exit_code']}" if short else f"exit code {f['exit_code']}"
    return "no exit record" if short else "no exit record: killed by SIGKILL or the OOM killer, or aborted"


def _waits(procs: list[ProcComm]) -> dict[int, float]:
    """Per rank, its median wait at collectives for slower ranks (see the module's docstring)."""
    ranked = [p for p in procs if p.key.rank >= 0 and p.stats.count > 0]
    if len(ranked) < 2:
        return {}
    waits: dict[int, list[float]] = {p.key.rank: [] for p in ranked}
    for step in sorted(set.intersection(*(set(p.total) for p in ranked))):
        totals = {p.key.rank: p.total[step] for p in ranked}
        low = min(totals.values())
        for r, t in totals.items():
            waits[r].append((t - low) / NS)
    return {r: _median(w) for r, w in waits.items()}


def communication(run: Run, ctx: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    main: ProcKey | None = ctx.get("main")
    collectives = aggregate(run, ctx, _collectives_agg(main))  # a row per collective: none, no comm
    failures = _failures(run, ctx)
    if not collectives and not failures:
        return {}, []
    procs_keys: list[ProcKey] = list(ctx.get("step_processes") or ([main] if main else []))
    procs = load_procs(run, procs_keys, _step_stats(run, ctx, main, procs_keys), ctx)
    main_proc = next((p for p in procs if p.key == main), None)
    nsteps = len(main_proc.steps) if main_proc else 0
    section: dict[str, Any] = {
        "bytes_per_step": 0,
        "exposed_fraction": 0.0,
        "total_s_per_step": 0.0,
        "overlapped_s_per_step": 0.0,
        "exposed_s_per_step": 0.0,
        "step_mean_s": 0.0,
        "world_size": 0,
        "collectives": _collectives(collectives, nsteps),
        "per_rank": [],
        "buckets": [],
        "per_layer": [],
        "failed_ranks": failures,
    }
    if failures:
        section["first_failure"] = _first_failure(failures)
    findings: list[Finding] = []
    if main_proc is not None and nsteps:
        _main_figures(run, ctx, section, main_proc, nsteps)
        f = _comm_bound(
            section,
            main_proc,
            len({p.key.host for p in procs} or {main_proc.key.host}),
            _straggler_wait(run, ctx, main_proc.key),
        )
        if f is not None:
            findings.append(f)
    waits = _waits(procs)
    section["per_rank"].extend(
        _rank_doc(p, waits) for p in sorted(procs, key=lambda q: (q.key.rank, q.key.pid))
    )
    return section, findings


def _step_stats(
    run: Run, ctx: dict[str, Any], main: ProcKey | None, procs_keys: list[ProcKey]
) -> list[StepStats]:
    """The step statistics of every process: those the report computed already (``rank_stats``),
    else on its engine (on the Dask cluster under --engine dask)."""
    eng = ctx.get("engine")
    known: dict[ProcKey, StepStats] = dict(ctx.get("rank_stats") or {})
    if main is not None and ctx.get("steps") is not None:
        known[main] = ctx["steps"]
    return [known[k] if k in known else step_stats(run, k, timeline_points=1, engine=eng) for k in procs_keys]


def _first_failure(failures: list[dict[str, Any]]) -> dict[str, Any]:
    """The rank that died first, with a sentence naming it and those that died after."""
    f0 = failures[0]
    others = ", ".join(f"rank {f['rank']} ({_how(f, short=True)})" for f in failures[1:])
    return {
        **f0,
        "message": (
            f"rank {f0['rank']} died first ({_how(f0)}) after {f0['steps']} steps"
            + (f"; then {others}" if others else "")
        ),
    }


def _main_figures(
    run: Run, ctx: dict[str, Any], section: dict[str, Any], main_proc: ProcComm, nsteps: int
) -> None:
    """Fill in the training loop's figures per step, its world size and its DDP buckets."""
    step_bytes = main_proc.bytes
    section["bytes_per_step"] = int(_median([float(step_bytes.get(s, 0)) for s in main_proc.steps]))
    # exposed communication is the loop's `communication` phase: its figures are the phase's
    # (means over the steps, as its share is), so that the phase table and this section agree
    st = main_proc.stats
    exposed_s = st.phases["communication"].total_s / st.count if st.count else 0.0
    total_s = max(sum(main_proc.total.values()) / nsteps / NS, exposed_s)
    section["exposed_fraction"] = round(st.phases["communication"].fraction, 6)
    section["step_mean_s"] = round(st.mean_s, 6)
    section["total_s_per_step"] = round(total_s, 6)
    section["exposed_s_per_step"] = round(exposed_s, 6)
    section["overlapped_s_per_step"] = round(total_s - exposed_s, 6)
    ws = run.rows(
        "SELECT max(world_size) FROM processes WHERE host = ? AND pid = ?",
        [main_proc.key.host, main_proc.key.pid],
    )[0][0]
    section["world_size"] = int(ws or 0)
    buckets, per_layer = _buckets(run, main_proc.key, ctx)
    section["buckets"], section["per_layer"] = buckets, per_layer


def _rank_doc(p: ProcComm, waits: dict[int, float]) -> dict[str, Any]:
    """One rank's step and communication figures: medians over the rank's steps, as its step time is
    (per step exposed <= comm <= step, so their medians keep that order)."""
    return {
        "rank": p.key.rank,
        "host": p.key.host,
        "pid": p.key.pid,
        "steps": p.stats.count,
        "step_median_s": round(p.stats.median_s, 6),
        "step_p90_s": round(p.stats.p90_s, 6),
        "phases": {k: round(v.median_s, 6) for k, v in p.stats.phases.items()},
        "comm_s": round(_median([t / NS for t in p.total.values()]), 6),
        "exposed_s": round(_median([t / NS for t in p.exposed.values()]), 6),
        "exposed_fraction": round(p.stats.phases["communication"].fraction, 6),
        "wait_s": round(waits.get(p.key.rank, 0.0), 6),
    }


#: Collectives of sharded data parallelism (FSDP, ZeRO): parameters gathered, gradients scattered.
_SHARDED_OPS = ("all_gather", "_all_gather_base", "reduce_scatter", "_reduce_scatter_base")


def _sharded(section: dict[str, Any]) -> bool:
    """Most of the bytes per step are all-gathers and reduce-scatters (FSDP) rather than all-reduces."""
    rows = section["collectives"]
    sharded = sum(int(c["bytes_per_step"]) for c in rows if str(c["op"]).startswith(_SHARDED_OPS))
    return sharded * 2 > sum(int(c["bytes_per_step"]) for c in rows) > 0


def _straggler_wait(run: Run, ctx: dict[str, Any], main: ProcKey) -> tuple[int | None, float]:
    """The straggler's rank and the share of the main loop's step time spent waiting for slower
    ranks, when a straggler explains that wait (:mod:`holoprof.analyze.stragglers`); else (None, 0)."""
    rs = rank_steps(run, ctx)
    s = find_straggler(rs)
    if rs is None or s is None:
        return None, 0.0
    return rs.keys[s.index].rank, wait_for_slower(rs, main)


def _comm_bound(
    section: dict[str, Any], main: ProcComm, hosts: int = 1, straggler: tuple[int | None, float] = (None, 0.0)
) -> Finding | None:
    """``communication_bound``; its advice fits the traffic (bandwidth only when the bytes can explain
    the wait) and the machines (no network on one host). When a straggler makes the loop wait
    (``straggler``: its rank and the share of the step the loop waits for slower ranks), that wait is
    the straggler's (its own finding): only the rest of the exposed communication counts here."""
    exposed_frac = float(section["exposed_fraction"])
    rank, wait = straggler
    wait = min(wait, exposed_frac) if rank is not None else 0.0
    frac = exposed_frac - wait
    if frac < COMM_BOUND_MEDIUM:
        return None
    nb = len(section["buckets"])
    sharded = _sharded(section)
    exposed_s = float(section["exposed_s_per_step"]) * (frac / exposed_frac if exposed_frac > 0 else 1.0)
    title = f"communication-bound: {100 * frac:.0f}% of each step waits for communication"
    evidence: dict[str, Any] = {
        "exposed_fraction": exposed_frac,
        "exposed_s_per_step": section["exposed_s_per_step"],
        "overlapped_s_per_step": section["overlapped_s_per_step"],
        "total_s_per_step": section["total_s_per_step"],
        "bytes_per_step": section["bytes_per_step"],
        "step_mean_s": section["step_mean_s"],
        "step_median_s": round(main.stats.median_s, 6),
        "world_size": section["world_size"],
        "hosts": hosts,
        "ddp_buckets": nb,
        "sharded": sharded,
    }
    if rank is not None:
        title += f", besides {100 * wait:.0f}% waiting for the straggler, rank {rank}"
        evidence["straggler_rank"] = rank
        evidence["straggler_wait_fraction"] = round(wait, 6)
    return Finding(
        id="communication_bound",
        severity="high" if frac >= COMM_BOUND_HIGH else "medium",
        title=title,
        evidence=evidence,
        recommendation=_comm_fix(section, hosts, sharded, exposed_s),
        estimated_gain=round(frac, 4),
        threshold={
            "medium": COMM_BOUND_MEDIUM,
            "high": COMM_BOUND_HIGH,
            "measure": "exposed communication / step time, less the wait for a straggler",
            "bandwidth_advice": f"bytes per step at {SLOW_LINK_BITS_PER_S / 1e9:g} Gbit/s >= "
            f"{BANDWIDTH_SHARE:g} x exposed time",
        },
    )


def _comm_fix(
    section: dict[str, Any], hosts: int, sharded: bool = False, exposed: float | None = None
) -> str:
    nbytes = float(section["bytes_per_step"])
    exposed = float(section["exposed_s_per_step"]) if exposed is None else exposed
    at_slow_link = nbytes * 8 / SLOW_LINK_BITS_PER_S
    overlap = (
        "let DDP overlap more (bucket_cap_mb smaller so the first buckets start earlier, or larger to cut "
        "per-call latency) and take synchronous collectives out of the step (a loss all_reduce or "
        ".item() every step: do them every N steps)"
    )
    if at_slow_link < BANDWIDTH_SHARE * exposed:
        return (
            f"the step exchanges {nbytes / 2**10:.0f} KiB, which even a 1 Gbit/s link moves in "
            f"{1000 * at_slow_link:.2f} ms of the {1000 * exposed:.1f} ms the loop waits: the wait is the "
            "collectives' per-call latency and ranks arriving at them at different times, not bandwidth. "
            f"{overlap[0].upper() + overlap[1:]}; make the work even across ranks (see communication.per_rank "
            "wait_s and the straggler finding)"
        )
    if sharded:
        fix = (
            f"cut or hide the {nbytes / 2**20:.1f} MiB exchanged per step: FSDP all-gathers each unit's "
            "parameters before its forward (and again before its backward) and reduce-scatters its "
            "gradients; keep the last units unsharded after forward (reshard_after_forward=False), prefetch "
            "further ahead (set_modules_to_forward_prefetch / set_modules_to_backward_prefetch), all-gather "
            "in bf16 (MixedPrecisionPolicy(param_dtype=torch.bfloat16)), take synchronous collectives such "
            "as a loss all_reduce or .item() out of every step, use a larger batch per rank so compute "
            "hides the same traffic"
        )
    else:
        fix = (
            f"cut or hide the {nbytes / 2**20:.1f} MiB exchanged per step: {overlap}; compress gradients "
            "(DDP comm hooks fp16_compress_hook/bf16 or PowerSGD); use a larger batch per rank so compute "
            "hides the same traffic"
        )
    if hosts > 1:
        fix += (
            ", or a faster network between the hosts (see `holoprof whatif RUN` for the bandwidth it needs)"
        )
    return fix
