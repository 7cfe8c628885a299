"""The workflow: stages, what kind each is, the resources each used, and the critical path.

A **stage** is, by default, one process of the job (``prepare.py``, ``sort``, ``train.py``), named from
its script or command and nested as the process tree is (by ``ppid``). ``holoprof.stage(name)`` spans
add explicit stages inside a process, nested by time inside it. DataLoader workers, the
multiprocessing fork server and resource tracker are helpers of the process that started them: they
count in that stage (``processes``, CPU, memory, I/O), not as stages of their own.

Resources come from the launcher's sampler (``proc.*`` samples per process, so non-Python processes
are covered too): ``cpu_s`` and ``read_bytes``/``write_bytes`` are cumulative counters read at the end
of the stage (minus their value at its start for explicit stages); ``max_rss_bytes`` is the peak of
the summed RSS of the stage's processes at one sampling instant. A process that lived less than one
sampling interval may have no samples: its resources are 0. Writes after a process's last sample
(``sort`` writes its output at the very end) show in its parent, which Linux credits with a reaped
child's I/O: ``exit_write_bytes`` is the growth of the parent's write counter when the process ended
(an upper bound: other children reaped at the same time count too), evidence for the ``prepare``
kind. ``gpu_s`` is the device time measured
with CUDA events in the stage (``None`` when nothing measured it).

Kinds, from evidence only, first match wins:

========== ================================================================================
train      training steps were recorded in the stage
evaluate   no steps; eval phases (forward passes under no_grad/inference_mode), more eval time
           than checkpoint time
checkpoint no steps; checkpoint phases (torch.save/torch.load) outweigh eval
prepare    no steps, eval or checkpoint; wrote data (storage writes, traced file writes, or writes
           credited to its parent when it ended) and ended before a train stage started
other      the rest (the shell script that drives the pipeline, tools that ran after training)
========== ================================================================================

Critical path (which stages the end-to-end time waited on), computed among siblings and then
recursively inside each stage on the path: start from the sibling that ended last; the next one back
is the sibling that ended latest at or before the current one started (a small tolerance absorbs
clock granularity); repeat until none is left. Inside a stage on the path, its children's own chain is
on the path too (the parent waited for them). A stage that overlaps one on the path ran in its shadow
and is not on it: making it faster would not shorten the run.
"""

from __future__ import annotations

import bisect
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from holoprof import model
from holoprof.analyze.engine import Aggregation, aggregate
from holoprof.analyze.io import file_rows
from holoprof.store.reader import Run

NS = 1e9
#: Two stages "touch" (one may have waited for the other) when one ends at most this long after the
#: other starts: process start times have a granularity of one clock tick (10 ms).
TOUCH_TOLERANCE_NS = 50_000_000
#: Processes that serve the process that started them; they count in its stage.
HELPER_ROLES = ("dataloader_worker", "forkserver")
_HELPER_ARGV = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "multiprocessing.semaphore")
_SHELLS = ("bash", "sh", "dash", "zsh", "ksh", "fish")
_PROC_SAMPLES = ("proc.cpu_s", "proc.rss_bytes", "proc.read_bytes", "proc.write_bytes")
#: Above this many process stages, reaped children's I/O is not looked up (one query per process).
MAX_REAP_LOOKUPS = 200

StageKind = str  # "train" | "evaluate" | "checkpoint" | "prepare" | "other"
STAGE_KINDS: tuple[str, ...] = ("train", "evaluate", "checkpoint", "prepare", "other")


@dataclass
class Stage:
    """One stage of the workflow. Times are ns since the epoch; the document gives seconds."""

    id: str
    name: str
    host: str
    pid: int  # the process of the stage (for an explicit stage: the process that marked it)
    source: str  # "process" | "span"
    start_ns: int
    end_ns: int
    parent: str | None = None
    kind: str = "other"
    pids: list[int] = field(default_factory=list)
    steps: int = 0
    cpu_s: float = 0.0
    max_rss_bytes: int = 0
    read_bytes: int = 0
    write_bytes: int = 0
    traced_write_bytes: int = 0
    exit_write_bytes: int = 0
    gpu_s: float | None = None
    eval_s: float = 0.0
    checkpoint_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    critical: bool = False
    depth: int = 0
    children: list[str] = field(default_factory=list)


@dataclass
class Workflow:
    start_ns: int
    end_ns: int
    stages: list[Stage]  # pre-order: each parent before its children, siblings by start time

    @property
    def duration_s(self) -> float:
        return max(0.0, (self.end_ns - self.start_ns) / NS)

    def critical_path(self) -> list[Stage]:
        """Stages on the critical path, in time order."""
        return sorted((s for s in self.stages if s.critical), key=lambda s: (s.start_ns, s.depth))


