"""How close the step comes to the machine's limit: FLOPs per step, achieved FLOP/s and MFU.

The FLOPs are the ones the flops collector counted on one step (:mod:`holoprof.collect.flops`, a span
``op``/``flops`` of the main loop's process). Achieved FLOP/s = FLOPs per step ÷ the mean step of the
steady state: the steps after the first :data:`~holoprof.analyze.stats.WARMUP_STEPS` (all of them in
a short run), the counted step always left out (it ran every operator through Python, so it is
slower than the others), and ``torch.compile``'s compilations in them taken out. MFU = achieved ÷ peak, with the peak's source named
(:mod:`holoprof.analyze.peaks`): a GPU's data-sheet peak for the dtype the step mostly computes in,
or the CPU's GEMM peak measured on the host that ran the job for its dtype and thread count.

The ``low_mfu`` finding lists only the changes it can back with a number: a dtype whose peak on this
device is higher (TF32 matmuls through ``torch.set_float32_matmul_precision``, bf16 autocast), a
fused optimizer where the optimizer's share of the step is large, and a larger batch where the memory
analysis found that one fits. A faster dtype's gain is the time the step's FLOPs take at the peak
rate (the step's MFU) sped up by the ratio of the peaks: a step far below its peak spends its time
elsewhere (Python, small operators, memory traffic), which a faster dtype does not shorten. The
forward and backward's whole share sped up so is the most it could be (``gain_upper_bound``).
"""

from __future__ import annotations

import json
from typing import Any

from holoprof.analyze.compile import compile_doc, compile_findings
from holoprof.analyze.engine import Aggregation, aggregate
from holoprof.analyze.findings import Finding
from holoprof.analyze.peaks import cpu_alternatives, cpu_peak, gpu_alternatives, gpu_peak, table_dtype
from holoprof.analyze.stats import WARMUP_STEPS
from holoprof.analyze.steps import ProcKey, StepStats
from holoprof.store.reader import Run
from holoprof.store.sidefiles import read_peaks

#: The step the collector counts unless told otherwise (holoprof.collect.flops.COUNT_STEP).
COUNT_STEP = 1
#: MFU below this is a ``low_mfu`` finding (low below it, medium below MEDIUM, high below HIGH).
LOW_MFU = 0.40
LOW_MFU_MEDIUM = 0.25
LOW_MFU_HIGH = 0.10
#: The optimizer's share of the step above which a fused optimizer is advised.
OPTIMIZER_SHARE = 0.10
#: Smallest gain worth naming (fraction of the step).
MIN_GAIN = 0.02


def _flops_agg(proc: ProcKey) -> Aggregation:
    """The flops spans of ``proc``."""
    return Aggregation(
        name="flops",
        table="spans",
        columns=("host", "pid", "kind", "name", "start_ns", "end_ns", "step", "attrs"),
        chunk="""SELECT step, start_ns, end_ns, attrs FROM {t}
                 WHERE kind = 'op' AND name = 'flops' AND host = $host AND pid = $pid""",
        order="start_ns, step, end_ns, attrs",
        params={"host": proc.host, "pid": proc.pid},
        pids=(proc.pid,),
    )


def _mean_step_agg(proc: ProcKey, first: int, skip: int) -> Aggregation:
    """Count and total time (ns) of ``proc``'s steps from index ``first`` on, but step ``skip``, and
    the time torch.compile compiled within them (its spans of the same index, clipped to the step)."""
    where = "host = $host AND pid = $pid AND end_ns >= start_ns AND step >= $first AND step <> $skip"
    return Aggregation(
        name="mean-step",
        table="spans",
        columns=("host", "pid", "kind", "name", "start_ns", "end_ns", "step"),
        chunk=f"""SELECT step, kind, start_ns, end_ns FROM {{t}}
                  WHERE {where} AND (kind = 'step' OR (kind = 'op' AND name = 'compile'))""",
        shuffle=("step",),
        group="""WITH st AS (SELECT step, start_ns AS s, end_ns AS e FROM {t} WHERE kind = 'step'),
                 c AS (SELECT c.step, sum(least(c.end_ns, st.e) - greatest(c.start_ns, st.s)) AS d
                       FROM {t} c JOIN st ON c.step = st.step
                       WHERE c.kind = 'op' AND c.end_ns > st.s AND c.start_ns < st.e GROUP BY c.step)
                 SELECT count(*) AS n, CAST(coalesce(sum(st.e - st.s), 0) AS BIGINT) AS ns,
                        CAST(coalesce(sum(c.d), 0) AS BIGINT) AS compile_ns
                 FROM st LEFT JOIN c USING (step)""",
        final="""SELECT CAST(coalesce(sum(n), 0) AS BIGINT) AS n, CAST(coalesce(sum(ns), 0) AS BIGINT) AS ns,
                 CAST(coalesce(sum(compile_ns), 0) AS BIGINT) AS compile_ns FROM {t}""",
        params={"host": proc.host, "pid": proc.pid, "first": first, "skip": skip},
        pids=(proc.pid,),
    )


