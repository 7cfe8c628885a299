"""``torch.compile`` in the report: compile time, graph breaks, recompilations, and their findings.

From the compile collector's spans (:mod:`holoprof.collect.compile`) of the main loop's process:
``compile`` (each compilation, with its trigger), ``graph_break`` and ``recompile`` (Dynamo's own
records). Graph breaks and recompilations are grouped by reason and the user's source line, each with
how many times Dynamo hit it.

Findings: ``graph_breaks`` names each break with Dynamo's own hints (its gain is not modelled: what
a break costs is the fusion lost across it, which a sweep measures); ``recompiles`` names the guards
that failed, with the time the recompilations inside the training steps took as its gain (measured in
this run: one outside them, such as an evaluation after training recompiling for ``no_grad``, costs no
step anything, and alone fires nothing), and says when a frame reached Dynamo's ``recompile_limit``
(from then on that frame runs eagerly: shown whatever its gain, at low severity when that gain is below
the floor, since the eager steps' cost is not measured).
"""

from __future__ import annotations

import json
from typing import Any

from holoprof.analyze.engine import Aggregation, aggregate
from holoprof.analyze.findings import Finding
from holoprof.analyze.steps import NS, ProcKey, StepStats
from holoprof.store.reader import Run

#: Dynamo's default ``torch._dynamo.config.recompile_limit`` (the run records the job's own).
RECOMPILE_LIMIT = 8
#: Rows of each list kept in the report.
MAX_ROWS = 50
#: Dynamo hints that say what a break is, not how to avoid it (kept in the section, not in the fix).
_NOT_A_FIX = (
    "This graph break is fundamental",
    "Please report an issue",
    "It may be possible to write Dynamo",
)


def _rows_agg(proc: ProcKey) -> Aggregation:
    return Aggregation(
        name="compile-records",
        table="spans",
        columns=("host", "pid", "kind", "name", "start_ns", "end_ns", "step", "attrs"),
        chunk="""SELECT name, step, start_ns, end_ns, attrs FROM {t}
                 WHERE kind = 'op' AND name IN ('compile', 'graph_break', 'recompile') AND host = $host AND pid = $pid""",
        order="start_ns, name, step, end_ns, attrs",
        params={"host": proc.host, "pid": proc.pid},
        pids=(proc.pid,),
    )


def _attrs(raw: Any) -> dict[str, Any]:
    try:
        a = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return a if isinstance(a, dict) else {}


