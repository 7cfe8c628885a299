"""What a sweep measured: its rows and result, the best configuration and its comparison with the
others (the diff's throughput test), and the measurement a report gives a run that a sweep made.
Running the configurations is :mod:`holoprof.workflows.sweep`."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from holoprof.analyze.memory import memory_stats
from holoprof.analyze.stats import mean_interval, steady, throughput_test
from holoprof.analyze.steps import loader_config, step_durations, step_processes, step_stats
from holoprof.store.reader import load
from holoprof.store.sidefiles import sweep_of

SCHEMA = "holoprof.sweep/1"
FITS_FRACTION = 0.90
BATCH_NAMES = ("batch_size", "batch", "bs", "batchsize", "mini_batch", "micro_batch_size")


@dataclass
class SweepRow:
    params: dict[str, str]
    status: str  # ok | timeout | oom | failed
    exit_code: int
    run_dir: str
    log: str
    wall_s: float
    steps: int = 0
    step_median_s: float = 0.0
    step_mean_s: float = 0.0  # the steady mean step: what the throughput follows
    steps_per_s: float = 0.0
    batch_size: int | None = None
    throughput: float = 0.0
    throughput_unit: str = "steps/s"
    peak_bytes: int = 0
    limit_bytes: int = 0
    device: str = ""
    categories: dict[str, int] = field(default_factory=dict)
    error: str = ""
    fits: bool = False
    knobs: dict[str, str] = field(default_factory=dict)  # the --set values of this configuration
    applied: dict[str, Any] = field(default_factory=dict)  # what the job's agent recorded applying
    loader: dict[str, Any] = field(default_factory=dict)  # the training DataLoader as the job built it
    step_ci_s: list[float] = field(default_factory=list)  # 95% interval of the steady mean step
    # from the step's interval; its upper end is None (unbounded) when that interval reaches 0
    throughput_ci: list[float | None] = field(default_factory=list)
    durations_s: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params.items())


@dataclass
class SweepResult:
    command: list[str]
    params: dict[str, list[str]]
    out_dir: str
    steps_limit: int | None
    max_seconds: float | None
    rows: list[SweepRow]
    recommended: int | None  # index into rows
    reason: str
    knobs: dict[str, list[str]] = field(default_factory=dict)
    comparisons: list[dict[str, Any]] = field(default_factory=list)  # the best against others

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "command": self.command,
            "params": {**self.params, **self.knobs},
            "knobs": self.knobs,
            "comparisons": self.comparisons,
            "out_dir": self.out_dir,
            "steps_limit": self.steps_limit,
            "max_seconds": self.max_seconds,
            "rows": [
                {**{k: v for k, v in asdict(r).items() if k != "durations_s"}, "label": r.label}
                for r in self.rows
            ],
            "recommended": None if self.recommended is None else self.rows[self.recommended].params,
            "recommended_index": self.recommended,
            "reason": self.reason,
        }


def batch_param(params: dict[str, str]) -> str | None:
    for k in params:
        if k.lower() in BATCH_NAMES:
            return k
    return None


def analyze_config(row: SweepRow) -> SweepRow:
    """Fill ``row`` with step time, throughput and memory from its run directory (if it has steps)."""
    if not os.path.isfile(os.path.join(row.run_dir, "manifest.json")):
        return row
    run = load(row.run_dir)
    try:
        procs = step_processes(run)
        main = procs[0] if procs else None
        if main is not None:
            st = step_stats(run, main, timeline_points=1)
            row.steps = st.count
            row.step_median_s = st.median_s
            row.durations_s = step_durations(run)
            ss = steady(row.durations_s)
            row.step_mean_s = sum(ss) / len(ss) if ss else 0.0
            row.steps_per_s = 1.0 / row.step_mean_s if row.step_mean_s > 0 else 0.0
            lo, hi = mean_interval(ss)
            row.step_ci_s = [round(lo, 6), round(hi, 6)]
            row.applied = applied_knobs(run, main)
            row.loader = {
                k: v
                for k, v in loader_config(run, main).items()
                if k in ("num_workers", "batch_size", "prefetch_factor", "pin_memory", "persistent_workers")
            }
            bp = batch_param(row.params)
            batch: int | None = None
            if bp is not None:
                try:
                    batch = int(float(row.params[bp]))
                except ValueError:
                    batch = None
            if batch is None:
                b = row.loader.get("batch_size")
                batch = int(b) if isinstance(b, (int, float)) and b > 0 else None
            row.batch_size = batch
            per = float(batch) if batch else 1.0
            row.throughput_unit = "samples/s" if batch else "steps/s"
            row.throughput = row.steps_per_s * per
            row.throughput_ci = [
                round(per / hi, 4) if hi > 0 else 0.0,
                round(per / lo, 4) if lo > 0 else None,
            ]
        ms = memory_stats(run, main)
        if ms is not None:
            row.peak_bytes = ms.peak_bytes
            row.limit_bytes = ms.limit_bytes
            row.device = ms.device
            row.categories = dict(ms.categories or ms.peak.categories)
    finally:
        run.con.close()
    row.fits = (
        row.status in ("ok", "timeout")
        and row.steps > 0
        and (row.limit_bytes <= 0 or row.peak_bytes < FITS_FRACTION * row.limit_bytes)
    )
    return row


def applied_knobs(run: Any, main: Any) -> dict[str, Any]:
    """The knobs the job's agent recorded applying (its process row's ``info["knobs"]``)."""
    rows = run.rows(
        "SELECT info FROM processes WHERE host = ? AND pid = ? ORDER BY updated_ns DESC LIMIT 1",
        [main.host, main.pid],
    )
    try:
        info = json.loads(rows[0][0]) if rows and rows[0][0] else {}
    except ValueError:
        return {}
    knobs = info.get("knobs") if isinstance(info, dict) else None
    return knobs if isinstance(knobs, dict) else {}


def compare_best(rows: list[SweepRow], best: int | None) -> list[dict[str, Any]]:
    """The best configuration's steps against the runner-up's and the first configuration's, with the
    diff's significance test (B = the best)."""
    if best is None:
        return []
    fit = sorted((i for i, r in enumerate(rows) if r.fits and r.throughput > 0 and i != best),
                 key=lambda i: -rows[i].throughput)  # fmt: skip
    others = ([fit[0]] if fit else []) + (
        [0] if best != 0 and rows[0].durations_s and (not fit or fit[0] != 0) else []
    )
    out = []
    for i in others:
        t = throughput_test(rows[i].durations_s, rows[best].durations_s)
        out.append(
            {
                "against": rows[i].label,
                "against_index": i,
                "role": "runner-up" if fit and i == fit[0] else "first",
                "significant": t.significant and t.direction == "faster",
                "mean_change": t.mean_change,
                "median_change": t.median_change,
                "p_value": t.p_value,
                "verdict": t.verdict.replace("B is", "the best is"),
            }
        )
    return out


