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

import argparse
import itertools
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from holoprof import model
from holoprof.errors import HoloprofError
from holoprof.store.reader import Run

DIFF_SCHEMA = "holoprof.diff/1"
ALPHA = 0.01
MIN_EFFECT = 0.05
MIN_STEPS = 2


# --- the test --------------------------------------------------------------------------------------------
@dataclass
class MannWhitney:
    u: float  # U statistic of sample B (how often a B step is longer than an A step; ties count 1/2)
    z: float
    p_value: float
    n_a: int
    n_b: int
    prob_b_longer: float  # U / (n_a n_b): the probability that a B step outlasts an A step


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney_u(a: list[float], b: list[float]) -> MannWhitney:
    """Two-sided Mann-Whitney U test with the normal approximation (tie-corrected, with continuity
    correction). Suits samples of ~20 or more each; step counts are usually far larger."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        raise ValueError("both samples need at least one value")
    combined = sorted([(v, 0) for v in a] + [(v, 1) for v in b])
    n = n1 + n2
    rank_sum_b = 0.0
    tie_term = 0.0
    i = 0
    while i < n:
        j = i
        while j + 1 < n and combined[j + 1][0] == combined[i][0]:
            j += 1
        avg_rank = (i + j) / 2.0 + 1.0
        t = j - i + 1
        if t > 1:
            tie_term += t**3 - t
        for k in range(i, j + 1):
            if combined[k][1] == 1:
                rank_sum_b += avg_rank
        i = j + 1
    u_b = rank_sum_b - n2 * (n2 + 1) / 2.0
    mean_u = n1 * n2 / 2.0
    var_u = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if var_u <= 0:
        z, p = 0.0, 1.0
    else:
        diff = u_b - mean_u
        cc = 0.5 if diff > 0 else (-0.5 if diff < 0 else 0.0)
        z = (diff - cc) / math.sqrt(var_u)
        p = min(1.0, 2.0 * _normal_sf(abs(z)))
    return MannWhitney(u=u_b, z=z, p_value=p, n_a=n1, n_b=n2, prob_b_longer=u_b / (n1 * n2))


# --- the comparison ------------------------------------------------------------------------------------
def _quantile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def step_durations(run: Run) -> list[float]:
    """Durations (seconds) of the main training loop's steps, in step order."""
    from holoprof.analyze.steps import step_processes

    procs = step_processes(run)
    if not procs:
        return []
    p = procs[0]
    rows = run.rows(
        """SELECT (end_ns - start_ns) / 1e9 FROM spans
           WHERE kind = 'step' AND host = ? AND pid = ? AND end_ns >= start_ns ORDER BY step, start_ns""",
        [p.host, p.pid],
    )
    return [float(r[0]) for r in rows]


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
class StepTest:
    method: str
    alpha: float
    min_effect: float
    u: float | None
    z: float | None
    p_value: float | None
    prob_b_longer: float | None
    statistically_significant: bool
    significant: bool
    median_change: float | None  # (B - A) / A
    p90_change: float | None
    direction: str  # slower | faster | unchanged | unknown
    verdict: str
    mean_change: float | None = None  # (B - A) / A of the steady mean step (throughput_test)
    mean_a_s: float | None = None  # the steady mean steps (throughput_test)
    mean_b_s: float | None = None


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


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return (b - a) / a


# --- the steady step: throughput, for loops whose steps are not alike -----------------------------------
#: Steps left out at the start of a run: the first batches start the DataLoader workers and warm the
#: allocators, and are not the loop's steady pace.
WARMUP_STEPS = 2
#: Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)  # fmt: skip


def steady(durations: list[float]) -> list[float]:
    """The steps of a run's steady state: all but the first :data:`WARMUP_STEPS` when enough remain."""
    return list(durations[WARMUP_STEPS:]) if len(durations) >= 3 * WARMUP_STEPS + 2 else list(durations)


