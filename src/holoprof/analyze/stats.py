"""Statistics shared by the analyses: the steady step, block means and their interval, Mann-Whitney U."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass


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


def quantile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


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
    bounds = block_bounds(len(xs), max_blocks, min_size)
    return [sum(xs[a:b]) / (b - a) for a, b in itertools.pairwise(bounds) if b > a]


def mean_interval(xs: list[float]) -> tuple[float, float]:
    """95% confidence interval of the mean of ``xs`` from its block means (Student's t); the range of
    the block means when there are fewer than 3 blocks."""
    return interval_of_block_means(block_means(xs))


def block_bounds(n: int, max_blocks: int = 10, min_size: int = 4) -> list[int]:
    """Where :func:`block_means` cuts ``n`` values: the first index of each block, then ``n``."""
    k = max(1, min(max_blocks, n // min_size))
    return [round(i * n / k) for i in range(k + 1)]


def interval_of_block_means(bm: list[float]) -> tuple[float, float]:
    """95% confidence interval of a mean from its block means (see :func:`mean_interval`)."""
    if not bm:
        return 0.0, 0.0
    m = sum(bm) / len(bm)
    if len(bm) < 3:
        return min(bm), max(bm)
    sd = math.sqrt(sum((v - m) ** 2 for v in bm) / (len(bm) - 1))
    half = _T95[min(len(bm) - 2, len(_T95) - 1)] * sd / math.sqrt(len(bm))
    return max(0.0, m - half), m + half


#: The fewest values whose median has a 95% interval narrower than their whole range.
MEDIAN_INTERVAL_MIN = 9


def median_interval_ranks(n: int) -> tuple[int, int] | None:
    """The ranks (0-based, in sorted order) of the bounds of the distribution-free 95% confidence
    interval of the median of ``n`` values (order statistics: exact binomial up to 100 values, its
    normal approximation above); None for fewer than :data:`MEDIAN_INTERVAL_MIN` values."""
    if n < MEDIAN_INTERVAL_MIN:
        return None
    if n <= 100:
        cdf, j = 0.0, 0
        while True:  # the largest j with P(Binomial(n, 1/2) < j) <= 2.5%
            cdf += math.comb(n, j) / 2.0**n
            if cdf > 0.025:
                break
            j += 1
    else:
        j = max(1, math.floor(n / 2 - 1.96 * math.sqrt(n) / 2))
    return j - 1, n - j


ALPHA = 0.01


MIN_EFFECT = 0.05


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


def relative_change(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return (b - a) / a


def throughput_test(
    da: list[float], db: list[float], alpha: float = ALPHA, min_effect: float = MIN_EFFECT
) -> StepTest:
    """Is B's steady mean step (its throughput) different from A's? Mann-Whitney U on the block means of
    the two runs' steady steps; significant when p < ``alpha`` and the means differ by ``min_effect``."""
    sa, sb = steady(da), steady(db)
    ma, mb = (sum(sa) / len(sa), sum(sb) / len(sb)) if sa and sb else (0.0, 0.0)
    mean = relative_change(ma, mb) if sa and sb else None
    med = relative_change(quantile(sa, 0.5), quantile(sb, 0.5)) if sa and sb else None
    p90 = relative_change(quantile(sa, 0.9), quantile(sb, 0.9)) if sa and sb else None
    ba, bb = block_means(sa), block_means(sb)
    method = "mann-whitney-u on block means of the steady steps"
    if len(ba) < 3 or len(bb) < 3:
        return StepTest(
            method, alpha, min_effect, None, None, None, None, False, False, med, p90, "unknown",
            f"not enough steps to compare ({len(sa)} and {len(sb)} steady steps; 12 or more each needed)",
            mean, ma if sa else None, mb if sb else None,
        )  # fmt: skip
    mw = mann_whitney_u(ba, bb)
    stat, sig, direction, verdict = verdict_of("mean step", mean, mw.p_value, alpha, min_effect)
    return StepTest(
        method, alpha, min_effect, mw.u, round(mw.z, 4), mw.p_value, round(mw.prob_b_longer, 4),
        stat, sig, med, p90, direction, verdict, mean, ma, mb,
    )  # fmt: skip


def verdict_of(
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