# --- naming ------------------------------------------------------------------------------------------
def _is_python(name: str) -> bool:
    return name.startswith("python") or name in ("pypy", "pypy3")


def _first_operand(args: list[str], skip_value: tuple[str, ...] = ()) -> int | None:
    i = 0
    while i < len(args):
        a = args[i]
        if a in skip_value:
            i += 2
            continue
        if a.startswith("-") and a != "-":
            i += 1
            continue
        return i
    return None


def process_name(argv: list[str], exe: str | None = None) -> str:
    """A short, human name for a process: its script or its command (``prepare.py``, ``sort``)."""
    if not argv:
        return os.path.basename(exe or "") or "?"
    a0 = argv[0]
    base = os.path.basename(a0)
    if a0 == "-c":  # sys.argv of `python -c ...`
        return "python -c"
    if _is_python(base):
        rest = argv[1:]
        for i, a in enumerate(rest):
            if a == "-m" and i + 1 < len(rest):
                return rest[i + 1]
            if a == "-c":
                return "python -c"
        j = _first_operand(rest, ("-W", "-X", "--check-hash-based-pycs"))
        return os.path.basename(rest[j]) if j is not None else base
    if base in _SHELLS:
        rest = argv[1:]
        if "-c" in rest:
            return f"{base} -c"
        j = _first_operand(rest, ("-o", "-O", "+O"))
        return os.path.basename(rest[j]) if j is not None else base
    if base == "__main__.py" and len(argv) > 0:  # sys.argv[0] of `python -m pkg`
        return os.path.basename(os.path.dirname(a0)) or base
    return base


# --- loading -----------------------------------------------------------------------------------------
@dataclass
class _Proc:
    host: str
    pid: int
    ppid: int
    role: str
    rank: int
    argv: list[str]
    exe: str
    start_ns: int
    end_ns: int
    sampler_only: bool
    #: the agent's own CPU time and peak RSS at the process's end (None: not recorded)
    usage: dict[str, float] | None = None


def _exit_usage(info: str | None) -> dict[str, float] | None:
    if not info or '"exit_usage"' not in info:
        return None
    try:
        u = json.loads(info).get("exit_usage")
    except (ValueError, AttributeError):
        return None
    if not isinstance(u, dict):
        return None
    return {k: float(u[k]) for k in ("cpu_s", "max_rss_bytes") if isinstance(u.get(k), (int, float))}


def _load_processes(run: Run) -> list[_Proc]:
    rows = run.rows(
        """SELECT host, pid, ppid, role, rank, argv, exe, start_ns, end_ns, info
           FROM processes ORDER BY start_ns, pid"""
    )
    out = []
    for host, pid, ppid, role, rank, argv, exe, s, e, info in rows:
        try:
            args = json.loads(argv) if argv else []
        except ValueError:
            args = []
        out.append(
            _Proc(
                host=str(host),
                pid=int(pid),
                ppid=int(ppid) if ppid is not None else -1,
                role=str(role or "child"),
                rank=int(rank) if rank is not None else -1,
                argv=[str(a) for a in args] if isinstance(args, list) else [],
                exe=str(exe or ""),
                start_ns=int(s or 0),
                end_ns=int(e or 0),
                sampler_only=model.sampler_row(info),
                usage=_exit_usage(info),
            )
        )
    return out


def _is_helper(p: _Proc) -> bool:
    if p.role in HELPER_ROLES:
        return True
    joined = " ".join(p.argv)
    return any(h in joined for h in _HELPER_ARGV)


def _sample_bounds(
    run: Run, ctx: dict[str, Any] | None = None
) -> dict[tuple[str, int], tuple[int, int, dict[str, float]]]:
    """Per measured process: first and last sample time and the maximum of each proc.* counter."""
    names = ", ".join(f"'{n}'" for n in _PROC_SAMPLES)
    rows = aggregate(
        run,
        ctx,
        Aggregation(
            name="stages-samples",
            table="samples",
            columns=("host", "target_pid", "ts_ns", "name", "value"),
            chunk=f"""SELECT host, target_pid, min(ts_ns) AS t0, max(ts_ns) AS t1,
                   max(value) FILTER (WHERE name = 'proc.cpu_s') AS c,
                   max(value) FILTER (WHERE name = 'proc.read_bytes') AS r,
                   max(value) FILTER (WHERE name = 'proc.write_bytes') AS w
                FROM {{t}} WHERE target_pid >= 0 AND name IN ({names})
                GROUP BY host, target_pid""",
            combine="""SELECT host, target_pid, min(t0) AS t0, max(t1) AS t1, max(c) AS c, max(r) AS r,
                max(w) AS w FROM {t} GROUP BY host, target_pid""",
            order="host, target_pid",
        ),
    )
    return {
        (str(h), int(p)): (
            int(t0),
            int(t1),
            {"cpu_s": float(c or 0), "read_bytes": float(r or 0), "write_bytes": float(w or 0)},
        )
        for h, p, t0, t1, c, r, w in rows
    }


