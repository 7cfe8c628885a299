"""`holoprof diff RUN_A RUN_B [--json]`: what changed between two runs, and whether it is real.

Compared side by side: step time (median, p90, mean) with a Mann-Whitney U test on the two step-time
distributions, phase shares, throughput, I/O and memory totals (when the runs have them) and findings
(present in A, in B, or both). JSON output: ``"schema": "holoprof.diff/1"``.

The same question is asked of the steady mean step (``steady`` in the JSON): the throughput, all
steps but the first 2, tested by Mann-Whitney U on block means of consecutive steps. When steps
alternate — a loop fed by DataLoader workers makes a short step with a ready batch, then waits — the
median can be several times shorter than the mean, and the two verdicts can differ: the steady one is
the time the job takes.

Step times come from the ``step`` spans of each run's main training loop (the process with the most
steps, :func:`holoprof.analyze.steps.step_processes`).

The test (two-sided, normal approximation with the tie correction) asks whether a step of B tends to
take longer or shorter than a step of A. A change is called **significant** when its p-value is below
``alpha`` (0.01) *and* the medians differ by at least ``min_effect`` (5% of A's median by default): with
thousands of steps the test finds differences far too small to matter (a machine's background load
moves step times by a percent or two between runs), and the minimum effect keeps those out. The
p-value and the statistical verdict alone are in the JSON too.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from holoprof import model
from holoprof.analyze.report import build_report
from holoprof.analyze.stats import (
    ALPHA,
    MIN_EFFECT,
    StepTest,
    mann_whitney_u,
    quantile,
    relative_change,
    throughput_test,
    verdict_of,
)
from holoprof.analyze.steps import step_durations
from holoprof.errors import HoloprofError
from holoprof.store.pack import open_run
from holoprof.store.reader import Run, load

DIFF_SCHEMA = "holoprof.diff/1"
MIN_STEPS = 2


@dataclass
class Side:
    dir: str
    name: str | None
    command: list[str]
    status: str
    duration_s: float
    steps: int
    median_s: float
    p90_s: float
    mean_s: float
    per_s: float


@dataclass
class Diff:
    a: Side
    b: Side
    steps: StepTest
    phases: dict[str, dict[str, float]]
    throughput: dict[str, float | None]
    io: dict[str, dict[str, float | None]]
    memory: dict[str, dict[str, float | None]]
    findings: list[dict[str, Any]]
    stages: list[dict[str, Any]] = field(default_factory=list)
    # the steady mean step (the throughput): the same question as ``steps``, asked of block means; it
    # is the one to trust when steps alternate (DataLoader workers), where medians mislead
    steady: StepTest | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": DIFF_SCHEMA, **asdict(self)}


def _side(run: Run, doc: dict[str, Any], durations: list[float]) -> Side:
    r = doc["run"]
    st = doc["steps"]
    return Side(
        dir=run.path,
        name=r.get("name"),
        command=list(r.get("command") or []),
        status=str(r.get("status")),
        duration_s=float(r.get("duration_s") or 0),
        steps=len(durations),
        median_s=quantile(durations, 0.5),
        p90_s=quantile(durations, 0.9),
        mean_s=sum(durations) / len(durations) if durations else 0.0,
        per_s=float(st.get("per_s") or 0),
    )


def _step_test(da: list[float], db: list[float], alpha: float, min_effect: float) -> StepTest:
    ma, mb = quantile(da, 0.5), quantile(db, 0.5)
    med = relative_change(ma, mb) if da and db else None
    p90 = relative_change(quantile(da, 0.9), quantile(db, 0.9)) if da and db else None
    if len(da) < MIN_STEPS or len(db) < MIN_STEPS:
        return StepTest(
            "mann-whitney-u", alpha, min_effect, None, None, None, None, False, False, med, p90, "unknown",
            f"not enough steps to compare ({len(da)} in A, {len(db)} in B; {MIN_STEPS} or more each needed)",
        )  # fmt: skip
    mw = mann_whitney_u(da, db)
    stat, sig, direction, verdict = verdict_of("median step", med, mw.p_value, alpha, min_effect)
    return StepTest(
        "mann-whitney-u", alpha, min_effect, mw.u, round(mw.z, 4), mw.p_value, round(mw.prob_b_longer, 4),
        stat, sig, med, p90, direction, verdict,
    )  # fmt: skip


def _numbers(section: dict[str, Any], keys: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for k in keys:
        v = section.get(k) if isinstance(section, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = float(v)
    return out


def _pairs(a: dict[str, float], b: dict[str, float]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for k in list(a) + [k for k in b if k not in a]:
        va, vb = a.get(k), b.get(k)
        out[k] = {"a": va, "b": vb, "change": relative_change(va, vb)}
    return out


IO_KEYS = ("bytes_read", "bytes_written", "files", "reads", "writes", "bandwidth_read_bytes_per_s")
MEMORY_KEYS = ("peak_bytes",)


def compare(run_a: Run, run_b: Run, alpha: float = ALPHA, min_effect: float = MIN_EFFECT) -> Diff:
    """Compare two loaded runs (pure: reads the runs, returns the comparison)."""
    doc_a, doc_b = build_report(run_a), build_report(run_b)
    da, db = step_durations(run_a), step_durations(run_b)
    a, b = _side(run_a, doc_a, da), _side(run_b, doc_b, db)
    test = _step_test(da, db, alpha, min_effect)
    phases = {}
    for p in model.PHASES:
        fa = float(doc_a["phases"].get(p, {}).get("fraction", 0) or 0)
        fb = float(doc_b["phases"].get(p, {}).get("fraction", 0) or 0)
        ma = float(doc_a["phases"].get(p, {}).get("median_s", 0) or 0)
        mb = float(doc_b["phases"].get(p, {}).get("median_s", 0) or 0)
        phases[p] = {"a": fa, "b": fb, "delta": round(fb - fa, 6), "median_s_a": ma, "median_s_b": mb}
    throughput = {"a": a.per_s, "b": b.per_s, "change": relative_change(a.per_s, b.per_s)}
    io = _pairs(_numbers(doc_a.get("io") or {}, IO_KEYS), _numbers(doc_b.get("io") or {}, IO_KEYS))
    mem_a = _numbers(doc_a.get("memory") or {}, MEMORY_KEYS)
    mem_b = _numbers(doc_b.get("memory") or {}, MEMORY_KEYS)
    for doc, out in ((doc_a, mem_a), (doc_b, mem_b)):
        for cat, val in ((doc.get("memory") or {}).get("categories") or {}).items():
            if isinstance(val, (int, float)):
                out[f"{cat}_bytes"] = float(val)
        rss = (doc.get("resources") or {}).get("summary", {}).get("job.rss_bytes")
        if rss:
            out["job_rss_max_bytes"] = float(rss.get("max", 0))
    memory = _pairs(mem_a, mem_b)
    found_a: dict[str, dict[str, Any]] = {f["id"]: f for f in doc_a["findings"]}
    found_b: dict[str, dict[str, Any]] = {f["id"]: f for f in doc_b["findings"]}
    findings = []
    for fid in list(found_a) + [k for k in found_b if k not in found_a]:
        x, y = found_a.get(fid), found_b.get(fid)
        status = "both" if x and y else ("resolved" if x else "new")
        findings.append(
            {
                "id": fid,
                "status": status,
                "a": x["severity"] if x else None,
                "b": y["severity"] if y else None,
                "title_a": x["title"] if x else None,
                "title_b": y["title"] if y else None,
            }
        )
    stages = []
    sa = {s["name"]: s for s in doc_a.get("stages") or []}
    sb = {s["name"]: s for s in doc_b.get("stages") or []}
    for name in list(sa) + [k for k in sb if k not in sa]:
        x, y = sa.get(name), sb.get(name)
        wa = float(x["wall_s"]) if x else None
        wb = float(y["wall_s"]) if y else None
        stages.append({"name": name, "wall_s_a": wa, "wall_s_b": wb, "change": relative_change(wa, wb)})
    return Diff(
        a,
        b,
        test,
        phases,
        throughput,
        io,
        memory,
        findings,
        stages,
        throughput_test(da, db, alpha, min_effect),
    )


def diff_runs(
    path_a: str | os.PathLike[str],
    path_b: str | os.PathLike[str],
    alpha: float = ALPHA,
    min_effect: float = MIN_EFFECT,
) -> Diff:
    """Load and compare two runs (directories or packs); refuses a run compared with itself."""
    ra, rb = os.path.realpath(os.fspath(path_a)), os.path.realpath(os.fspath(path_b))
    for p in (ra, rb):
        if not os.path.exists(p):
            raise HoloprofError(f"{p} does not exist; pass two run directories (or packs) to compare")
    if ra == rb:
        raise HoloprofError(
            f"both runs are {ra}; compare two different runs, e.g. holoprof diff runs/before runs/after"
        )
    run_a, run_b = load(open_run(ra)), load(open_run(rb))
    return compare(run_a, run_b, alpha, min_effect)
