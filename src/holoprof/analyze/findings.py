"""Findings: verdicts with the evidence behind them, the threshold crossed, the fix, the expected gain.

Each rule is a pure function of analysis results returning a :class:`Finding` or None. A finding that
cannot be backed by a number is not produced. ``estimated_gain`` is the fraction of step time that the
fix is expected to save: ``gain_kind`` says whether that is ``predicted`` (a model, named with its
inputs in ``gain_basis``; for most findings the upper bound of removing the whole share) or
``measured`` (a sweep's runs, with the interval).

No finding without a measurable gain: :func:`measurable` keeps a finding only when its gain is at least
:data:`MIN_GAIN` and at least the run's noise (:func:`gain_floor`), and makes its severity follow the
gain (:func:`severity_of_gain`); the findings of :data:`RISK_FINDINGS` warn of a failure, not of lost
time, and are kept whatever their gain. Advice fits the machine: nothing about CUDA without a GPU
(``gpu``), nothing about the network when every rank ran on one host.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from holoprof.analyze.input_model import PipelineInputs, PipelineModel
from holoprof.analyze.resources import Resources
from holoprof.analyze.steps import StepStats

# Thresholds (fractions of step time). input_bound follows the TensorBoard/XProf input-pipeline
# analyzer: >= 5% of step time waiting for input is "moderately", >= 20% "highly" input-bound.
INPUT_BOUND_MEDIUM = 0.05
INPUT_BOUND_HIGH = 0.20
HOST_OVERHEAD_MEDIUM = 0.15
HOST_OVERHEAD_HIGH = 0.30
GPU_UTIL_MEDIUM = 50.0
GPU_UTIL_HIGH = 20.0
#: The smallest expected gain a finding may promise and still be shown: 1% of step time (for a run
#: without a training loop, 1% of its processes' time). A finding is shown only when its gain is at
#: least this and at least the run's noise (:func:`gain_floor`).
MIN_GAIN = 0.01
#: Severity follows the expected gain: high from this share of step time, medium from
#: :data:`SEVERITY_MEDIUM_GAIN`, low below (the input_bound thresholds, as XProf has them).
SEVERITY_HIGH_GAIN = INPUT_BOUND_HIGH
SEVERITY_MEDIUM_GAIN = INPUT_BOUND_MEDIUM
#: Findings that warn of a failure to come (running out of memory, a hung job) rather than promise a
#: saving: shown whatever their gain.
RISK_FINDINGS = frozenset({"memory_pressure", "hang"})
_SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


@dataclass
class Finding:
    id: str
    severity: str
    title: str
    evidence: dict[str, Any]
    recommendation: str
    estimated_gain: float
    threshold: dict[str, Any] = field(default_factory=dict)
    #: whether ``estimated_gain`` is ``predicted`` (by a model: ``gain_basis`` names it and its
    #: inputs) or ``measured`` (by a sweep: ``gain_basis`` has the runs and the interval)
    gain_kind: str = "predicted"
    gain_basis: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _ms(s: float) -> str:
    return f"{1000 * s:.1f} ms"


def steady_share(st: StepStats, phase: str) -> float:
    """The share of a typical step spent in ``phase``.

    The median over steps of the per-step share, so that a few slow warm-up steps (graph tracing,
    worker start-up, autotuning) neither hide nor fake a steady-state problem; the plain fraction of
    total time for runs with too few steps for a median to mean much.
    """
    ps = st.phases[phase]
    return ps.median_share if st.count >= 5 else ps.fraction


def _loader_evidence(st: StepStats, loader: dict[str, Any], frac: float) -> dict[str, Any]:
    evidence: dict[str, Any] = {
        "data_wait_fraction": round(frac, 4),
        "data_wait_fraction_of_total": round(st.phases["data_wait"].fraction, 4),
        "data_wait_median_s": round(st.phases["data_wait"].median_s, 6),
        "step_median_s": round(st.median_s, 6),
        "steps": st.count,
    }
    for k in ("num_workers", "batch_size", "prefetch_factor", "pin_memory", "persistent_workers", "dataset"):
        if k in loader:
            evidence[k] = loader[k]
    return evidence


def _cores(x: PipelineInputs) -> str:
    busy = (
        f" shared with {x.others_runnable:g} busy threads of other processes" if x.others_runnable > 0 else ""
    )
    return f"{x.cores:g} cores{busy}"


def _spin_note(m: PipelineModel) -> str:
    """A sentence on torch's threads contending for the cores, when worth measuring (else empty)."""
    if not m.spin_worth_measuring:
        return ""
    x, adv = m.inputs, m.advice
    seen = []
    if m.stalled:
        seen.append(
            f"the training thread waited for a CPU {_ms(x.compute_runq_s)} of its {_ms(x.compute_s)} compute per step"
        )
    if m.spinning:
        seen.append(
            f"its other threads burnt {_ms(x.spin_cpu_s)} of CPU per step while the loop waited for a batch"
        )
    n = adv.workers if adv.workers > 0 else m.best_with_workers
    counts = ",".join(str(v) for v in sorted({x.num_workers, n}))
    return (
        f". Torch's {x.torch_threads} threads contend for the cores: {' and '.join(seen)} (idle OpenMP threads "
        "spin before they sleep, on cores the loader and the other threads need); measure OMP_WAIT_POLICY=PASSIVE "
        f"with no code change: holoprof sweep --set omp_wait_policy=default,passive --set num_workers={counts} -- COMMAND"
    )