def _span_facts(run: Run, ctx: dict[str, Any] | None = None) -> dict[tuple[str, int], dict[str, float]]:
    rows = aggregate(
        run,
        ctx,
        Aggregation(
            name="stages-spans",
            table="spans",
            columns=("host", "pid", "kind", "name", "start_ns", "end_ns"),
            chunk="""SELECT host, pid,
                  count(*) FILTER (WHERE kind = 'step') AS n,
                  CAST(coalesce(sum(end_ns - start_ns) FILTER (WHERE kind = 'phase' AND name = 'eval'), 0)
                       AS BIGINT) AS ev,
                  CAST(coalesce(sum(end_ns - start_ns) FILTER (
                      WHERE (kind = 'phase' AND name = 'checkpoint') OR kind = 'checkpoint'), 0) AS BIGINT) AS ck
                FROM {t} GROUP BY host, pid""",
            combine="""SELECT host, pid, CAST(sum(n) AS BIGINT) AS n, CAST(sum(ev) AS BIGINT) AS ev,
                CAST(sum(ck) AS BIGINT) AS ck FROM {t} GROUP BY host, pid""",
            order="host, pid",
        ),
    )
    return {
        (str(h), int(p)): {"steps": float(n or 0), "eval_ns": float(ev or 0), "ckpt_ns": float(ck or 0)}
        for h, p, n, ev, ck in rows
    }


def _traced_writes(run: Run, ctx: dict[str, Any] | None = None) -> dict[tuple[str, int], int]:
    """Bytes written per process according to the I/O collectors (the last snapshot of each file)."""
    out: dict[tuple[str, int], int] = {}
    for f in file_rows(run, ctx):
        out[(f.host, f.pid)] = out.get((f.host, f.pid), 0) + int(f.v["bytes_written"])
    return out


# --- building ------------------------------------------------------------------------------------------
def _ticks(run: Run, ctx: dict[str, Any] | None = None) -> dict[str, list[int]]:
    """The sampler's tick times per host (every tick records ``job.processes``)."""
    out: dict[str, list[int]] = {}
    ticks = Aggregation(
        name="stages-ticks",
        table="samples",
        columns=("host", "target_pid", "name", "ts_ns"),
        chunk="SELECT host, ts_ns FROM {t} WHERE target_pid = -1 AND name = 'job.processes'",
        order="host, ts_ns",
    )
    for h, t in aggregate(run, ctx, ticks):
        out.setdefault(str(h), []).append(int(t))
    return out


def _tick_before(ticks: list[int], t_ns: int) -> int:
    i = bisect.bisect_left(ticks, t_ns)
    return ticks[i - 1] if i > 0 else 0


def _process_stages(
    procs: list[_Proc], bounds: dict[tuple[str, int], Any], ticks: dict[str, list[int]]
) -> tuple[list[Stage], dict[tuple[str, int], tuple[str, int]]]:
    """A stage per process that is not a helper of another (helpers belong to their nearest
    non-helper ancestor), nested under its nearest ancestor that is a stage; and the owning stage's
    key of every process."""
    by_key = {(p.host, p.pid): p for p in procs}
    owner: dict[tuple[str, int], tuple[str, int]] = {}
    stages: dict[tuple[str, int], Stage] = {}
    for p in procs:
        if p.role == "launcher":
            continue
        key = _stage_owner(p, by_key)
        owner[(p.host, p.pid)] = key
        if key == (p.host, p.pid):
            stages[key] = _process_stage(p, bounds.get(key), ticks)
    for key, skey in owner.items():
        st = stages.get(skey)
        if st is not None:
            st.pids.append(key[1])
    _start_after_siblings(stages, by_key, bounds)
    _nest(stages, by_key)
    return list(stages.values()), owner