def compile_doc(run: Run, ctx: dict[str, Any], proc: ProcKey) -> dict[str, Any]:
    """The ``compute.compile`` section of ``proc``; {} when it compiled nothing."""
    total = 0
    by_trigger: dict[str, float] = {}
    by_step: dict[int, float] = {}
    outside: dict[str, float] = {}
    window = _window(ctx.get("steps"), proc)
    by_id: dict[str, float] = {}
    in_steps_by_id: dict[str, float] = {}  # of each compilation, the seconds inside the training steps
    compiles = 0
    breaks: dict[tuple[str, str], dict[str, Any]] = {}
    recompiles: dict[tuple[str, str], dict[str, Any]] = {}
    for name, step, s, e, raw in aggregate(run, ctx, _rows_agg(proc)):
        a = _attrs(raw)
        if name == "compile":
            d = max(0, int(e) - int(s))
            total += d
            trig = str(a.get("trigger") or "?")
            by_trigger[trig] = by_trigger.get(trig, 0.0) + d / NS
            where = _outside(int(s), window)
            cid = str(a.get("compile_id") or "")
            if where:
                outside[where] = outside.get(where, 0.0) + d / NS
            else:
                by_step[int(step)] = by_step.get(int(step), 0.0) + d / NS
                in_steps_by_id[cid] = in_steps_by_id.get(cid, 0.0) + d / NS
            by_id[cid] = by_id.get(cid, 0.0) + d / NS
            compiles += trig == "DYNAMO"
        elif name == "graph_break":
            key = (str(a.get("reason") or ""), str(a.get("location") or ""))
            row = breaks.setdefault(
                key,
                {
                    "reason": key[0],
                    "location": key[1],
                    "code": str(a.get("code") or ""),
                    "explanation": str(a.get("explanation") or ""),
                    "hints": [str(h) for h in a.get("hints") or []],
                    "count": 0,
                },
            )
            row["count"] += 1
        elif name == "recompile":
            key = (str(a.get("reason") or ""), str(a.get("location") or ""))
            row = recompiles.setdefault(
                key,
                {
                    "reason": key[0],
                    "location": key[1],
                    "frame": str(a.get("frame") or ""),
                    "count": 0,
                    "seconds": 0.0,
                    "in_steps_s": 0.0,
                },
            )
            row["count"] += 1
            cid = str(a.get("compile_id") or "")
            row["seconds"] += by_id.get(cid, 0.0)
            row["in_steps_s"] += in_steps_by_id.get(cid, 0.0)
    if not total and not breaks and not recompiles:
        return {}
    for r in recompiles.values():
        r["seconds"] = round(r["seconds"], 6)
        r["in_steps_s"] = round(r["in_steps_s"], 6)
    return {
        "total_s": round(total / NS, 6),
        "compiles": compiles,
        "by_trigger": {k: round(v, 6) for k, v in sorted(by_trigger.items())},
        "steps": [{"step": k, "seconds": round(v, 6)} for k, v in sorted(by_step.items())][:MAX_ROWS],
        "outside_steps": {k: round(v, 6) for k, v in sorted(outside.items())},
        "graph_breaks": sorted(breaks.values(), key=lambda r: (-r["count"], r["location"], r["reason"]))[
            :MAX_ROWS
        ],
        "recompiles": sorted(recompiles.values(), key=lambda r: (-r["count"], r["location"], r["reason"]))[
            :MAX_ROWS
        ],
        "recompile_limit": _limit(run, proc),
    }


def _window(st: StepStats | None, proc: ProcKey) -> tuple[int, int] | None:
    """The main loop's first step start and last step end, when ``st`` is ``proc``'s steps."""
    if st is None or not st.count or st.proc != proc:
        return None
    return st.first_start_ns, st.last_end_ns


def _outside(start_ns: int, window: tuple[int, int] | None) -> str:
    """Where a compilation that started at ``start_ns`` ran, when outside the steps: before the first
    (a compiled warm-up) or after the last (an evaluation after training); "" inside them."""
    if window is None:
        return ""
    if start_ns < window[0]:
        return "before_first_step"
    if start_ns >= window[1]:
        return "after_last_step"
    return ""


def _limit(run: Run, proc: ProcKey) -> int:
    rows = run.rows("SELECT info FROM processes WHERE host = ? AND pid = ?", [proc.host, proc.pid])
    try:
        info = json.loads(rows[0][0]) if rows and rows[0][0] else {}
        return int((info.get("compile") or {}).get("recompile_limit") or RECOMPILE_LIMIT)
    except (ValueError, TypeError, AttributeError):
        return RECOMPILE_LIMIT


def graph_breaks_finding(doc: dict[str, Any]) -> Finding | None:
    rows = doc.get("graph_breaks") or []
    if not rows:
        return None
    top = rows[0]
    fixes = []
    for r in rows[:5]:
        hints = [h for h in r.get("hints") or [] if not h.startswith(_NOT_A_FIX)]
        fixes.append(
            f"{r['reason']} at {r['location'] or '?'}: {' / '.join(hints) or 'see torch._dynamo.explain()'}"
        )
    n = sum(int(r["count"]) for r in rows)
    return Finding(
        id="graph_breaks",
        severity="medium",
        title=f"torch.compile's graph breaks {n} time{'s' if n != 1 else ''} ({len(rows)} place"
        f"{'s' if len(rows) != 1 else ''}): {top['reason']} at {top['location'] or '?'}",
        evidence={
            "graph_breaks": n,
            "places": len(rows),
            "first_reason": top["reason"],
            "first_location": top["location"],
            "first_code": top.get("code", ""),
            "breaks": rows[:5],
        },
        recommendation="Dynamo's hints: " + "; ".join(fixes),
        estimated_gain=0.0,
        threshold={"graph_breaks_at_least": 1},
        gain_basis={
            "model": "not predicted",
            "unpriced": "a break costs the fusion lost across it and the Python run between the graphs; "
            "measure the fix with a sweep",
        },
    )