def recommend(rows: list[SweepRow]) -> tuple[int | None, str]:
    fit = [i for i, r in enumerate(rows) if r.fits and r.throughput > 0]
    if not fit:
        return None, "no configuration finished with steps that fit in memory"
    best = max(fit, key=lambda i: rows[i].throughput)
    r = rows[best]
    others = [rows[i].throughput for i in fit if i != best]
    vs = f" ({r.throughput / max(others):.2f}× the next best)" if others and max(others) > 0 else ""
    bad = [x.label for x in rows if x.status in ("oom", "failed")]
    tail = f"; {len(bad)} configuration(s) failed or ran out of memory: {'; '.join(bad)}" if bad else ""
    return (
        best,
        f"{r.label}: the best throughput, {r.throughput:.1f} {r.throughput_unit}{vs}, that fits{tail}",
    )


def step_of(row: dict[str, Any]) -> float:
    """A sweep row's step time: its steady mean (a sweep.json written before it had one: the median)."""
    return float(row.get("step_mean_s") or row.get("step_median_s") or 0.0)


def measurement(doc: dict[str, Any], this: int) -> dict[str, Any] | None:
    """What a sweep measured for its row ``this``: the best configuration's step against this one's,
    with their 95% intervals and the diff's verdict; ``gain`` is the saving when it is significant."""
    rows = doc["rows"]
    best = doc.get("recommended_index")
    if best is None or not 0 <= this < len(rows) or rows[this]["steps"] == 0:
        return None
    b, t = rows[best], rows[this]
    comp = next((c for c in doc.get("comparisons") or [] if c["against_index"] == this), None)
    significant = bool(comp and comp["significant"])
    bs, ts = step_of(b), step_of(t)
    gain = 1 - bs / ts if significant and ts > 0 else 0.0
    return {
        "sweep": doc["out_dir"],
        "this": t["label"],
        "this_step_s": ts,
        "this_interval_s": t.get("step_ci_s") or [],
        "best": b["label"],
        "best_step_s": bs,
        "best_interval_s": b.get("step_ci_s") or [],
        "significant": significant or this == best,
        "p_value": comp["p_value"] if comp else None,
        "verdict": comp["verdict"] if comp else ("this is the best configuration" if this == best else ""),
        "gain": round(max(0.0, gain), 4),
    }


def measured_gain(run_dir: str) -> dict[str, Any] | None:
    """For a run made by a sweep (its folder holds ``sweep.json``): what the sweep measured, as
    :func:`measurement` gives it; None for other runs."""
    found = sweep_of(run_dir)
    return measurement(*found) if found is not None else None