def _stage_owner(p: _Proc, by_key: dict[tuple[str, int], _Proc]) -> tuple[str, int]:
    """The key of the process whose stage ``p`` belongs to: itself, or for a helper its nearest
    ancestor that is not one (below the launcher)."""
    seen = 0
    cur = p
    while _is_helper(cur) and seen < 64:
        parent = by_key.get((cur.host, cur.ppid))
        if parent is None or parent.role == "launcher":
            break
        cur = parent
        seen += 1
    return (cur.host, cur.pid)


def _process_stage(p: _Proc, b: Any, ticks: dict[str, list[int]]) -> Stage:
    """The stage of process ``p``, over its lifetime widened to its samples' bounds ``b``."""
    start, end = p.start_ns, p.end_ns
    if b is not None:
        if p.sampler_only:
            # psutil's create_time rests on the boot time in whole seconds: it can be up to 1 s
            # early. The process started after the last sampler tick that did not see it.
            start = max(start, _tick_before(ticks.get(p.host, []), b[0]))
        else:
            start = min(start, b[0]) if start else b[0]
        end = max(end, b[1])
    name = process_name(p.argv, p.exe)
    if p.role == "rank" and p.rank >= 0:
        name = f"{name} [rank {p.rank}]" if name != "python -c" else f"rank {p.rank}"
    return Stage(
        id=f"{p.host}-{p.pid}",
        name=name,
        host=p.host,
        pid=p.pid,
        source="process",
        start_ns=start,
        end_ns=max(end, start),
    )


def _start_after_siblings(
    stages: dict[tuple[str, int], Stage],
    by_key: dict[tuple[str, int], _Proc],
    bounds: dict[tuple[str, int], Any],
) -> None:
    """A process only the sampler saw started between the last tick that did not see it and the first
    that did. A sibling that ended inside that window most likely ran before it (a script runs its
    commands one after another): start it there rather than at the tick, which could overlap it."""
    for key, st in stages.items():
        p = by_key[key]
        b = bounds.get(key)
        if not p.sampler_only or b is None:
            continue
        ends = [
            o.end_ns
            for okey, o in stages.items()
            if okey != key
            and by_key[okey].ppid == p.ppid
            and okey[0] == key[0]
            and st.start_ns < o.end_ns <= b[0]
        ]
        if ends:
            st.start_ns = min(max(ends), st.end_ns)


def _nest(stages: dict[tuple[str, int], Stage], by_key: dict[tuple[str, int], _Proc]) -> None:
    """Nesting: each stage's parent is the nearest ancestor process that is a stage."""
    for key, st in stages.items():
        p = by_key[key]
        cur = by_key.get((p.host, p.ppid))
        hops = 0
        while cur is not None and hops < 256:
            pk = (cur.host, cur.pid)
            if pk in stages and pk != key:
                st.parent = stages[pk].id
                break
            cur = by_key.get((cur.host, cur.ppid))
            hops += 1


def _span_stages(
    run: Run,
    process_stage: dict[tuple[str, int], Stage],
    owner: dict[tuple[str, int], tuple[str, int]],
    ctx: dict[str, Any] | None = None,
) -> list[Stage]:
    rows = aggregate(
        run,
        ctx,
        Aggregation(
            name="stages-stage-spans",
            table="spans",
            columns=("host", "pid", "span_id", "kind", "name", "start_ns", "end_ns"),
            chunk="SELECT host, pid, span_id, name, start_ns, end_ns FROM {t} WHERE kind = 'stage'",
            order="host, pid, start_ns, end_ns DESC, span_id, name",
        ),
    )
    out: list[Stage] = []
    open_by_proc: dict[tuple[str, int], list[Stage]] = {}
    for host, pid, sid, name, s, e in rows:
        key = (str(host), int(pid))
        st = Stage(
            id=f"{host}-{pid}/{sid}",
            name=str(name),
            host=str(host),
            pid=int(pid),
            source="span",
            start_ns=int(s),
            end_ns=max(int(e), int(s)),
            pids=[int(pid)],
        )
        stack = open_by_proc.setdefault(key, [])
        while stack and stack[-1].end_ns < st.end_ns:
            stack.pop()
        if stack:
            st.parent = stack[-1].id
        else:
            ps = process_stage.get(owner.get(key, key))  # a helper's stages belong to its owner
            st.parent = ps.id if ps is not None else None
        stack.append(st)
        out.append(st)
    return out