def recompiles_finding(doc: dict[str, Any], st: StepStats | None) -> Finding | None:
    rows = doc.get("recompiles") or []
    if not rows:
        return None
    n = sum(int(r["count"]) for r in rows)
    secs = sum(float(r.get("seconds") or 0) for r in rows)
    limit = int(doc.get("recompile_limit") or RECOMPILE_LIMIT)
    frames: dict[str, int] = {}
    for r in rows:
        frames[r["frame"]] = frames.get(r["frame"], 0) + int(r["count"])
    at_limit = sorted(f for f, c in frames.items() if c + 1 >= limit)
    fixes = [f"{r['reason']} at {r['location']}: {_recompile_fix(r['reason'])}" for r in rows[:5]]
    if at_limit:
        fixes.insert(
            0,
            f"frame(s) {', '.join(at_limit)} reached torch._dynamo.config.recompile_limit ({limit}): from then "
            "on they run eagerly",
        )
    # What the training loop would save: the recompilations inside its steps. One outside them (the
    # evaluation after training recompiling for no_grad) cost the job once and no step anything.
    in_steps = sum(float(r.get("in_steps_s") or 0) for r in rows)
    total = st.total_s if st is not None else 0.0
    gain = min(1.0, in_steps / total) if total > 0 else 0.0
    basis: dict[str, Any] = {
        "model": "the time the recompilations inside the training steps took in this run, over the steps' total",
        "recompile_in_steps_s": round(in_steps, 6),
        "steps_total_s": round(total, 6),
    }
    if at_limit:
        basis["unpriced"] = (
            "a frame at the recompile limit runs eagerly from then on; what that costs is not measured"
        )
    return Finding(
        id="recompiles",
        severity="high" if at_limit else "medium",
        title=f"torch.compile recompiled {n} time{'s' if n != 1 else ''} ({secs:.2f} s): {rows[0]['reason']}",
        evidence={
            "recompiles": n,
            "recompile_s": round(secs, 6),
            "recompile_in_steps_s": round(in_steps, 6),
            "frames_at_limit": at_limit,
            "recompile_limit": limit,
            "first_reason": rows[0]["reason"],
            "first_location": rows[0]["location"],
            "recompiles_detail": rows[:5],
        },
        recommendation="; ".join(fixes),
        estimated_gain=round(gain, 4),
        threshold={"recompiles_at_least": 1},
        gain_basis=basis,
    )


def _recompile_fix(reason: str) -> str:
    r = reason.lower()
    if "size mismatch" in r or "shape" in r or "stride" in r:
        return (
            "the input's shape changed: mark the dimension dynamic (torch._dynamo.mark_dynamic(x, 0)) or "
            "compile with dynamic=True, or keep batches the same size (DataLoader(drop_last=True))"
        )
    if "dtype" in r:
        return "the input's dtype changed: cast inputs to one dtype before the compiled call"
    if "==" in r or "id_match" in r or "type" in r:
        return "a Python value or object the graph was specialized on changed: pass it as a tensor or keep it constant"
    return "keep what the guard checks constant between calls (torch._dynamo.explain() shows the guards)"


def compile_findings(doc: dict[str, Any], st: StepStats | None) -> list[Finding]:
    return [f for f in (graph_breaks_finding(doc), recompiles_finding(doc, st)) if f is not None]