def flop_records(run: Run, ctx: dict[str, Any] | None, proc: ProcKey) -> list[tuple[int, dict[str, Any]]]:
    """The flops spans of ``proc``: (step, attributes), in time order."""
    out = []
    for step, _s, _e, raw in aggregate(run, ctx, _flops_agg(proc)):
        try:
            a = json.loads(raw) if raw else {}
        except ValueError:
            continue
        if isinstance(a, dict):
            out.append((int(step), a))
    return out


def steady_mean_step(
    run: Run, ctx: dict[str, Any] | None, proc: ProcKey, st: StepStats, counted: int
) -> tuple[float, int]:
    """(mean step in seconds, steps it is over) of the steady state, the counted step left out and
    torch.compile's compilations in those steps taken out (they are goodput's ``compile``)."""
    first = WARMUP_STEPS if st.count >= 3 * WARMUP_STEPS + 2 else 0
    for lo in (first, 0):
        rows = aggregate(run, ctx, _mean_step_agg(proc, lo, counted))
        n, ns, comp = (
            (int(rows[0][0] or 0), int(rows[0][1] or 0), int(rows[0][2] or 0)) if rows else (0, 0, 0)
        )
        if n > 0:
            return max(0, ns - comp) / n / 1e9, n
    return 0.0, 0


def _why_missing(run: Run, st: StepStats) -> str:
    opts = run.manifest.get("options") or {}
    if opts.get("flops") == "off":
        return "FLOPs were not counted (holoprof run --flops off)"
    if st.phases["compute"].total_s > 0 and st.phases["forward"].total_s == 0:
        return (
            "FLOPs are counted for PyTorch steps; this loop's steps are fused framework calls "
            "(Keras/TensorFlow), whose cost analysis holoprof does not read: not available"
        )
    if st.count <= COUNT_STEP:
        return (
            f"the loop ran {st.count} step{'s' if st.count != 1 else ''}: FLOPs are counted on the "
            f"step with index {COUNT_STEP} (the second), which it never reached"
        )
    return "no step was counted: the loop's training forward was not seen (no torch.nn.Module call with autograd on)"


def compute_doc(run: Run, ctx: dict[str, Any]) -> dict[str, Any]:
    """The ``compute`` section without ``compile``; {} when the run has no training loop."""
    main: ProcKey | None = ctx.get("main")
    st: StepStats | None = ctx.get("steps")
    if main is None or st is None or st.count == 0:
        return {}
    recs = flop_records(run, ctx, main)
    if not recs:
        return {"why": _why_missing(run, st)}
    step, a = recs[0]
    if a.get("why"):
        return {"why": str(a["why"]), "counted_step": step}
    flops = int(a.get("flops") or 0)
    mean_s, n = steady_mean_step(run, ctx, main, st, step)
    dtype, device = str(a.get("dtype") or ""), str(a.get("device") or "cpu")
    peak, source = _peak(run, main, a)
    achieved = flops / mean_s if mean_s > 0 else 0.0
    doc: dict[str, Any] = {
        "flops_per_step": flops,
        "flops_by_phase": {k: int(v) for k, v in (a.get("by_phase") or {}).items()},
        "achieved_flops_per_s": round(achieved, 1),
        "peak_flops_per_s": round(peak, 1) if peak > 0 else None,
        "peak_source": source,
        "dtype": dtype,
        "mfu": round(achieved / peak, 6) if peak > 0 and achieved > 0 else None,
        "counted_step": step,
        "mean_step_s": round(mean_s, 6),
        "steps_in_mean": n,
        "device": device,
        "threads": int(a.get("threads") or 0),
        "matmul_precision": str(a.get("matmul_precision") or ""),
        "flops_by_dtype": {k: int(v) for k, v in (a.get("by_dtype") or {}).items()},
        "notes": _notes(a, achieved, peak),
    }
    if a.get("device_name"):
        doc["device_name"] = str(a["device_name"])
    return doc


