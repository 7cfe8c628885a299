"""The report document (``holoprof.report/1``): every analysis of a run, as one JSON-able dict.

Sections that have no data are present and empty (``{}`` or ``[]``), never missing, so scripts can
rely on the keys. Presenters (terminal, JSON, HTML, dashboard) render this document; they compute
nothing themselves.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any

from holoprof import model
from holoprof.analyze import findings as findings_mod
from holoprof.analyze.compute import with_headroom
from holoprof.analyze.engine import Aggregation, DuckDBEngine, Engine, aggregate
from holoprof.analyze.engine_dask import DaskEngine, client
from holoprof.analyze.input_model import measure, pipeline_model
from holoprof.analyze.resources import Resources, host_spread, hosts_doc, resources
from holoprof.analyze.steps import (
    NS,
    PhaseStat,
    ProcKey,
    StepStats,
    counted_all,
    counted_loop,
    loader_config,
    outside_steps,
    parse_counts,
    step_processes,
    step_stats,
    with_counts,
)
from holoprof.analyze.sweep import measured_gain
from holoprof.errors import HoloprofError
from holoprof.store.reader import Run


def _kept_total(ph: PhaseStat) -> float:
    return ph.total_s if ph.kept_total_s is None else ph.kept_total_s


#: The figures of ``steps`` and ``phases`` that are exact counts when spans were dropped (the agent
#: counts them beside its span buffer); the others are taken over the kept steps only.
COUNTED_FIGURES = (
    "steps.count",
    "steps.total_s",
    "steps.mean_s",
    "steps.per_s",
    "steps.epochs",
    "phases.fraction",
    "phases.total_s",
    "outside_steps",
)
KEPT_FIGURES = (
    "steps.median_s",
    "steps.p90_s",
    "steps.timeline",
    "phases.median_s",
    "phases.median_share",
    "phases.steps",
    "phases.per_occurrence_s",
)


def _sources(st: StepStats | None) -> dict[str, str]:
    """Where each figure comes from: ``counters`` (the agent's exact counts, when spans were
    dropped) or ``spans`` (the kept spans; every figure when none was dropped)."""
    exact = st is not None and st.exact
    return {k: "counters" if exact else "spans" for k in COUNTED_FIGURES} | dict.fromkeys(
        KEPT_FIGURES, "spans"
    )


def _phases_doc(st: StepStats | None) -> dict[str, Any]:
    if st is None:
        return {
            p: {
                "fraction": 0.0,
                "total_s": 0.0,
                "median_s": 0.0,
                "median_share": 0.0,
                "steps": 0,
                "per_occurrence_s": 0.0,
            }
            for p in model.PHASES
        }
    doc = {
        p: {
            "fraction": round(st.phases[p].fraction, 6),
            "total_s": round(st.phases[p].total_s, 6),
            "median_s": round(st.phases[p].median_s, 6),
            "median_share": round(st.phases[p].median_share, 6),
            # a phase of a few steps only (eval, checkpoint) has a median of 0: its time where it occurs
            # (in the kept steps, when total_s is an exact count over all of them)
            "steps": st.phases[p].steps,
            "per_occurrence_s": round(_kept_total(st.phases[p]) / st.phases[p].steps, 6)
            if st.phases[p].steps
            else 0.0,
        }
        for p in model.PHASES
    }
    if st.total_s > 0:  # rounding must not break "the phases sum to 100%": `other` takes the residue
        rest = sum(v["fraction"] for k, v in doc.items() if k != "other")
        if rest <= 1.0:
            doc["other"]["fraction"] = 1.0 - rest
        else:  # the rounded phases overshoot by a rounding unit: take it off the largest one
            doc["other"]["fraction"] = 0.0
            largest = max((k for k in doc if k != "other"), key=lambda k: doc[k]["fraction"])
            doc[largest]["fraction"] -= rest - 1.0
    return doc


#: Steps per process (the process table's ``steps``).
_STEP_COUNTS = Aggregation(
    name="process-steps",
    table="spans",
    columns=("host", "pid", "kind"),
    chunk="SELECT host, pid, count(*) AS n FROM {t} WHERE kind = 'step' GROUP BY host, pid",
    combine="SELECT host, pid, CAST(sum(n) AS BIGINT) AS n FROM {t} GROUP BY host, pid",
    order="host, pid",
)


def _collector_notes(processes: list[dict[str, Any]]) -> list[str]:
    """What collectors said they could not measure, once each, in the order the processes started."""
    return list(dict.fromkeys(n for p in processes for n in p["notes"]))


def _processes(run: Run, ctx: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    steps = {(str(h), int(p)): int(n) for h, p, n in aggregate(run, ctx, _STEP_COUNTS)}
    rows = run.rows(
        """SELECT host, pid, ppid, role, rank, local_rank, world_size, argv, start_ns,
                  end_ns, exit_code, dropped_events, errors, info, counters
           FROM processes WHERE role IS DISTINCT FROM 'launcher' ORDER BY start_ns, pid"""
    )
    out = []
    for h, pid, ppid, role, rank, lrank, world, argv, s, e, code, dropped, errs, info, counters in rows:
        nsteps = steps.get((str(h), int(pid)), 0)
        exact = parse_counts(counters) if dropped and isinstance(counters, str) else None
        if exact is not None:  # spans were dropped: the agent's exact count
            nsteps = max(nsteps, exact.steps)
        try:
            args = json.loads(argv) if argv else []
        except ValueError:
            args = []
        try:
            errors = json.loads(errs) if errs else []
        except ValueError:
            errors = []
        traced = bool(info and '"source": "agent"' in info)
        try:
            notes = [str(n) for n in (json.loads(info).get("notes") or [])] if traced else []
        except (ValueError, AttributeError, TypeError):
            notes = []
        out.append(
            {
                "host": h,
                "pid": int(pid),
                "ppid": int(ppid) if ppid is not None else -1,
                "role": role,
                "rank": int(rank) if rank is not None else -1,
                "local_rank": int(lrank) if lrank is not None else -1,
                "world_size": int(world) if world is not None else -1,
                "argv": args,
                "start_ns": int(s or 0),
                "end_ns": int(e or 0),
                "exit_code": int(code) if code is not None else -1,
                "traced": traced,
                "steps": int(nsteps or 0),
                "dropped_events": int(dropped or 0),
                "errors": errors,
                "notes": notes,
            }
        )
    return out


def _launcher_losses(run: Run) -> tuple[int, list[str]]:
    """Events dropped and errors (a resource sampler turned off) of ``holoprof run`` itself."""
    dropped, errors = 0, []
    rows = run.rows("SELECT host, pid, dropped_events, errors FROM processes WHERE role = 'launcher'")
    for h, pid, n, errs in rows:
        dropped += int(n or 0)
        try:
            found = json.loads(errs) if errs else []
        except ValueError:
            found = []
        errors += [f"{h}-{pid} (holoprof run): {e}" for e in found if isinstance(e, str)]
    return dropped, errors


def _resources_doc(res: Resources, processes: list[dict[str, Any]]) -> dict[str, Any]:
    """The job-wide samples (the hosts combined at each instant: ``job.*`` summed, ``host.*`` and
    ``gpu.*`` averaged, as ``hosts_combined`` says), then each host's (``hosts``, with its ranks) and
    how the hosts differ (``host_spread``)."""
    doc: dict[str, Any] = {}
    for name, s in res.stats.items():
        doc[name] = {"mean": round(s.mean, 3), "max": round(s.max, 3), "last": round(s.last, 3)}
    ranks: dict[str, set[int]] = {}
    for p in processes:
        if p["rank"] >= 0:
            ranks.setdefault(str(p["host"]), set()).add(int(p["rank"]))
    return {
        "summary": doc,
        "series": {k: [[round(t, 3), round(v, 3)] for t, v in pts] for k, pts in res.series.items()},
        "hosts_combined": {"hosts": len(res.hosts), "job.*": "sum", "host.*": "mean", "gpu.*": "mean"},
        "hosts": hosts_doc(res.hosts, {h: sorted(r) for h, r in ranks.items()}),
        "host_spread": host_spread(res.hosts),
    }


#: Sections filled by their own analysis modules: key -> "module:function". Each function takes
#: ``(run, ctx)`` and returns ``(section, findings)``: the JSON-able section (``{}``/``[]`` when there is
#: no data) and a list of :class:`~holoprof.analyze.findings.Finding`. ``ctx`` carries what the core
#: analyses found (``main``: the main loop's ProcKey or None, ``steps``: its StepStats or None,
#: ``resources``, ``loader``). A section that fails is reported in run.warnings and left empty.
SECTIONS: dict[str, str] = {
    "checkpoints": "holoprof.analyze.checkpoints:checkpoints_section",
    "stages": "holoprof.analyze.stages:stages_section",
    "memory": "holoprof.analyze.memory:memory_section",
    "io": "holoprof.analyze.io:io_section",
    "communication": "holoprof.analyze.comm:communication",
    "stragglers": "holoprof.analyze.stragglers:stragglers_section",
    "device": "holoprof.analyze.report:device_section",
    "hang": "holoprof.analyze.hang:hang_section",
    "compute": "holoprof.analyze.compute:compute_section",
    "goodput": "holoprof.analyze.goodput:goodput_section",
}
SECTION_DEFAULTS: dict[str, Any] = {
    "io": {},
    "memory": {},
    "communication": {},
    "stragglers": {},
    "stages": [],
    "checkpoints": {},
    "device": {},
    "hang": {},
    "compute": {},
    "goodput": {},
}


def _extra_sections(run: Run, ctx: dict[str, Any]) -> tuple[dict[str, Any], list[Any], list[str]]:
    out: dict[str, Any] = {
        k: (v.copy() if isinstance(v, (dict, list)) else v) for k, v in SECTION_DEFAULTS.items()
    }
    found: list[Any] = []
    warnings: list[str] = []
    for key, target in SECTIONS.items():
        module_name, func_name = target.split(":")
        try:
            func = getattr(importlib.import_module(module_name), func_name)
            section, fs = func(run, ctx)
        except Exception as exc:
            warnings.append(f"the {key} analysis failed ({type(exc).__name__}: {exc}); its section is empty")
            continue
        out[key] = section
        found += fs
    return out, found, warnings


def device_section(run: Run, ctx: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """Device time per rank, split as Holistic Trace Analysis's temporal breakdown does (idle,
    compute, non-compute): known for runs imported from a profiler trace with a device timeline."""
    rows = (run.manifest.get("source") or {}).get("temporal_breakdown") or []
    return ({"temporal_breakdown": list(rows)} if rows else {}), []


def build_report(run: Run, engine: str = "duckdb", scheduler: str | None = None) -> dict[str, Any]:
    """Every analysis of ``run`` as the ``holoprof.report/1`` document.

    ``engine="dask"`` runs the analyses' scans on a Dask cluster (local, or the ``scheduler``
    address); the numbers are the same as DuckDB's.
    """
    if engine == "dask":
        with client(scheduler) as c:
            return _build(run, DaskEngine(run, c))
    if engine != "duckdb":
        raise HoloprofError(f"unknown engine {engine!r}; use duckdb (default) or dask")
    return _build(run, DuckDBEngine(run))


def _label_measured(run: Run, found: list[Any]) -> None:
    """A run made by a sweep: its input_bound gain is the one the sweep measured, with the interval."""
    ib = next((f for f in found if f.id == "input_bound"), None)
    if ib is None:
        return
    basis = measured_gain(run.path)
    if basis is not None:
        ib.gain_kind, ib.gain_basis, ib.estimated_gain = "measured", basis, basis["gain"]


def _per_rank_doc(p: ProcKey, s: StepStats) -> dict[str, Any]:
    return {
        "host": p.host,
        "pid": p.pid,
        "rank": p.rank,
        "count": s.count,
        "kept": s.kept_count,
        "median_s": round(s.median_s, 6),
        "p90_s": round(s.p90_s, 6),
        "per_s": round(s.per_s, 4),
        "phases": {k: round(v.fraction, 4) for k, v in s.phases.items()},
    }


def _core(run: Run, eng: Engine) -> dict[str, Any]:
    """What the sections build on (the report's context): the step processes, the main loop and
    its statistics, every rank's, the resources and the DataLoader's configuration."""
    procs = step_processes(run, eng)
    if not procs:  # no step span kept: the counts of a process that dropped them all, if any
        lost = counted_loop(run)
        procs = [lost] if lost is not None else []
    main: ProcKey | None = procs[0] if procs else None
    # a process that dropped spans: its exact counts replace the kept spans' (see with_counts)
    exact = counted_all(run)  # read once: a run of many ranks has as many step processes
    st = (
        with_counts(step_stats(run, main, engine=eng), exact.get((main.host, main.pid)))
        if main is not None
        else None
    )
    rank_stats: dict[ProcKey, StepStats] = {}
    if len(procs) > 1:
        for p in procs:
            s = (
                st
                if p == main
                else with_counts(
                    step_stats(run, p, timeline_points=1, engine=eng), exact.get((p.host, p.pid))
                )
            )
            assert s is not None
            rank_stats[p] = s
    return {
        "main": main,
        "steps": st,
        "resources": resources(run, engine=eng),
        "loader": loader_config(run, main) if main is not None else {},
        "step_processes": procs,
        "rank_stats": rank_stats,  # every step process's statistics (computed once, for the sections)
        "engine": eng,  # the sections run their aggregations on it
    }


def _steps_doc(ctx: dict[str, Any]) -> dict[str, Any]:
    st: StepStats | None = ctx["steps"]
    main: ProcKey | None = ctx["main"]
    return {
        "count": st.count if st else 0,
        "kept": st.kept_count if st else 0,  # the steps whose spans were kept (medians, p90, timeline)
        "sources": _sources(st),  # counters (exact counts) or spans (the kept spans), per figure
        "median_s": round(st.median_s, 6) if st else 0.0,
        "p90_s": round(st.p90_s, 6) if st else 0.0,
        "mean_s": round(st.mean_s, 6) if st else 0.0,
        "per_s": round(st.per_s, 4) if st else 0.0,
        "total_s": round(st.total_s, 6) if st else 0.0,
        "epochs": st.epochs if st and st.epochs else None,  # None: no epoch boundary was seen
        "process": {"host": main.host, "pid": main.pid, "rank": main.rank} if main else {},
        "per_rank": [_per_rank_doc(p, s) for p, s in ctx["rank_stats"].items()],
        "timeline": [{k: round(v, 6) for k, v in r.items()} for r in st.timeline] if st else [],
    }


def drop_warning(dropped: int, st: StepStats | None) -> str:
    """What the report says about dropped events (the terminal, HTML and JSON say the same)."""
    text = f"{dropped} events were dropped (buffer full or disk unwritable)"
    if st is not None and st.exact:
        exact = f"{text}: the step count, epochs and phase totals are the agent's exact counts; "
        if not st.kept_count:
            return exact + "no step's records were kept, so step percentiles and the timeline are unknown"
        return (
            f"{exact}step percentiles, the timeline and per-step medians come from the {st.kept_count} of "
            f"{st.count} steps whose records were kept"
        )
    return f"{text}; totals may be low"


def _run_doc(
    run: Run, processes: list[dict[str, Any]], res: Resources, warnings: list[str], st: StepStats | None
) -> dict[str, Any]:
    """The ``run`` section: what ran, for how long, on what, and what was lost."""
    m = run.manifest
    start, end = m.get("start_ns"), m.get("end_ns")
    if not end:
        last = (
            run.rows("SELECT max(end_ns) FROM spans")[0][0]
            or run.rows("SELECT max(ts_ns) FROM samples")[0][0]
        )
        end = last or start
    launcher_dropped, launcher_errors = _launcher_losses(run)
    dropped = sum(p["dropped_events"] for p in processes) + launcher_dropped
    unrecorded = m.get("unrecorded_dropped_events")
    if isinstance(unrecorded, int) and not isinstance(unrecorded, bool) and unrecorded > 0:
        dropped += unrecorded  # events the launcher dropped when no processes row could be written
    if isinstance(m.get("storage_error"), str):
        warnings.insert(
            0,
            f"the run directory could not be written ({m['storage_error']}): events recorded after "
            "that were dropped, so totals are low",
        )
    if dropped:
        warnings.insert(1 if isinstance(m.get("storage_error"), str) else 0, drop_warning(dropped, st))
    errors = [f"{p['host']}-{p['pid']}: {e}" for p in processes for e in p["errors"]] + launcher_errors
    ranks = sorted({p["rank"] for p in processes if p["rank"] >= 0})
    return {
        "dir": run.path,
        "name": m.get("name"),
        "command": m.get("command"),
        "knobs": (m.get("options") or {}).get("knobs") or {},
        "status": run.status,
        "exit_code": m.get("exit_code"),
        "start_ns": start,
        "duration_s": round(((end or 0) - (start or 0)) / NS, 3) if start else 0.0,
        "processes": len(processes),
        "traced_processes": sum(1 for p in processes if p["traced"]),
        "ranks": len(ranks),
        "hosts": sorted({p["host"] for p in processes}) or m.get("hosts", []),
        "host_clocks": _host_clocks(run, processes),
        "dead_hosts": list(run.dead_hosts),
        "dropped_events": dropped,
        "errors": errors,
        "warnings": list(run.warnings) + warnings + _collector_notes(processes),
        "disk_bytes": run.disk_bytes,
        "gpus": res.gpus,
    }


def gpu_present(run: Run, res: Resources, loader: dict[str, Any]) -> bool:
    """Whether the job had a GPU: NVML samples of one (``resources``), a GPU named in a process's
    record (the system sampler's ``info.gpus``), a DataLoader that fed a job with CUDA initialized
    (``gpu``), or an imported profiler trace with a device timeline."""
    if res.gpus or loader.get("gpu") or (run.manifest.get("source") or {}).get("temporal_breakdown"):
        return True
    try:
        rows = run.rows("SELECT info FROM processes WHERE info IS NOT NULL")
    except Exception:
        return False
    for (info,) in rows:
        try:
            doc = json.loads(info)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("gpus"):
            return True
    return False


def _host_clocks(run: Run, processes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each host's ranks and clock offset from the reference host (the times of the report are
    aligned by it), with its uncertainty (null: not estimated) and where it comes from."""
    hosts = sorted({p["host"] for p in processes} | set(run.clocks))
    out = []
    for h in hosts:
        c = run.clocks.get(h)
        unc = None if c is None or c.uncertainty_ns is None else round(c.uncertainty_ns / NS, 6)
        out.append(
            {
                "host": h,
                "ranks": sorted({p["rank"] for p in processes if p["host"] == h and p["rank"] >= 0}),
                "clock_offset_s": round(c.offset_ns / NS, 6) if c is not None else 0.0,
                "clock_uncertainty_s": unc,
                "clock_source": c.source if c is not None else "none",
                "clock_samples": c.samples if c is not None else 0,
            }
        )
    return out


def _build(run: Run, eng: Engine) -> dict[str, Any]:
    ctx = _core(run, eng)
    st, main, res, loader = ctx["steps"], ctx["main"], ctx["resources"], ctx["loader"]
    pipeline = None
    if main is not None and st is not None and loader:
        measured = measure(run, main, st, loader)
        pipeline = pipeline_model(measured) if measured is not None else None
    found = findings_mod.all_findings(
        st,
        res,
        loader,
        pipeline,
        imported=run.manifest.get("status") == "imported",
        gpu=gpu_present(run, res, loader),
    )
    sections, more, section_warnings = _extra_sections(run, ctx)
    failure = (sections.get("communication") or {}).get("first_failure")
    if failure:  # a dead rank matters more than anything else in the report: say it up front
        section_warnings.insert(0, str(failure.get("message")))
    found += more
    with_headroom(found)
    _label_measured(run, found)  # a sweep's run: the gain the sweep measured, with its own test
    found = findings_mod.ordered(findings_mod.measurable(found, findings_mod.gain_floor(st)))
    processes = _processes(run, ctx)
    run_doc = _run_doc(run, processes, res, section_warnings, st)
    outside = outside_steps(run, main, st, engine=eng)
    return {
        "schema": model.REPORT_SCHEMA,
        "engine": eng.name,
        "run": run_doc,
        "steps": _steps_doc(ctx),
        "phases": _phases_doc(st),
        "outside_steps": {
            "total_s": round(sum(outside.values()), 6),
            "phases": {k: round(v, 6) for k, v in outside.items()},
        },
        "resources": _resources_doc(res, processes),
        "findings": [f.to_dict() for f in found],
        **sections,
        "processes": processes,
        "cpu_count": os.cpu_count(),
    }