def _persistent_note(m: PipelineModel) -> str:
    """``persistent_workers=True`` when the workers' start at each epoch is worth it (else empty)."""
    if not m.persistent_advised:
        return ""
    x = m.inputs
    return (
        f"use DataLoader(..., persistent_workers=True): each of the {x.restarts} epochs after the first "
        f"started the {x.num_workers} workers again, {_ms(x.restart_s)} of a {_ms(x.epoch_s)} epoch "
        f"(predicted: {_pct(m.persistent_gain)} of this run's time saved); measure it with no code change: "
        "holoprof sweep --set persistent_workers=false,true -- COMMAND"
    )


def _model_fix(m: PipelineModel, loader: dict[str, Any]) -> str:
    """The recommendation from the input-pipeline model: a configuration, or why none helps."""
    persistent = _persistent_note(m)
    if persistent and not m.advice.advised:  # the workers are right; starting them once is the fix
        return persistent + _spin_note(m)
    return _model_fix_text(m, loader) + (". Also " + persistent if persistent else "") + _spin_note(m)


def _model_fix_text(m: PipelineModel, loader: dict[str, Any]) -> str:
    x, adv = m.inputs, m.advice
    cur = x.num_workers
    if adv.advised:
        extra = []
        if x.gpu and adv.workers > 0 and not loader.get("pin_memory"):
            extra.append("pin_memory=True")  # page-locked batches copy to the GPU asynchronously
        fix = f"use DataLoader(..., num_workers={adv.workers}{''.join(', ' + e for e in extra)})"
        fix += f" (now num_workers={cur})" if adv.workers != cur else ""
        fix += (
            f". Predicted: mean step {_ms(x.step_s)} -> {_ms(adv.predicted_step_s)} with {_cores(x)} "
            f"(loading {_ms(x.loader_cpu_s)} CPU / {_ms(m.loader_wall_s)} wall per batch, compute "
            f"{_ms(x.compute_cpu_s)} CPU per step); measure it with no code change: "
            f"holoprof sweep --set num_workers={cur},{adv.workers} -- COMMAND (or holoprof tune -- COMMAND)"
        )
        return fix
    total_cpu = x.compute_cpu_s + x.loader_cpu_s
    if adv.limit == "cores":
        why = (
            f"each step needs {_ms(total_cpu)} of CPU (compute {_ms(x.compute_cpu_s)}, loading "
            f"{_ms(x.loader_cpu_s)} per batch) and the job had {_cores(x)}, so more workers would only "
            "compete with the training process for them"
        )
        helps = (
            "fewer threads per process (torch.set_num_threads), cheaper decode (smaller images, lighter "
            "augmentations), caching decoded samples (decode once, keep tensors), or a machine with more cores"
        )
    elif adv.limit == "main":
        why = f"the training loop itself takes {_ms(m.base_compute_s)} per step, which loading already keeps up with"
        helps = "a cheaper step (see the phases above), not a different loader"
    else:
        why = f"loading one batch takes {_ms(m.loader_wall_s)} and more workers than {adv.workers} do not pay"
        helps = (
            "cheaper per-sample work, caching decoded samples, fewer and larger files, or a machine with "
            "more cores"
        )
    return (
        f"the loader is already as good as this machine allows (num_workers={cur}): no worker count is "
        f"predicted to beat the measured mean step of {_ms(x.step_s)} by more than its noise "
        f"({_pct(m.margin)}) — {why}. What would help: {helps}"
    )