def _peak(run: Run, proc: ProcKey, a: dict[str, Any]) -> tuple[float, str]:
    dtype, device = str(a.get("dtype") or ""), str(a.get("device") or "cpu")
    if not dtype:
        return 0.0, "the counted step ran no operator that does FLOPs (matmul, convolution, attention)"
    if device.startswith("cuda"):
        return gpu_peak(
            str(a.get("device_name") or ""),
            dtype,
            str(a.get("matmul_precision") or "highest"),
            bool(a.get("allow_tf32")),
        )
    if device == "cpu":
        return cpu_peak(read_peaks(run.path), proc.host, dtype, int(a.get("threads") or 1))
    return 0.0, f"no peak is known for device {device}"


def _notes(a: dict[str, Any], achieved: float, peak: float) -> list[str]:
    notes = []
    if a.get("partial"):
        notes.append(f"the count may be short: {a['partial']}")
    if a.get("uncounted"):
        names = ", ".join(sorted(a["uncounted"]))
        notes.append(f"FLOPs inside higher-order operators ({names}) are not counted")
    if a.get("error"):
        notes.append(f"some operators' FLOPs could not be computed ({a['error']})")
    if a.get("eval_flops"):
        notes.append(f"{int(a['eval_flops'])} FLOPs of evaluation in the counted step are left out")
    if peak > 0 and achieved > peak:
        notes.append(
            "the step achieved more than the measured peak: the GEMM benchmark ran while the machine "
            "was busier than during the job; its cached value can be removed to measure it again"
        )
    return notes


# --- the low_mfu finding ------------------------------------------------------------------------------------
def low_mfu(doc: dict[str, Any], st: StepStats | None, alternatives: dict[str, float]) -> Finding | None:
    """MFU below :data:`LOW_MFU`, with the changes that a number backs; None when none does."""
    mfu = doc.get("mfu")
    if mfu is None or st is None or mfu >= LOW_MFU:
        return None
    items = _mfu_items(doc, st, alternatives)
    if not items:
        return None
    items.sort(key=lambda i: -i["gain"])
    severity = "high" if mfu < LOW_MFU_HIGH else "medium" if mfu < LOW_MFU_MEDIUM else "low"
    rec = "; ".join(f"{i['change']} ({i['why']})" for i in items)
    return Finding(
        id="low_mfu",
        severity=severity,
        title=f"The step uses {100 * mfu:.1f}% of the {doc.get('dtype')} peak (MFU)",
        evidence={
            "mfu": mfu,
            "flops_per_step": doc.get("flops_per_step"),
            "achieved_flops_per_s": doc.get("achieved_flops_per_s"),
            "peak_flops_per_s": doc.get("peak_flops_per_s"),
            "peak_source": doc.get("peak_source"),
            "mean_step_s": doc.get("mean_step_s"),
            "dtype": doc.get("dtype"),
            "changes": items,
        },
        recommendation=f"Try, in this order: {rec}.",
        estimated_gain=round(items[0]["gain"], 4),
        threshold={"mfu_below": LOW_MFU},
        gain_basis={
            "model": "a faster dtype: the step's FLOPs at the peak rate (its MFU, at most the forward and "
            "backward share) sped up by the ratio of the peaks (gain_upper_bound: that whole share sped "
            "up so); a fused optimizer: the optimizer's whole share",
            "mfu": round(float(mfu), 4),
            "gain_upper_bound": items[0].get("gain_upper_bound", items[0]["gain"]),
            "forward_backward_share": round(_fb_share(st), 4),
            "optimizer_share": round(st.phases["optimizer"].fraction, 4),
        },
    )


def _fb_share(st: StepStats) -> float:
    return st.phases["forward"].fraction + st.phases["backward"].fraction + st.phases["compute"].fraction


