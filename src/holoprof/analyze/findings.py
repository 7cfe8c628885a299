"""Findings: verdicts with the evidence behind them, the threshold crossed, the fix, the expected gain.

Each rule is a pure function of analysis results returning a :class:`Finding` or None. A finding that
cannot be backed by a number is not produced. ``estimated_gain`` is the fraction of step time that the
fix can save at most, from the measurements (an upper bound, said as such in the text).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

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


@dataclass
class Finding:
    id: str
    severity: str
    title: str
    evidence: dict[str, Any]
    recommendation: str
    estimated_gain: float
    threshold: dict[str, Any] = field(default_factory=dict)

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


def input_whatif(
    st: StepStats, loader: dict[str, Any], readers: int, cpus: int, gpu: bool = False
) -> dict[str, Any]:
    """Expected step time with ``readers`` loader workers, and with input fully overlapped.

    Model (stated in docs/how-it-works.md): a typical step is ``compute + wait`` (medians). With
    ``W`` workers already, an input-bound loop gets one batch per step from W workers, so one worker
    needs about ``P = step * W`` per batch; with no workers the loop itself spends ``P = wait`` per
    batch. With N workers running in parallel, batches arrive every ``P / N_eff`` and the step takes
    ``max(compute, P / N_eff)``, where ``N_eff`` is N capped by the cores left to workers (all cores
    with a GPU, one fewer when the model also trains on the CPU). Fully overlapped input gives
    ``compute``.
    """
    step = st.median_s
    wait = min(st.phases["data_wait"].median_s, step)
    compute = max(step - wait, 0.0)
    workers = loader.get("num_workers") if isinstance(loader.get("num_workers"), int) else 0
    per_batch = wait if not workers else step * workers
    n_eff = max(1, min(readers, cpus if gpu else max(1, cpus - 1)))
    predicted = max(compute, per_batch / n_eff)
    return {
        "step_median_s": round(step, 6),
        "compute_s": round(compute, 6),
        "per_batch_load_s": round(per_batch, 6),
        "readers": readers,
        "effective_readers": n_eff,
        "predicted_step_s": round(predicted, 6),
        "fully_overlapped_step_s": round(compute, 6),
        "predicted_gain": round(1 - predicted / step, 4) if step > 0 else 0.0,
    }


def input_bound(
    st: StepStats, loader: dict[str, Any], cpus: int | None = None, gpu: bool = False, imported: bool = False
) -> Finding | None:
    """``imported``: the run was read from a file made elsewhere (a profiler trace): the cores of the
    machine that reads it say nothing about the job, so the advice does not count them."""
    frac = steady_share(st, "data_wait")
    if st.count == 0 or frac < INPUT_BOUND_MEDIUM:
        return None
    severity = "high" if frac >= INPUT_BOUND_HIGH else "medium"
    cores_known = cpus is not None or not imported
    cpus = cpus or os.cpu_count() or 1
    workers = loader.get("num_workers")
    evidence: dict[str, Any] = {
        "data_wait_fraction": round(frac, 4),
        "data_wait_fraction_of_total": round(st.phases["data_wait"].fraction, 4),
        "data_wait_median_s": round(st.phases["data_wait"].median_s, 6),
        "step_median_s": round(st.median_s, 6),
        "steps": st.count,
    }
    if cores_known:
        evidence["cpu_cores"] = cpus
    for k in ("num_workers", "batch_size", "prefetch_factor", "pin_memory", "persistent_workers", "dataset"):
        if k in loader:
            evidence[k] = loader[k]
    if workers == 0:
        n = max(2, min(8, cpus))
        fix = (
            f"load batches in parallel with the training step: DataLoader(..., num_workers={n}, "
            "persistent_workers=True, pin_memory=True) — the loader runs in the training process now "
            + (f"(num_workers=0) and this machine has {cpus} CPU cores" if cores_known else "(num_workers=0)")
        )
    elif isinstance(workers, int):
        n = min(max(workers * 2, workers + 2), max(workers + 1, 2 * cpus))
        fix = (
            f"give the input pipeline more parallelism: num_workers {workers} -> {n}, prefetch_factor "
            f"{loader.get('prefetch_factor') or 2} -> 4; if workers are already busy, make __getitem__ cheaper "
            "(decode once and cache, smaller images, fewer/lighter augmentations) or read fewer, larger files"
        )
    else:
        n = 0
        fix = (
            "overlap input with compute: load batches in background workers (DataLoader num_workers>0; "
            "tf.data: .map(..., num_parallel_calls=tf.data.AUTOTUNE), .interleave, .cache(), "
            ".prefetch(tf.data.AUTOTUNE)) and make per-sample work cheaper"
        )
    gain = frac
    if n:
        wi = input_whatif(st, loader, n, cpus, gpu)
        evidence["whatif"] = wi
        gain = wi["predicted_gain"]
        fix += (
            f". Expected: step {1000 * wi['step_median_s']:.1f} ms -> {1000 * wi['predicted_step_s']:.1f} ms with "
            f"{n} workers (fully overlapped input: {1000 * wi['fully_overlapped_step_s']:.1f} ms)"
        )
    return Finding(
        id="input_bound",
        severity=severity,
        title=f"input-bound: {_pct(frac)} of each step waits for data",
        evidence=evidence,
        recommendation=fix,
        estimated_gain=round(max(0.0, gain), 4),
        threshold={
            "medium": INPUT_BOUND_MEDIUM,
            "high": INPUT_BOUND_HIGH,
            "measure": "data_wait / step time",
        },
    )


def host_overhead(st: StepStats) -> Finding | None:
    frac = steady_share(st, "other")
    if st.count == 0 or frac < HOST_OVERHEAD_MEDIUM:
        return None
    severity = "high" if frac >= HOST_OVERHEAD_HIGH else "medium"
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
        recommendation=(
            "look at the Python code that runs between the phases of a step: loss and metric code outside "
            "the model, .item()/.cpu()/print each step (each forces a device sync on a GPU), logging, "
            "per-step Python bookkeeping; log every N steps, keep metrics on the device, and consider "
            "torch.compile or CUDA graphs to cut launch overhead; take a deep profile to see the ops"
        ),
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


def all_findings(
    st: StepStats | None, res: Resources, loader: dict[str, Any], imported: bool = False
) -> list[Finding]:
    out: list[Finding | None] = []
    if st is not None:
        out += [input_bound(st, loader, gpu=bool(res.gpus), imported=imported), host_overhead(st)]
    out.append(low_device_utilization(st, res))
    return ordered([f for f in out if f is not None])


def ordered(found: list[Finding]) -> list[Finding]:
    """Most severe first, then by expected gain."""
    order = {"high": 0, "medium": 1, "low": 2}
    return sorted(found, key=lambda f: (order.get(f.severity, 3), -f.estimated_gain))