_GENERIC_INPUT_FIX = (
    "overlap input with compute: load batches in background workers (DataLoader num_workers>0; "
    "tf.data: .map(..., num_parallel_calls=tf.data.AUTOTUNE), .interleave, .cache(), "
    ".prefetch(tf.data.AUTOTUNE)) and make per-sample work cheaper; measure a change with no code "
    "change: holoprof sweep --set num_workers=0,2 -- COMMAND (tf.data: --set num_parallel_calls=autotune)"
)


def _misfit_note(m: PipelineModel) -> str:
    x = m.inputs
    return (
        f"The input-pipeline model does not describe this run (it predicts a mean step of "
        f"{_ms(m.predicted_now_s)} for num_workers={x.num_workers} against {_ms(x.step_s)} measured), so it "
        "advises no worker count: measure them instead"
    )


def _upper_bound(frac: float, why: str) -> tuple[float, dict[str, Any]]:
    return frac, {"model": why, "inputs": {"data_wait_fraction": round(frac, 4)}}


def _model_gain(m: PipelineModel, frac: float) -> tuple[float, dict[str, Any]]:
    """The gain of what the model advises (workers, persistent workers), with its basis; when it
    advises no change, the wait itself is the most cheaper loading can save (nothing when the model
    finds that the training loop, not loading, bounds the step)."""
    if m.advice.advised or m.persistent_advised:
        return m.gain, {"model": "input_pipeline", "inputs": m.inputs.to_dict()}
    if m.advice.limit == "main":
        return 0.0, {"model": "input_pipeline", "inputs": m.inputs.to_dict()}
    return _upper_bound(
        frac, "loading made free (an upper bound); no worker count beats the current one (input_pipeline)"
    )


def input_bound(
    st: StepStats,
    loader: dict[str, Any],
    cpus: int | None = None,
    pipeline: PipelineModel | None = None,
    imported: bool = False,
) -> Finding | None:
    """``input_bound`` with a recommendation from the input-pipeline model when the run measured
    its inputs (:mod:`holoprof.analyze.input_model`) and the model fits the run (its prediction for
    the configuration that ran is near the measured step); never one the model predicts slower.
    ``imported``: the run was read from a file made elsewhere (a profiler trace): the cores of the
    machine that reads it say nothing about the job, so the evidence does not count them."""
    frac = steady_share(st, "data_wait")
    if st.count == 0 or frac < INPUT_BOUND_MEDIUM:
        return None
    evidence = _loader_evidence(st, loader, frac)
    if pipeline is not None:
        evidence["cpu_cores"] = pipeline.inputs.cores
    elif cpus is not None or not imported:
        evidence["cpu_cores"] = cpus or os.cpu_count() or 1
    if pipeline is not None:
        evidence["model"] = pipeline.evidence()
    if pipeline is not None and pipeline.fits:
        fix = _model_fix(pipeline, loader)
        gain, basis = _model_gain(pipeline, frac)
    elif pipeline is not None and pipeline.persistent_advised:
        # the workers' start at each epoch is measured, not predicted: still worth saying
        fix = _persistent_note(pipeline) + ". " + _misfit_note(pipeline)
        gain, basis = (
            pipeline.persistent_gain,
            {"model": "input_pipeline", "inputs": pipeline.inputs.to_dict()},
        )
    else:
        fix = _GENERIC_INPUT_FIX
        gain, basis = _upper_bound(frac, "input fully overlapped (an upper bound)")
        if pipeline is not None:  # measured, but the model misses where this run's time goes
            fix += ". " + _misfit_note(pipeline)
    gain = round(max(0.0, gain), 4)
    return Finding(
        id="input_bound",
        severity=severity_of_gain(gain),
        title=f"input-bound: {_pct(frac)} of each step waits for data",
        evidence=evidence,
        recommendation=fix,
        estimated_gain=gain,
        threshold={
            "medium": INPUT_BOUND_MEDIUM,
            "high": INPUT_BOUND_HIGH,
            "measure": "data_wait / step time",
        },
        gain_kind="predicted",
        gain_basis=basis,
    )