def _window_metrics(run: Run, st: Stage) -> None:
    """Resources and step facts of an explicit stage: its process, within its time window."""
    row = _q(
        run,
        """SELECT
             arg_max(value, ts_ns) FILTER (WHERE name = 'proc.cpu_s' AND ts_ns <= $e),
             arg_max(value, ts_ns) FILTER (WHERE name = 'proc.cpu_s' AND ts_ns <= $s),
             arg_max(value, ts_ns) FILTER (WHERE name = 'proc.read_bytes' AND ts_ns <= $e),
             arg_max(value, ts_ns) FILTER (WHERE name = 'proc.read_bytes' AND ts_ns <= $s),
             arg_max(value, ts_ns) FILTER (WHERE name = 'proc.write_bytes' AND ts_ns <= $e),
             arg_max(value, ts_ns) FILTER (WHERE name = 'proc.write_bytes' AND ts_ns <= $s),
             max(value) FILTER (WHERE name = 'proc.rss_bytes' AND ts_ns BETWEEN $s AND $e)
           FROM samples WHERE host = $host AND target_pid = $pid""",
        {"host": st.host, "pid": st.pid, "s": st.start_ns, "e": st.end_ns},
    )[0]

    def delta(a: Any, b: Any) -> float:
        return max(0.0, float(a or 0) - float(b or 0))

    st.cpu_s = delta(row[0], row[1])
    st.read_bytes = int(delta(row[2], row[3]))
    st.write_bytes = int(delta(row[4], row[5]))
    st.max_rss_bytes = int(row[6] or 0)
    facts = _q(
        run,
        """SELECT count(*) FILTER (WHERE kind = 'step' AND start_ns >= $s AND end_ns <= $e),
                  coalesce(sum(least(end_ns, $e) - greatest(start_ns, $s))
                           FILTER (WHERE kind = 'phase' AND name = 'eval'), 0),
                  coalesce(sum(least(end_ns, $e) - greatest(start_ns, $s))
                           FILTER (WHERE (kind = 'phase' AND name = 'checkpoint') OR kind = 'checkpoint'), 0)
           FROM spans WHERE host = $host AND pid = $pid AND end_ns > $s AND start_ns < $e""",
        {"host": st.host, "pid": st.pid, "s": st.start_ns, "e": st.end_ns},
    )[0]
    st.steps = int(facts[0] or 0)
    st.eval_s = float(facts[1] or 0) / NS
    st.checkpoint_s = float(facts[2] or 0) / NS


def _exit_writes(run: Run, p: _Proc, last_ns: int) -> int:
    """Storage writes seen in the parent when the process ended (an upper bound of its own).

    Linux adds a child's lifetime I/O counters to its parent's when the parent reaps it, so the growth
    of the parent's write counter from the child's last sample to the next tick covers what the child
    wrote after its last sample (``sort`` writes its output at the very end) — and what any other
    child reaped in that interval wrote. Evidence that the stage wrote data, not a measurement of it.
    """
    if p.ppid <= 0:
        return 0
    row = _q(
        run,
        """SELECT arg_max(value, ts_ns) FILTER (WHERE ts_ns <= $t), arg_min(value, ts_ns) FILTER (WHERE ts_ns > $t)
           FROM samples WHERE host = $host AND target_pid = $ppid AND name = 'proc.write_bytes'""",
        {"host": p.host, "ppid": p.ppid, "t": last_ns},
    )[0]
    if row[0] is None or row[1] is None:
        return 0
    return int(max(0.0, float(row[1]) - float(row[0])))


def _rss_peaks(run: Run, stages: list[Stage]) -> dict[str, int]:
    """Per process stage: the peak, over sampling instants, of the summed RSS of its processes."""
    pairs = [(st.host, pid, i) for i, st in enumerate(stages) for pid in st.pids]
    if not pairs:
        return {}
    values = ", ".join(f"({_sql_str(h)}, {int(p)}, {i})" for h, p, i in pairs)
    rows = run.rows(
        f"""WITH m(host, pid, idx) AS (VALUES {values}),
                 t AS (SELECT m.idx, s.ts_ns, sum(s.value) AS v FROM samples s
                       JOIN m ON s.host = m.host AND s.target_pid = m.pid
                       WHERE s.name = 'proc.rss_bytes' GROUP BY m.idx, s.ts_ns)
            SELECT idx, max(v) FROM t GROUP BY idx"""
    )
    return {stages[int(i)].id: int(v or 0) for i, v in rows}


