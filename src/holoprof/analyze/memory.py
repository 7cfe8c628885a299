"""The ``memory`` section: peak memory by category, its timeline, per layer, and the memory findings.

Reads the ``memory`` snapshots of the main training process (spans of kind ``op``, name ``memory``,
written by :mod:`holoprof.collect.memory` at phase boundaries of sampled steps). Pure functions.

* ``peak_bytes``: the largest total over the snapshots — on a GPU the caching allocator's reserved
  memory (its per-step high-water mark when recorded), on the CPU the process's resident memory.
* ``categories``: weights, gradients, optimizer_state, activations, other of the step with the largest
  tensor footprint, each at its largest over that step's phase boundaries (activations after the
  forward, gradients after the backward) — an upper bound of what is alive at once during backward;
  ``other`` is taken at the step's largest total.
* ``memory_pressure``: the peak is ≥ 90% of the device's memory (on the CPU: the machine's memory or
  the process's cgroup limit), or ``other`` is large on a GPU (cached and fragmented blocks).
* ``memory_headroom``: activations grow with the batch and the rest does not, so the largest batch
  that fits is ``batch × (90% of the limit − the rest) / activations``; reported when at least twice
  the current batch fits on a GPU that was measured idle part of the time (a larger batch is then
  both possible and useful), with the advice kept to the same effective batch under gradient
  accumulation. Never on the CPU, where nothing in one run measures that a larger batch helps.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any

from holoprof.analyze.engine import Aggregation, aggregate
from holoprof.analyze.findings import Finding
from holoprof.analyze.steps import ProcKey
from holoprof.store.reader import Run

CATEGORIES: tuple[str, ...] = ("weights", "gradients", "optimizer_state", "activations", "other")
PRESSURE_FRACTION = 0.90
#: A GPU's ``other`` counts as fragmentation when it is at least this share of reserved memory ...
FRAGMENTATION_FRACTION = 0.25
#: ... and at least this many bytes.
FRAGMENTATION_MIN_BYTES = 512 * 1024**2
HEADROOM_MIN_FACTOR = 2.0
#: a GPU busier than this (mean NVML utilization, %) gains little from a larger batch
HEADROOM_UTIL_BELOW = 80.0
PHASE_ORDER = {"forward": 0, "backward": 1, "optimizer": 2}


@dataclass
class Snapshot:
    step: int
    phase: str
    ts_ns: int
    categories: dict[str, int]
    total_bytes: int
    attrs: dict[str, Any]


@dataclass
class MemoryStats:
    device: str
    peak: Snapshot
    snapshots: list[Snapshot]
    limit_bytes: int
    limit_source: str
    other_basis: str
    batch_size: int | None
    per_layer: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "sampled"
    max_total_bytes: int = 0
    #: the peak step's categories, each at its largest over the step (see memory_stats)
    categories: dict[str, int] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        dev = max((int(s.attrs.get("device_peak_bytes") or 0) for s in self.snapshots), default=0)
        return max(self.max_total_bytes, self.peak.total_bytes, dev)

    def step_activations(self, step: int) -> int:
        return max((s.categories["activations"] for s in self.snapshots if s.step == step), default=0)


def _snapshot_rows(proc: ProcKey | None) -> Aggregation:
    """The memory snapshot spans of ``proc`` (all processes when None), in time order."""
    where = " AND host = $host AND pid = $pid" if proc is not None else ""
    return Aggregation(
        name="memory-snapshots",
        table="spans",
        columns=("host", "pid", "kind", "name", "start_ns", "step", "attrs"),
        chunk=f"SELECT step, start_ns, attrs FROM {{t}} WHERE kind = 'op' AND name = 'memory'{where}",
        order="start_ns, step, attrs",
        params={"host": proc.host, "pid": proc.pid} if proc is not None else {},
        pids=(proc.pid,) if proc is not None else None,
    )


def snapshots(run: Run, proc: ProcKey | None, ctx: dict[str, Any] | None = None) -> list[Snapshot]:
    """The memory snapshots of ``proc`` (all processes when None), the last one per (step, phase)."""
    latest: dict[tuple[int, str], Snapshot] = {}
    for step, ts, raw in aggregate(run, ctx, _snapshot_rows(proc)):
        try:
            a = json.loads(raw) if raw else {}
        except ValueError:
            continue
        if not isinstance(a, dict) or not isinstance(a.get("categories"), dict):
            continue
        cats = {c: int(a["categories"].get(c) or 0) for c in CATEGORIES}
        phase = str(a.get("phase", "?"))
        s = Snapshot(int(step), phase, int(ts), cats, int(a.get("total_bytes") or sum(cats.values())), a)
        latest[(s.step, phase)] = s
    return sorted(latest.values(), key=lambda s: (s.step, PHASE_ORDER.get(s.phase, 9), s.ts_ns))


def memory_stats(run: Run, proc: ProcKey | None, ctx: dict[str, Any] | None = None) -> MemoryStats | None:
    snaps = snapshots(run, proc, ctx)
    if not snaps and proc is not None:
        snaps = snapshots(run, None, ctx)
    if not snaps:
        return None
    # Per step, each category at its largest over the step's boundaries (activations after the forward,
    # gradients after the backward): what must fit at once while backward runs, at most. The peak step
    # is the one with the largest such tensor footprint (the process total on the CPU is mostly
    # libraries, so it does not choose).
    by_step: dict[int, list[Snapshot]] = {}
    for s in snaps:
        by_step.setdefault(s.step, []).append(s)
    composite: dict[int, dict[str, int]] = {}
    for step, group in by_step.items():
        biggest = max(group, key=lambda s: (s.total_bytes, s.ts_ns))
        composite[step] = {c: max(s.categories[c] for s in group) for c in CATEGORIES if c != "other"}
        composite[step]["other"] = biggest.categories["other"]
    peak_step = max(composite, key=lambda k: (sum(v for c, v in composite[k].items() if c != "other"), k))
    peak = max(by_step[peak_step], key=lambda s: (s.total_bytes, s.ts_ns))
    top = max(s.total_bytes for s in snaps)
    # per layer: the forward snapshot of the peak's step (where activations are all alive), else the last
    fwd = [s for s in snaps if s.phase == "forward" and s.attrs.get("per_layer")]
    layer_src = next((s for s in fwd if s.step == peak.step), fwd[-1] if fwd else None)
    per_layer = list(layer_src.attrs.get("per_layer") or []) if layer_src else []
    batch = next((s.attrs.get("batch_size") for s in reversed(snaps) if s.attrs.get("batch_size")), None)
    return MemoryStats(
        device=str(peak.attrs.get("device", "cpu")),
        peak=peak,
        snapshots=snaps,
        limit_bytes=int(peak.attrs.get("limit_bytes") or 0),
        limit_source=str(peak.attrs.get("limit_source", "")),
        other_basis=str(peak.attrs.get("other_basis", "rss")),
        batch_size=int(batch) if batch else None,
        per_layer=per_layer,
        mode=str(peak.attrs.get("mode", "sampled")),
        max_total_bytes=top,
        categories=composite[peak_step],
    )


# --- findings ----------------------------------------------------------------------------------------
def _gib(b: float) -> str:
    return f"{b / 1024**3:.2f} GiB"


def _mib(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} GiB"


def _advice(ms: MemoryStats, cats: dict[str, int]) -> str:
    order = sorted(((cats[c], c) for c in CATEGORIES if c != "other"), reverse=True)
    biggest = order[0][1] if order and order[0][0] > 0 else "other"
    advice = {
        "activations": (
            "activations are the largest category: use activation checkpointing "
            "(torch.utils.checkpoint on the largest blocks) and mixed precision (torch.autocast with "
            "bfloat16/float16 halves activations), or a smaller batch with gradient accumulation"
        ),
        "optimizer_state": (
            "optimizer state is the largest category: Adam keeps two fp32 tensors per parameter; consider "
            "SGD with momentum (one), a factored or 8-bit optimizer, or sharding the state (ZeRO/FSDP)"
        ),
        "weights": (
            "weights are the largest category: train in bfloat16 or mixed precision, or shard the model "
            "(FSDP) across devices"
        ),
        "gradients": (
            "gradients are the largest category: mixed precision halves them; zero_grad(set_to_none=True) "
            "frees them between steps; FSDP shards them"
        ),
        "other": "memory outside tensors dominates: see the 'other' note",
    }
    return advice[biggest]


def memory_pressure(ms: MemoryStats) -> Finding | None:
    cats = ms.categories or ms.peak.categories
    peak = ms.peak_bytes
    if ms.limit_bytes > 0 and peak >= PRESSURE_FRACTION * ms.limit_bytes:
        frac = peak / ms.limit_bytes
        return Finding(
            id="memory_pressure",
            severity="high",
            title=f"memory pressure: the peak uses {100 * frac:.0f}% of {ms.device} memory",
            evidence={
                "peak_bytes": peak,
                "limit_bytes": ms.limit_bytes,
                "limit_source": ms.limit_source,
                "peak_fraction": round(frac, 4),
                "step": ms.peak.step,
                "phase": ms.peak.phase,
                **{f"{c}_bytes": cats[c] for c in CATEGORIES},
            },
            recommendation=_advice(ms, cats)
            + f"; at {_gib(peak)} of {_gib(ms.limit_bytes)} a larger batch or model will not fit",
            estimated_gain=0.0,
            threshold={"high": PRESSURE_FRACTION, "measure": "peak / device memory"},
        )
    reserved = int(ms.peak.attrs.get("reserved_bytes") or 0)
    other = ms.peak.categories["other"]
    if (
        ms.other_basis == "cuda_reserved"
        and reserved > 0
        and other >= FRAGMENTATION_FRACTION * reserved
        and other >= FRAGMENTATION_MIN_BYTES
    ):
        return Finding(
            id="memory_pressure",
            severity="medium",
            title=f"allocator overhead: {_gib(other)} ({100 * other / reserved:.0f}%) of reserved GPU memory holds no tensor",
            evidence={
                "other_bytes": other,
                "reserved_bytes": reserved,
                "allocated_bytes": int(ms.peak.attrs.get("allocated_bytes") or 0),
                "other_fraction": round(other / reserved, 4),
                "step": ms.peak.step,
            },
            recommendation=(
                "cached and fragmented blocks: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, avoid "
                "tensors whose shapes change every step (pad to a few fixed sizes), and do not call "
                "torch.cuda.empty_cache() each step"
            ),
            estimated_gain=0.0,
            threshold={
                "medium": FRAGMENTATION_FRACTION,
                "min_bytes": FRAGMENTATION_MIN_BYTES,
                "measure": "other / reserved",
            },
        )
    return None


def headroom_batch(ms: MemoryStats, batch: int) -> tuple[int, int, int] | None:
    """(largest batch that fits, activations at the peak step, bytes that do not scale with the batch)."""
    acts = ms.step_activations(ms.peak.step) or max(
        (s.categories["activations"] for s in ms.snapshots), default=0
    )
    if acts <= 0 or batch <= 0 or ms.limit_bytes <= 0:
        return None
    # the peak with all of this step's activations alive
    peak = max(ms.peak_bytes, ms.peak.total_bytes - ms.peak.categories["activations"] + acts)
    fixed = max(0, peak - acts)
    budget = PRESSURE_FRACTION * ms.limit_bytes - fixed
    if budget <= 0:
        return None
    return int(batch * budget / acts), acts, fixed


def memory_headroom(
    ms: MemoryStats, batch: int | None, gpu_util_percent: float | None, accumulation: int = 1
) -> Finding | None:
    """A larger batch both fits and is worth it: only on a GPU whose measured utilization says it is
    idle part of the time (a larger batch fills it). On the CPU no measurement of one run says that a
    larger batch would run faster per sample, so there is no finding (``holoprof sweep`` measures it).

    With gradient accumulation (``accumulation`` micro-batches per optimizer step) the advice keeps
    the effective batch: larger micro-batches, fewer of them."""
    if not batch or not ms.device.startswith("cuda") or gpu_util_percent is None:
        return None
    if gpu_util_percent >= HEADROOM_UTIL_BELOW:
        return None
    est = headroom_batch(ms, batch)
    if est is None:
        return None
    max_batch, acts, fixed = est
    if max_batch < HEADROOM_MIN_FACTOR * batch:
        return None
    factor = max_batch / batch
    k = 1  # the batch grows k times: powers of two, within what fits
    while batch * k * 2 <= max_batch and k < 64 and (accumulation <= 1 or k * 2 <= accumulation):
        k *= 2
    suggested = batch * k
    idle = max(0.0, 1.0 - gpu_util_percent / 100.0)
    gain = idle * (1.0 - 1.0 / k)
    sweep = ",".join(str(batch * 2**i) for i in range(4))
    if accumulation > 1:
        change = (
            f"the job accumulates gradients over {accumulation} micro-batches of {batch}: make the "
            f"micro-batch {suggested} and accumulate over {max(1, accumulation // k)} (the same "
            f"{batch * accumulation} samples per optimizer step in fewer, larger passes)"
        )
    else:
        change = f"raise the batch size from {batch} to {suggested}, scaling the learning rate with it"
    return Finding(
        id="memory_headroom",
        severity="low",
        title=(
            f"memory headroom: a batch of up to ~{max_batch} ({factor:.0f}× the current {batch}) fits in "
            f"{ms.device} memory, and the GPU was busy {gpu_util_percent:.0f}% of the time"
        ),
        evidence={
            "batch_size": batch,
            "accumulation_steps": accumulation,
            "max_batch_size": max_batch,
            "suggested_batch_size": suggested,
            "activation_bytes": acts,
            "activation_bytes_per_sample": round(acts / batch, 1),
            "fixed_bytes": fixed,
            "peak_bytes": ms.peak_bytes,
            "limit_bytes": ms.limit_bytes,
            "limit_source": ms.limit_source,
            "gpu_util_percent": round(gpu_util_percent, 1),
        },
        recommendation=(
            f"{change}: each step then does more work while the device would otherwise idle; activations "
            f"take {_mib(acts / batch)} per sample and everything else {_mib(fixed)}; measure throughput "
            f"against batch size with: holoprof sweep --param batch_size={sweep} -- <your command with "
            "{batch_size}>"
        ),
        estimated_gain=round(gain, 4),
        threshold={
            "min_factor": HEADROOM_MIN_FACTOR,
            "budget_fraction": PRESSURE_FRACTION,
            "gpu_util_below": HEADROOM_UTIL_BELOW,
            "measure": "batch × (0.9 × device memory − fixed) / activations",
            "gain": "(1 − measured GPU utilization) × (1 − 1/k) for a k× larger batch: the device's idle "
            "share, amortized over k times the work (predicted)",
        },
    )


def _gpu_util(res: Any, device: str) -> float | None:
    """The measured mean utilization (%) of the GPU the loop ran on (NVML), None without one."""
    if res is None or not device.startswith("cuda"):
        return None
    try:
        index = int(device.split(":", 1)[1]) if ":" in device else 0
    except ValueError:
        index = 0
    stat = res.stats.get(f"gpu.{index}.util_percent")
    return float(stat.mean) if stat is not None and stat.count else None


def _accumulation_agg(proc: ProcKey) -> Aggregation:
    """Batches fetched per step by the training loop's thread."""
    return Aggregation(
        name="memory-fetches-per-step",
        table="spans",
        columns=("host", "pid", "tid", "kind", "name", "step"),
        chunk="""SELECT step, count(*) AS n FROM {t} WHERE kind = 'phase' AND name = 'data_wait'
            AND host = $host AND pid = $pid AND tid = $tid AND step >= 0 GROUP BY step""",
        combine="SELECT step, CAST(sum(n) AS BIGINT) AS n FROM {t} GROUP BY step",
        order="step",
        params={"host": proc.host, "pid": proc.pid, "tid": proc.tid},
        pids=(proc.pid,),
    )