def host_overhead(st: StepStats, gpu: bool = False) -> Finding | None:
    """``host_overhead``; its advice speaks of device syncs and CUDA graphs only when the job had a GPU."""
    frac = steady_share(st, "other")
    if st.count == 0 or frac < HOST_OVERHEAD_MEDIUM:
        return None
    severity = "high" if frac >= HOST_OVERHEAD_HIGH else "medium"
    if gpu:
        fix = (
            "look at the Python code that runs between the phases of a step: loss and metric code outside "
            "the model, .item()/.cpu()/print each step (each forces a device sync on a GPU), logging, "
            "per-step Python bookkeeping; log every N steps, keep metrics on the device, and consider "
            "torch.compile or CUDA graphs to cut launch overhead; take a deep profile to see the ops"
        )
    else:
        fix = (
            "look at the Python code that runs between the phases of a step: loss and metric code outside "
            "the model, .item()/print each step, logging, per-step Python bookkeeping; log every N steps, "
            "keep metrics as tensors until then, and consider torch.compile to cut Python overhead; take a "
            "deep profile to see the ops"
        )
    return Finding(
        id="host_overhead",
        severity=severity,
        title=f"host overhead: {_pct(frac)} of each step is outside data loading, forward, backward and the optimizer",
        evidence={
            "other_fraction": round(frac, 4),
            "other_median_s": round(st.phases["other"].median_s, 6),
            "step_median_s": round(st.median_s, 6),
            "steps": st.count,
        },
        recommendation=fix,
        estimated_gain=round(frac, 4),
        threshold={
            "medium": HOST_OVERHEAD_MEDIUM,
            "high": HOST_OVERHEAD_HIGH,
            "measure": "other / step time",
        },
    )


def low_device_utilization(st: StepStats | None, res: Resources) -> Finding | None:
    if not res.gpus:
        return None
    utils = [res.stats[f"gpu.{i}.util_percent"] for i in res.gpus if f"gpu.{i}.util_percent" in res.stats]
    if not utils:
        return None
    mean = sum(u.mean for u in utils) / len(utils)
    if mean >= GPU_UTIL_MEDIUM:
        return None
    severity = "high" if mean < GPU_UTIL_HIGH else "medium"
    hint = ""
    if st is not None and st.count:
        dw, other = steady_share(st, "data_wait"), steady_share(st, "other")
        if dw >= INPUT_BOUND_MEDIUM:
            hint = f" The step waits for data {_pct(dw)} of the time: fix the input pipeline first."
        elif other >= HOST_OVERHEAD_MEDIUM:
            hint = f" {_pct(other)} of the step is host-side Python: reduce it first."
    return Finding(
        id="low_device_utilization",
        severity=severity,
        title=f"low GPU utilization: kernels ran {mean:.0f}% of the time on average",
        evidence={
            "gpu_util_mean_percent": round(mean, 1),
            "gpus": len(utils),
            "samples": sum(u.count for u in utils),
        },
        recommendation=(
            "give the GPU more work per launch: a larger batch (see memory headroom), mixed precision, "
            "torch.compile, and fewer host-device syncs." + hint
        ),
        estimated_gain=round(max(0.0, 1.0 - mean / GPU_UTIL_MEDIUM) * 0.5, 4),
        threshold={
            "medium": GPU_UTIL_MEDIUM,
            "high": GPU_UTIL_HIGH,
            "measure": "mean NVML GPU utilization (%)",
        },
    )


def gain_label(f: dict[str, Any]) -> str:
    """A finding's expected gain, labelled measured (a sweep, with its interval) or predicted (a model)."""
    gain = float(f.get("estimated_gain") or 0)
    basis = f.get("gain_basis") or {}
    if f.get("gain_kind") == "measured":
        lo, hi = (basis.get("best_interval_s") or [0.0, 0.0])[:2]
        where = (
            f"{basis.get('best')}: step {_ms(basis.get('best_step_s', 0))} (95% CI {_ms(lo)}–{_ms(hi)}) "
            f"against {_ms(basis.get('this_step_s', 0))} with {basis.get('this')}"
        )
        if basis.get("best") == basis.get("this"):
            return f"measured: this run is the sweep's best configuration, step {_ms(basis.get('best_step_s', 0))}"
        if gain:
            return f"measured: {100 * gain:.0f}% of step time, {where}"
        return f"measured: no significant gain, {where}"
    if not gain:
        return "predicted: no gain on this machine" if basis.get("model") == "input_pipeline" else ""
    if basis.get("model") == "input_pipeline":
        return f"predicted by the input-pipeline model: {100 * gain:.0f}% of step time"
    upper = basis.get("gain_upper_bound")
    if isinstance(upper, (int, float)) and upper > gain:  # an estimate, with the most it could be
        return f"predicted: {100 * gain:.0f}% of step time (at most {100 * upper:.0f}%)"
    return f"predicted: up to {100 * gain:.0f}% of step time"