def _q(run: Run, sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """A query with named parameters ($name)."""
    rows: list[tuple[Any, ...]] = run.con.execute(sql, params).fetchall()
    return rows


def _sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _gpu_by_process(run: Run, ctx: dict[str, Any] | None = None) -> dict[tuple[str, int], float]:
    """Device seconds measured with CUDA events, per process that measured any."""
    rows = aggregate(
        run,
        ctx,
        Aggregation(
            name="stages-gpu",
            table="samples",
            columns=("host", "target_pid", "name", "value"),
            chunk="""SELECT host, target_pid, sum(value) AS v FROM {t}
                WHERE name LIKE 'cuda.%_ms' AND target_pid >= 0 GROUP BY host, target_pid""",
            combine="SELECT host, target_pid, sum(v) AS v FROM {t} GROUP BY host, target_pid",
            order="host, target_pid",
        ),
    )
    return {(str(h), int(p)): float(v or 0) / 1000.0 for h, p, v in rows}


def _gpu_seconds(run: Run, st: Stage, by_process: dict[tuple[str, int], float]) -> float | None:
    measured = [(st.host, pid) for pid in st.pids if (st.host, pid) in by_process]
    if not measured:
        return None
    if st.source == "process":
        return sum(by_process[k] for k in measured)
    row = _q(
        run,
        """SELECT sum(value) FROM samples
           WHERE host = $host AND target_pid = $pid AND name LIKE 'cuda.%_ms' AND ts_ns BETWEEN $s AND $e""",
        {"host": st.host, "pid": st.pid, "s": st.start_ns, "e": st.end_ns},
    )[0]
    return float(row[0] or 0) / 1000.0


def _stage_phases(run: Run, st: Stage) -> dict[str, float]:
    """Seconds per phase inside the stage's training steps (``other``: the rest of the steps)."""
    with run.lean_memory():  # a join over every step of the stage: its hash table spills
        return _stage_phases_query(run, st)


def _stage_phases_query(run: Run, st: Stage) -> dict[str, float]:
    rows = _q(
        run,
        """WITH st AS (SELECT step, start_ns AS s, end_ns AS e FROM spans
                       WHERE kind = 'step' AND host = $host AND pid = $pid
                         AND start_ns >= $ws AND end_ns <= $we),
                tid AS (SELECT mode(tid) AS t FROM spans
                        WHERE kind = 'step' AND host = $host AND pid = $pid)
           SELECT p.name, sum(least(p.end_ns, st.e) - greatest(p.start_ns, st.s))
           FROM spans p JOIN st ON p.step = st.step
           WHERE p.kind = 'phase' AND p.host = $host AND p.pid = $pid AND p.tid = (SELECT t FROM tid)
             AND p.end_ns > st.s AND p.start_ns < st.e
           GROUP BY p.name""",
        {"host": st.host, "pid": st.pid, "ws": st.start_ns, "we": st.end_ns},
    )
    total = _q(
        run,
        """SELECT coalesce(sum(end_ns - start_ns), 0) FROM spans
           WHERE kind = 'step' AND host = $host AND pid = $pid AND start_ns >= $ws AND end_ns <= $we""",
        {"host": st.host, "pid": st.pid, "ws": st.start_ns, "we": st.end_ns},
    )[0][0]
    measured = {str(n): float(d or 0) for n, d in rows if str(n) in model.MEASURED_PHASES}
    total_ns = float(total or 0)
    s = sum(measured.values())
    if s > total_ns > 0:  # overlapping records: scale down so that the phases sum to the steps
        measured = {k: v * total_ns / s for k, v in measured.items()}
        s = total_ns
    out = {p: round(measured.get(p, 0.0) / NS, 6) for p in model.MEASURED_PHASES}
    out["other"] = round(max(0.0, total_ns - s) / NS, 6)
    return out


def _step_loops(loop: Any, ctx: dict[str, Any] | None) -> dict[tuple[str, int], Any]:
    """Every step process's statistics that the report has already (one scan per rank), by (host, pid):
    the main loop's and, in a job of several ranks, each rank's."""
    loops = {(s.proc.host, s.proc.pid): s for s in ((ctx or {}).get("rank_stats") or {}).values()}
    if loop is not None:
        loops[(loop.proc.host, loop.proc.pid)] = loop
    return loops


def _loop_phases(st: Stage, loop: Any) -> dict[str, float] | None:
    """The stage's phases from the step analysis, when the stage is the main loop's process and
    holds every one of its steps (else None). Phases are scaled per step there (a step whose records
    overlap), as in the report's phase breakdown."""
    if loop is None or (st.host, st.pid) != (loop.proc.host, loop.proc.pid) or st.steps != loop.count:
        return None
    if not (st.start_ns <= loop.first_start_ns and loop.last_end_ns <= st.end_ns):
        return None
    return {
        p: round(loop.phases[p].total_s, 6) for p in (*model.MEASURED_PHASES, "other") if p in loop.phases
    }


def classify(st: Stage, first_train_start_ns: int | None) -> str:
    """The kind of a stage, from the evidence recorded in it (see the module docstring)."""
    if st.steps > 0:
        return "train"
    if st.eval_s > 0 or st.checkpoint_s > 0:
        return "evaluate" if st.eval_s >= st.checkpoint_s else "checkpoint"
    wrote = st.write_bytes > 0 or st.traced_write_bytes > 0 or st.exit_write_bytes > 0
    if wrote and first_train_start_ns is not None and st.end_ns <= first_train_start_ns + TOUCH_TOLERANCE_NS:
        return "prepare"
    return "other"


def mark_critical(stages: list[Stage]) -> None:
    """Mark the stages the end-to-end time waited on (see the module docstring)."""
    by_parent: dict[str | None, list[Stage]] = {}
    for st in stages:
        by_parent.setdefault(st.parent, []).append(st)

    def chain(siblings: list[Stage]) -> None:
        remaining = sorted(siblings, key=lambda s: (s.end_ns, s.start_ns))
        if not remaining:
            return
        cur: Stage | None = remaining[-1]
        while cur is not None:
            cur.critical = True
            chain(by_parent.get(cur.id, []))
            limit = cur.start_ns + TOUCH_TOLERANCE_NS
            before = [s for s in remaining if s is not cur and not s.critical and s.end_ns <= limit]
            cur = max(before, key=lambda s: (s.end_ns, s.start_ns)) if before else None

    chain(by_parent.get(None, []))


_DIGITS = re.compile(r"(\d+)")


def _natural(text: str) -> tuple[tuple[int, int | str], ...]:
    """A sort key that orders numbers inside names by value: ``darshan-2`` before ``darshan-10``."""
    parts = _DIGITS.split(text)
    return tuple((0, int(p)) if i % 2 else (1, p) for i, p in enumerate(parts) if p)


def _order(stages: list[Stage]) -> list[Stage]:
    by_parent: dict[str | None, list[Stage]] = {}
    ids = {s.id for s in stages}
    for st in stages:
        if st.parent is not None and st.parent not in ids:
            st.parent = None
        by_parent.setdefault(st.parent, []).append(st)
    out: list[Stage] = []

    def walk(parent: str | None, depth: int) -> None:
        for st in sorted(by_parent.get(parent, []), key=lambda s: (s.start_ns, s.end_ns, _natural(s.id))):
            st.depth = depth
            out.append(st)
            walk(st.id, depth + 1)

    walk(None, 0)
    for parent, children in by_parent.items():
        if parent is None:
            continue
        for st in out:
            if st.id == parent:
                st.children = [c.id for c in sorted(children, key=lambda s: (s.start_ns, _natural(s.id)))]
    return out


def workflow(run: Run, loop: Any = None, ctx: dict[str, Any] | None = None) -> Workflow:
    """Every stage of the run, classified, with its resources and its place on the critical path.

    ``loop``: the main training loop's step statistics when the report has them already
    (``analyze.steps.StepStats``); the stage that holds all of its steps takes its phases from them
    instead of joining every step again. ``ctx``: the report's context; under ``--engine dask`` the
    scans of whole tables run on the cluster (the queries of one stage's window stay on DuckDB)."""
    procs = _load_processes(run)
    bounds = _sample_bounds(run, ctx)
    facts = _span_facts(run, ctx)
    writes = _traced_writes(run, ctx)
    proc_stages, owner = _process_stages(procs, bounds, _ticks(run, ctx))
    by_key = {(s.host, s.pid): s for s in proc_stages}
    # A parent seen only by the sampler has no recorded end; it waited for its children (the shell
    # of a pipeline), so it lasts at least until they ended.
    proc_by_key = {(p.host, p.pid): p for p in procs}
    stage_by_id = {s.id: s for s in proc_stages}
    for _ in range(64):
        changed = False
        for st in proc_stages:
            parent = stage_by_id.get(st.parent) if st.parent else None
            if parent is None:
                continue
            pp = proc_by_key.get((parent.host, parent.pid))
            if pp is not None and pp.sampler_only and pp.end_ns == 0 and parent.end_ns < st.end_ns:
                parent.end_ns = st.end_ns
                changed = True
        if not changed:
            break
    for st in proc_stages:
        for pid in st.pids:
            f = facts.get((st.host, pid), {})
            st.steps += int(f.get("steps", 0))
            st.eval_s += f.get("eval_ns", 0.0) / NS
            st.checkpoint_s += f.get("ckpt_ns", 0.0) / NS
            b = bounds.get((st.host, pid))
            pp = proc_by_key.get((st.host, pid))
            own_cpu = pp.usage.get("cpu_s", 0.0) if pp is not None and pp.usage else 0.0
            # the sampler's last reading, or the process's own count at its end (a process shorter
            # than one sampler tick has no sample at all)
            st.cpu_s += max(b[2]["cpu_s"] if b is not None else 0.0, own_cpu)
            if b is not None:
                st.read_bytes += int(b[2]["read_bytes"])
                st.write_bytes += int(b[2]["write_bytes"])
                if pp is not None and pid == st.pid and len(proc_stages) <= MAX_REAP_LOOKUPS:
                    st.exit_write_bytes = _exit_writes(run, pp, b[1])
            st.traced_write_bytes += writes.get((st.host, pid), 0)
    peaks = _rss_peaks(run, proc_stages)
    for st in proc_stages:
        own = [proc_by_key[(st.host, p)].usage for p in st.pids if (st.host, p) in proc_by_key]
        own_rss = max((int(u.get("max_rss_bytes", 0)) for u in own if u), default=0)
        st.max_rss_bytes = max(peaks.get(st.id, 0), own_rss)
    span_stages = _span_stages(run, by_key, owner, ctx)
    for st in span_stages:
        _window_metrics(run, st)
    stages = proc_stages + span_stages
    gpu = _gpu_by_process(run, ctx)
    loops = _step_loops(loop, ctx)  # each step process's phases, when the report has them
    for st in stages:
        st.gpu_s = _gpu_seconds(run, st, gpu)
        if st.steps > 0:
            st.phases = _loop_phases(st, loops.get((st.host, st.pid))) or _stage_phases(run, st)
    train_starts = [s.start_ns for s in stages if s.steps > 0]
    first_train = min(train_starts) if train_starts else None
    for st in stages:
        st.kind = classify(st, first_train)
    m = run.manifest
    start = int(m.get("start_ns") or 0) or min((s.start_ns for s in stages), default=0)
    sampled = {(p.host, p.pid) for p in procs if p.sampler_only}
    for st in stages:
        if st.source == "process" and (st.host, st.pid) in sampled and st.start_ns < start:
            st.start_ns = min(start, st.end_ns)  # seen by the launcher: it cannot predate the run
    end = int(m.get("end_ns") or 0) or max((s.end_ns for s in stages), default=start)
    stages = _order(stages)
    mark_critical(stages)
    return Workflow(start_ns=start, end_ns=max(end, start), stages=stages)


# --- the report section ------------------------------------------------------------------------------
def stage_doc(st: Stage, wf: Workflow) -> dict[str, Any]:
    wall = max(0.0, (st.end_ns - st.start_ns) / NS)
    total = wf.duration_s
    d = {
        "id": st.id,
        "name": st.name,
        "kind": st.kind,
        "parent": st.parent,
        "depth": st.depth,
        "source": st.source,
        "host": st.host,
        "pid": st.pid,
        "start_s": round((st.start_ns - wf.start_ns) / NS, 6),
        "end_s": round((st.end_ns - wf.start_ns) / NS, 6),
        "wall_s": round(wall, 6),
        "processes": len(st.pids),
        "pids": list(st.pids),
        "steps": st.steps,
        "cpu_s": round(st.cpu_s, 3),
        "max_rss_bytes": st.max_rss_bytes,
        "read_bytes": st.read_bytes,
        "write_bytes": st.write_bytes,
        "traced_write_bytes": st.traced_write_bytes,
        "exit_write_bytes": st.exit_write_bytes,
        "gpu_s": None if st.gpu_s is None else round(st.gpu_s, 6),
        "eval_s": round(st.eval_s, 6),
        "checkpoint_s": round(st.checkpoint_s, 6),
        "share": round(min(1.0, wall / total), 4) if total > 0 else 0.0,
        "critical": st.critical,
        "phases": dict(st.phases) if st.kind == "train" else {},
    }
    return d


def stages_section(run: Run, ctx: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    """The ``stages`` section of the report: one entry per stage, parents before children."""
    wf = workflow(run, ctx.get("steps"), ctx)
    return [stage_doc(s, wf) for s in wf.stages], []