def _mfu_items(doc: dict[str, Any], st: StepStats, alternatives: dict[str, float]) -> list[dict[str, Any]]:
    peak = float(doc.get("peak_flops_per_s") or 0)
    fb = _fb_share(st)
    # the share of the step its FLOPs take at the peak rate: what a faster dtype's peak shortens
    at_peak = min(fb, float(doc.get("mfu") or 0))
    dtype = str(doc.get("dtype") or "")
    on_gpu = str(doc.get("device") or "").startswith("cuda")
    items: list[dict[str, Any]] = []
    cur = table_dtype(dtype, str(doc.get("matmul_precision") or "highest")) if on_gpu else dtype
    if dtype == "float32" and on_gpu and cur == "float32" and alternatives.get("tf32", 0) > peak:
        alt = alternatives["tf32"]
        items.append(
            _item(
                "let float32 matmuls use TF32: torch.set_float32_matmul_precision('high'), or with no code "
                "change: holoprof sweep --set matmul_precision=highest,high -- COMMAND",
                f"TF32 peak {alt / 1e12:g} TFLOP/s against {peak / 1e12:g}",
                at_peak * (1 - peak / alt),
                {"matmul_precision": ["highest", "high"]},
                upper=fb * (1 - peak / alt),
            )
        )
    if dtype == "float32" and alternatives.get("bfloat16", 0) > peak:
        alt = alternatives["bfloat16"]
        items.append(
            _item(
                "compute in bfloat16 under torch.autocast(device_type, dtype=torch.bfloat16), or with no "
                "code change: holoprof sweep --set autocast=off,bf16 -- COMMAND",
                f"bf16 peak {alt / 1e9:.1f} GFLOP/s against {peak / 1e9:.1f} for {cur}",
                at_peak * (1 - peak / alt),
                {"autocast": ["off", "bf16"]},
                upper=fb * (1 - peak / alt),
            )
        )
    opt = st.phases["optimizer"].fraction
    if opt >= OPTIMIZER_SHARE:
        items.append(
            _item(
                "a fused optimizer (e.g. torch.optim.AdamW(..., fused=True)), or torch.compile of the "
                "optimizer step",
                f"the optimizer takes {100 * opt:.0f}% of the step and does no counted FLOPs",
                opt,
            )
        )
    return [i for i in items if i["gain"] >= MIN_GAIN]


def _item(
    change: str, why: str, gain: float, knobs: dict[str, list[str]] | None = None, upper: float | None = None
) -> dict[str, Any]:
    """One change the finding names; ``knobs``: the ``--set`` values that apply it with no code change
    (the current value first), which ``holoprof tune`` measures; ``upper``: the most it could gain,
    where that differs from ``gain``."""
    item: dict[str, Any] = {"change": change, "why": why, "gain": round(max(0.0, gain), 4)}
    if upper is not None:
        item["gain_upper_bound"] = round(max(0.0, upper), 4)
    if knobs:
        item["knobs"] = knobs
    return item


def alternatives_of(run: Run, main: ProcKey, doc: dict[str, Any]) -> dict[str, float]:
    """Peaks of the same device for other dtypes (data sheet, or measured on this CPU)."""
    if str(doc.get("device") or "").startswith("cuda"):
        return gpu_alternatives(str(doc.get("device_name") or ""))
    return cpu_alternatives(read_peaks(run.path), main.host, int(doc.get("threads") or 1))


def with_headroom(found: list[Finding]) -> None:
    """A ``low_mfu`` finding also names a larger batch when the memory analysis found that one fits
    (its ``memory_headroom`` finding): the batch is a knob ``holoprof sweep`` measures."""
    low = next((f for f in found if f.id == "low_mfu"), None)
    room = next((f for f in found if f.id == "memory_headroom"), None)
    if low is None or room is None:
        return
    ev = room.evidence
    batch = ev.get("batch_size") or ev.get("current_batch_size")
    low.evidence["changes"].append(
        {
            "change": "a larger batch (the memory analysis finds that one fits; measure it with holoprof "
            "sweep --set batch_size=...)",
            "why": f"memory_headroom: {room.title}",
            "gain": 0.0,
            "batch_size": batch,
        }
    )
    low.recommendation = low.recommendation.rstrip(".") + f"; a larger batch ({room.title})."


def compute_section(run: Run, ctx: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    """The ``compute`` section (with ``compile``) and its findings (``low_mfu``, ``graph_breaks``,
    ``recompiles``)."""
    doc = compute_doc(run, ctx)
    found: list[Finding] = []
    main = ctx.get("main")
    if main is None or not doc:
        return doc, found
    if doc.get("mfu") is not None:
        f = low_mfu(doc, ctx.get("steps"), alternatives_of(run, main, doc))
        if f is not None:
            found.append(f)
    doc["compile"] = compile_doc(run, ctx, main)
    found += compile_findings(doc["compile"], ctx.get("steps"))
    return doc, found