def all_findings(
    st: StepStats | None,
    res: Resources,
    loader: dict[str, Any],
    pipeline: PipelineModel | None = None,
    imported: bool = False,
    gpu: bool = False,
) -> list[Finding]:
    out: list[Finding | None] = []
    if st is not None:
        out += [input_bound(st, loader, pipeline=pipeline, imported=imported), host_overhead(st, gpu)]
    out.append(low_device_utilization(st, res))
    return ordered([f for f in out if f is not None])


def ordered(found: list[Finding]) -> list[Finding]:
    """Most severe first, then by expected gain."""
    return sorted(found, key=lambda f: (_SEVERITY_ORDER.get(f.severity, 3), -f.estimated_gain))


def severity_of_gain(gain: float) -> str:
    """The severity a gain deserves: high from :data:`SEVERITY_HIGH_GAIN` of step time, medium from
    :data:`SEVERITY_MEDIUM_GAIN`, low below."""
    if gain >= SEVERITY_HIGH_GAIN:
        return "high"
    if gain >= SEVERITY_MEDIUM_GAIN:
        return "medium"
    return "low"


def gain_floor(st: StepStats | None) -> float:
    """The smallest gain a finding of this run may promise: :data:`MIN_GAIN`, or the run's noise (the
    relative half-width of the 95% interval of its steady mean step) when that is larger — a smaller
    saving could not be told from the run's own variation."""
    noise = st.noise if st is not None and st.count else 0.0
    return max(MIN_GAIN, noise)


def _floor_of(f: Finding, floor: float) -> float:
    """A gain predicted by the input-pipeline model is a prediction about the steady steps the model
    measured its noise on (the steps in which the workers started again left out): its floor is that
    noise, at least :data:`MIN_GAIN` (the model itself advises nothing below the larger of it and 5%)."""
    basis = f.gain_basis or {}
    noise = (basis.get("inputs") or {}).get("noise") if basis.get("model") == "input_pipeline" else None
    return max(MIN_GAIN, float(noise)) if isinstance(noise, (int, float)) else floor


def measurable(found: list[Finding], floor: float) -> list[Finding]:
    """The findings worth showing: those whose expected gain reaches ``floor`` (:func:`gain_floor`),
    each no more severe than its gain (:func:`severity_of_gain`), with the floor in its threshold;
    those of :data:`RISK_FINDINGS`, whatever their gain; those below the floor whose basis names a cost
    it cannot price (``gain_basis["unpriced"]``: torch.compile's graph breaks, a frame at the recompile
    limit), at low severity; and those whose gain a sweep measured (its
    runs compared by the sweep's own significance test: a measured "no significant gain" is an answer
    to the sweep, shown as one)."""
    out = []
    for f in found:
        if f.id in RISK_FINDINGS or f.gain_kind == "measured":
            if f.gain_kind == "measured":
                f.severity = severity_of_gain(f.estimated_gain)
            out.append(f)
            continue
        floor_f = _floor_of(f, floor)
        if f.estimated_gain < floor_f:
            if (f.gain_basis or {}).get("unpriced"):  # a cost it names but cannot price: at most low
                f.severity = "low"
                f.threshold = {**f.threshold, "min_gain": round(floor_f, 4)}
                out.append(f)
            continue
        by_gain = severity_of_gain(f.estimated_gain)
        if _SEVERITY_ORDER.get(by_gain, 3) > _SEVERITY_ORDER.get(f.severity, 3):
            f.severity = by_gain
        f.threshold = {**f.threshold, "min_gain": round(floor_f, 4)}
        out.append(f)
    return out