def block_means(xs: list[float], max_blocks: int = 10, min_size: int = 4) -> list[float]:
    """Means of consecutive blocks of ``xs`` (at most ``max_blocks``, of ``min_size`` steps or more).

    Steps of a loop fed by DataLoader workers are not alike: a batch that was ready makes a short step,
    the next one waits for a worker, and the pattern repeats with the number of workers. The mean step
    (the throughput) is what the job gets; blocks of consecutive steps each span such patterns, so
    their means are close to independent samples of it, where single steps are not (batch means)."""
    n = len(xs)
    k = max(1, min(max_blocks, n // min_size))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [sum(xs[a:b]) / (b - a) for a, b in itertools.pairwise(bounds) if b > a]


def mean_interval(xs: list[float]) -> tuple[float, float]:
    """95% confidence interval of the mean of ``xs`` from its block means (Student's t); the range of
    the block means when there are fewer than 3 blocks."""
    bm = block_means(xs)
    if not bm:
        return 0.0, 0.0
    m = sum(bm) / len(bm)
    if len(bm) < 3:
        return min(bm), max(bm)
    sd = math.sqrt(sum((v - m) ** 2 for v in bm) / (len(bm) - 1))
    half = _T95[min(len(bm) - 2, len(_T95) - 1)] * sd / math.sqrt(len(bm))
    return max(0.0, m - half), m + half


def throughput_test(
    da: list[float], db: list[float], alpha: float = ALPHA, min_effect: float = MIN_EFFECT
) -> StepTest:
    """Is B's steady mean step (its throughput) different from A's? Mann-Whitney U on the block means of
    the two runs' steady steps; significant when p < ``alpha`` and the means differ by ``min_effect``."""
    sa, sb = steady(da), steady(db)
    ma, mb = (sum(sa) / len(sa), sum(sb) / len(sb)) if sa and sb else (0.0, 0.0)
    mean = _rel(ma, mb) if sa and sb else None
    med = _rel(_quantile(sa, 0.5), _quantile(sb, 0.5)) if sa and sb else None
    p90 = _rel(_quantile(sa, 0.9), _quantile(sb, 0.9)) if sa and sb else None
    ba, bb = block_means(sa), block_means(sb)
    method = "mann-whitney-u on block means of the steady steps"
    if len(ba) < 3 or len(bb) < 3:
        return StepTest(
            method, alpha, min_effect, None, None, None, None, False, False, med, p90, "unknown",
            f"not enough steps to compare ({len(sa)} and {len(sb)} steady steps; 12 or more each needed)",
            mean, ma if sa else None, mb if sb else None,
        )  # fmt: skip
    mw = mann_whitney_u(ba, bb)
    stat, sig, direction, verdict = _verdict("mean step", mean, mw.p_value, alpha, min_effect)
    return StepTest(
        method, alpha, min_effect, mw.u, round(mw.z, 4), mw.p_value, round(mw.prob_b_longer, 4),
        stat, sig, med, p90, direction, verdict, mean, ma, mb,
    )  # fmt: skip


def _verdict(
    what: str, change: float | None, p: float, alpha: float, min_effect: float
) -> tuple[bool, bool, str, str]:
    """(statistically significant, significant, direction, verdict) of a test of ``what`` whose
    relative change (B - A) / A is ``change`` and p-value ``p``."""
    stat = p < alpha
    sig = stat and change is not None and abs(change) >= min_effect
    direction = ("slower" if change is not None and change > 0 else "faster") if sig else "unchanged"
    pct = f"{100 * change:+.1f}%" if change is not None else "?"
    if sig:
        verdict = f"B is {direction}: {what} {pct} (p={p:.2g} < {alpha})"
    elif stat:
        verdict = (
            f"a statistically detectable but small change: {what} {pct}, below the {100 * min_effect:.0f}% "
            f"minimum effect (p={p:.2g})"
        )
    else:
        verdict = f"no significant change: {what} {pct} (p={p:.2g} ≥ {alpha})"
    return stat, sig, direction, verdict


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
        median_s=_quantile(durations, 0.5),
        p90_s=_quantile(durations, 0.9),
        mean_s=sum(durations) / len(durations) if durations else 0.0,
        per_s=float(st.get("per_s") or 0),
    )


def _step_test(da: list[float], db: list[float], alpha: float, min_effect: float) -> StepTest:
    ma, mb = _quantile(da, 0.5), _quantile(db, 0.5)
    med = _rel(ma, mb) if da and db else None
    p90 = _rel(_quantile(da, 0.9), _quantile(db, 0.9)) if da and db else None
    if len(da) < MIN_STEPS or len(db) < MIN_STEPS:
        return StepTest(
            "mann-whitney-u", alpha, min_effect, None, None, None, None, False, False, med, p90, "unknown",
            f"not enough steps to compare ({len(da)} in A, {len(db)} in B; {MIN_STEPS} or more each needed)",
        )  # fmt: skip
    mw = mann_whitney_u(da, db)
    stat, sig, direction, verdict = _verdict("median step", med, mw.p_value, alpha, min_effect)
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
        out[k] = {"a": va, "b": vb, "change": _rel(va, vb)}
    return out


IO_KEYS = ("bytes_read", "bytes_written", "files", "reads", "writes", "bandwidth_read_bytes_per_s")
MEMORY_KEYS = ("peak_bytes",)


def compare(run_a: Run, run_b: Run, alpha: float = ALPHA, min_effect: float = MIN_EFFECT) -> Diff:
    """Compare two loaded runs (pure: reads the runs, returns the comparison)."""
    from holoprof.analyze.report import build_report

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
    throughput = {"a": a.per_s, "b": b.per_s, "change": _rel(a.per_s, b.per_s)}
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
        stages.append({"name": name, "wall_s_a": wa, "wall_s_b": wb, "change": _rel(wa, wb)})
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
    from holoprof.store.pack import open_run
    from holoprof.store.reader import load

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


# --- the command -----------------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    from holoprof.cli import finite_float

    parser.add_argument("run_a", help="the baseline run (directory or .holoprof pack)")
    parser.add_argument("run_b", help="the run to compare with it")
    parser.add_argument("--json", action="store_true", help=f"print the comparison as JSON ({DIFF_SCHEMA})")
    parser.add_argument(
        "--alpha", type=finite_float, default=ALPHA, help=f"significance level of the test (default {ALPHA})"
    )
    parser.add_argument(
        "--min-effect",
        type=finite_float,
        default=MIN_EFFECT,
        help=f"smallest relative change of the median step called significant (default {MIN_EFFECT})",
    )


def main(args: argparse.Namespace) -> int:
    import json
    import sys

    if not 0 < args.alpha < 1:
        raise HoloprofError("--alpha must be between 0 and 1, e.g. 0.01")
    if args.min_effect < 0:
        raise HoloprofError("--min-effect must be 0 or more, e.g. 0.03 for 3%")
    d = diff_runs(args.run_a, args.run_b, args.alpha, args.min_effect)
    if args.json:
        json.dump(d.to_dict(), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    from holoprof.present.diff import render_diff

    render_diff(d.to_dict())
    return 0