def accumulation_steps(run: Run, proc: ProcKey, ctx: dict[str, Any] | None = None) -> int:
    """Micro-batches per optimizer step (gradient accumulation): the median number of batches the
    loop fetched per step, 1 when it fetched none (no DataLoader)."""
    counts = [int(n) for _, n in aggregate(run, ctx, _accumulation_agg(proc))]
    return max(1, int(statistics.median(counts))) if counts else 1


#: What the ``other`` category is, by what the collector measured it against (``other_basis``).
OTHER_NOTE = {
    "rss": "other (CPU): resident memory not attributed to tensors: interpreter, libraries, allocator caches",
    "cuda_reserved": (
        "other (GPU): memory reserved by the CUDA caching allocator that no category accounts for: "
        "workspaces, temporaries, cached and fragmented blocks"
    ),
}


# --- the report section ------------------------------------------------------------------------------
def section(ms: MemoryStats | None, loader: dict[str, Any]) -> dict[str, Any]:
    if ms is None:
        return {}
    doc = {
        "peak_bytes": ms.peak_bytes,
        "device": ms.device,
        "step": ms.peak.step,
        "phase": ms.peak.phase,
        "categories": dict(ms.categories or ms.peak.categories),
        "limit_bytes": ms.limit_bytes,
        "limit_source": ms.limit_source,
        "other_note": OTHER_NOTE.get(ms.other_basis, ""),
        "batch_size": loader.get("batch_size") or ms.batch_size,
        "mode": ms.mode,
        "sampled_steps": sorted({s.step for s in ms.snapshots}),
        "timeline": [
            {"step": s.step, "phase": s.phase, **s.categories, "total_bytes": s.total_bytes}
            for s in ms.snapshots
        ],
        "per_layer": [
            {
                "name": str(r.get("name")),
                "activation_bytes": int(r.get("activation_bytes") or 0),
                "parameter_bytes": int(r.get("parameter_bytes") or 0),
            }
            for r in ms.per_layer
        ],
    }
    unmeasured = [s for s in ms.snapshots if s.attrs.get("activations_unmeasured")]
    if unmeasured:
        # the job's own saved-tensor hooks wrapped its forward: none were pushed over them
        doc["activations_unmeasured"] = {
            "steps": sorted({s.step for s in unmeasured}),
            "why": str(unmeasured[-1].attrs["activations_unmeasured"]),
        }
    unreadable = [s for s in ms.snapshots if isinstance(s.attrs.get("tensors_unmeasured"), dict)]
    if unreadable:
        # tensors of a kind whose storage cannot be read were left out of the categories
        types: dict[str, int] = dict(unreadable[-1].attrs["tensors_unmeasured"])
        doc["tensors_unmeasured"] = {
            "steps": sorted({s.step for s in unreadable}),
            "types": types,
            "why": "their storage cannot be read (" + ", ".join(sorted(types)) + "): not counted",
        }
    return doc


def memory_section(run: Run, ctx: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    ms = memory_stats(run, ctx.get("main"), ctx)
    loader = ctx.get("loader") or {}
    doc = section(ms, loader)
    if ms is None:
        return doc, []
    found: list[Finding] = []
    f = memory_pressure(ms)
    if f is not None:
        found.append(f)
    else:
        batch = loader.get("batch_size") or ms.batch_size
        util = _gpu_util(ctx.get("resources"), ms.device)
        main = ctx.get("main")
        if batch and util is not None and util < HEADROOM_UTIL_BELOW:
            accumulation = accumulation_steps(run, main, ctx) if main is not None else 1
            h = memory_headroom(ms, int(batch), util, accumulation)
            if h is not None:
                found.append(h)
    return doc, found
