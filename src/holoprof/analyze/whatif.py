"""What if this training ran data-parallel on N workers over a network of bandwidth B?

A pure model, fed by one measured run (a single process is enough):

* per parameter, its gradient bytes and the time at which backward produced its gradient, from the
  ``grad_ready`` spans of the sampled steps (median over them, relative to the start of backward);
* the step time ``T1`` and the backward time ``Tb`` (medians of the measured steps).

For N workers (weak scaling: each worker keeps the measured per-worker batch), gradients are packed
into DDP-style buckets in the order backward produces them (reverse layer order), the first bucket
capped at 1 MiB and the others at ``bucket_mb`` (DDP's defaults). Bucket ``i`` is ready when its last
gradient is; its ring allreduce costs ``2(N-1)/N * bytes / bandwidth + 2(N-1) * latency`` and starts
when it is ready and the previous bucket's allreduce is done (one communication stream). Allreduce
overlaps the rest of backward; what remains after backward is exposed:
``T_N = T1 + max(0, end of the last allreduce - Tb)``. Throughput is ``N * batch / T_N`` samples/s
(steps/s when the batch size is unknown), scaling efficiency ``T1 / T_N``. The minimum bandwidth at
which N workers beat one is where ``N / T_N = 1 / T1``, solved by bisection (the model is monotone
in bandwidth). See docs/distributed.md for the assumptions.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from holoprof.analyze.comm import load_proc
from holoprof.analyze.steps import NS, ProcKey, loader_config, step_processes, step_stats
from holoprof.errors import HoloprofError
from holoprof.store.reader import Run

SCHEMA = "holoprof.whatif/1"
FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
DEFAULT_BUCKET_MB = 25.0
DEFAULT_LATENCY_S = 50e-6
DEFAULT_WORKERS = (2, 4, 8, 16)
DEFAULT_BANDWIDTHS = ("1Gbit", "10Gbit", "25Gbit", "100Gbit")

_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 1024.0, "mi": 1024.0**2, "gi": 1024.0**3}
_LAT_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


# --- parsing user input ------------------------------------------------------------------------------
def parse_bandwidth(text: str) -> float:
    """'10Gbit', '100Mbit/s', '25Gbps', '1.25GB/s', '512MiB/s' -> bytes per second (b: bits, B: bytes)."""
    t = text.strip().replace(" ", "")
    if t.startswith("-"):
        raise HoloprofError(f"bandwidth {text!r} must be positive, e.g. 10Gbit")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)([A-Za-z]*)(/s)?", t)
    value: float | None = None
    if m:
        unit = m.group(2)
        if unit.endswith("bps"):
            unit = unit[:-3] + "bit"
        elif unit.endswith("Bps"):
            unit = unit[:-3] + "B"
        factor: float | None = None
        if unit.lower().endswith("bit"):
            pre = unit[:-3].lower()
            factor = _PREFIX[pre] / 8 if pre in _PREFIX else None
        elif unit.endswith("b"):
            pre = unit[:-1].lower()
            factor = _PREFIX[pre] / 8 if pre in _PREFIX else None
        elif unit.endswith("B"):
            pre = unit[:-1].lower()
            factor = _PREFIX.get(pre)
        if factor is not None:
            value = float(m.group(1)) * factor
    if value is None:
        raise HoloprofError(
            f"cannot read bandwidth {text!r}; write a positive number with a unit, e.g. 100Mbit, 10Gbit, "
            "25Gbps or 1.25GB/s (bits: bit kbit Mbit Gbit Tbit; bytes: B KB MB GB KiB MiB GiB)"
        )
    if not value > 0 or math.isinf(value):
        raise HoloprofError(f"bandwidth {text!r} must be positive, e.g. 10Gbit")
    return value


def parse_latency(text: str) -> float:
    """'50us', '0.2ms', '0' -> seconds."""
    t = text.strip().replace(" ", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)(s|ms|us|µs|ns)?", t)
    if not m or (m.group(2) is None and float(m.group(1)) != 0):
        raise HoloprofError(
            f"cannot read latency {text!r}; write a number with a unit (s, ms, us, ns), e.g. 50us or 0.2ms"
        )
    return float(m.group(1)) * _LAT_UNITS[m.group(2) or "s"]


def parse_workers(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            n = int(part)
        except ValueError:
            raise HoloprofError(f"cannot read worker count {part!r} in --workers {text!r}; use e.g. 2,4,8,16")
        if n < 1:
            raise HoloprofError(f"--workers needs counts of at least 1 (got {n}); use e.g. 2,4,8,16")
        out.append(n)
    if not out:
        raise HoloprofError("--workers is empty; use e.g. 2,4,8,16")
    return sorted(set(out))


def format_bandwidth(bps: float) -> str:
    bits = bps * 8
    for unit, k in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bits >= k:
            v = bits / k
            return f"{v:.3g} {unit}"
    return f"{bits:.3g} bit/s"


# --- the measured inputs -------------------------------------------------------------------------------
@dataclass
class Param:
    name: str
    bytes: int
    ready_s: float  # median time after the start of backward at which its gradient was produced


@dataclass
class Measured:
    run: str
    process: dict[str, Any]
    step_s: float
    backward_s: float
    batch_size: int | None
    sampled_steps: list[int]
    params: list[Param]  # in the order backward produces them
    removed_comm_s: float = 0.0  # exposed communication taken out of a data-parallel run's step

    @property
    def grad_bytes(self) -> int:
        return sum(p.bytes for p in self.params)


def measure(run: Run) -> Measured:
    """The inputs of the model from ``run`` (its main training process)."""
    procs = step_processes(run)
    if not procs:
        raise HoloprofError(
            f"{run.path} has no training steps; trace a run that trains (optimizer.step()) for at least "
            "5 steps, e.g. holoprof run -- python train.py"
        )
    main = procs[0]
    rows = run.con.execute(
        """SELECT g.step, json_extract_string(g.attrs, '$.param'),
                  try_cast(json_extract(g.attrs, '$.bytes') AS BIGINT), g.start_ns, b.t0
           FROM spans g JOIN (SELECT step, min(start_ns) AS t0 FROM spans
                              WHERE kind = 'phase' AND name = 'backward' AND host = $host AND pid = $pid
                              GROUP BY step) b USING (step)
           WHERE g.kind = 'op' AND g.name = 'grad_ready' AND g.host = $host AND g.pid = $pid
           ORDER BY g.step, g.start_ns""",
        {"host": main.host, "pid": main.pid},
    ).fetchall()
    if not rows:
        raise HoloprofError(
            f"{run.path} has no per-layer gradient timings (grad_ready); they are sampled on steps 2-4 of "
            "a PyTorch run traced by this holoprof version: run at least 6 optimizer steps, e.g. "
            "holoprof run -- python train.py"
        )
    per: dict[str, list[float]] = {}
    nbytes: dict[str, int] = {}
    order: dict[str, list[int]] = {}
    steps: set[int] = set()
    by_step: dict[int, list[str]] = {}
    for step, name, b, t, t0 in rows:
        per.setdefault(name, []).append((int(t) - int(t0)) / NS)
        nbytes[name] = int(b or 0)
        steps.add(int(step))
        by_step.setdefault(int(step), []).append(name)
    for names in by_step.values():
        for i, n in enumerate(names):
            order.setdefault(n, []).append(i)
    params = [Param(n, nbytes[n], max(0.0, statistics.median(v))) for n, v in per.items()]
    params.sort(key=lambda p: (p.ready_s, statistics.median(order[p.name])))
    st = step_stats(run, main, timeline_points=1)
    back = [
        (int(e) - int(s)) / NS
        for s, e in run.rows(
            """SELECT min(start_ns), max(end_ns) FROM spans WHERE kind = 'phase' AND name = 'backward'
               AND host = ? AND pid = ? AND tid = ? AND step >= 0 GROUP BY step""",
            [main.host, main.pid, main.tid],
        )
    ]
    backward_s = statistics.median(back) if back else st.phases["backward"].median_s
    step_s = st.median_s
    removed = 0.0
    if main.rank >= 0:
        # a data-parallel run: take out the communication it measured, to predict from compute alone
        proc = load_proc(run, main, st)
        exposed = [proc.exposed[s] / NS for s in proc.steps]
        removed = statistics.median(exposed) if exposed else 0.0
        step_s = max(step_s - removed, step_s * 0.05)
        # nothing to take out of backward: its phase ends where its compute did (the wait for DDP's
        # allreduce after the last bucket was ready is the `communication` phase)
    return Measured(
        run=run.path,
        process={"host": main.host, "pid": main.pid, "rank": main.rank},
        step_s=step_s,
        backward_s=max(backward_s, params[-1].ready_s if params else 0.0),
        batch_size=_batch_size(run, main),
        sampled_steps=sorted(steps),
        params=params,
        removed_comm_s=removed,
    )


def _batch_size(run: Run, main: ProcKey) -> int | None:
    bs = loader_config(run, main).get("batch_size")
    if isinstance(bs, int) and bs > 0:
        return bs
    rows = run.rows(
        """SELECT try_cast(json_extract(attrs, '$.batch_size') AS BIGINT) AS b FROM spans
           WHERE kind = 'op' AND host = ? AND pid = ? AND b IS NOT NULL LIMIT 1""",
        [main.host, main.pid],
    )
    if rows and rows[0][0]:
        return int(rows[0][0])
    return None


# --- the model ---------------------------------------------------------------------------------------
@dataclass
class Bucket:
    index: int
    bytes: int
    params: int
    ready_s: float


@dataclass
class Prediction:
    workers: int
    bandwidth_bytes_per_s: float
    bandwidth: str
    step_s: float
    comm_s: float  # sum of the buckets' allreduce times
    exposed_comm_s: float
    throughput: float
    throughput_unit: str
    speedup: float
    scaling_efficiency: float


@dataclass
class MinBandwidth:
    workers: int
    beats_one_bytes_per_s: float | None  # None: latency alone makes N workers no faster than one
    beats_one: str
    efficiency_90_bytes_per_s: float | None
    efficiency_90: str


@dataclass
class WhatIf:
    schema: str
    run: str
    process: dict[str, Any]
    step_s: float
    backward_s: float
    grad_bytes: int
    params: int
    batch_size: int | None
    sampled_steps: list[int]
    removed_comm_s: float
    bucket_mb: float
    latency_s: float
    buckets: list[Bucket]
    predictions: list[Prediction]
    min_bandwidth: list[MinBandwidth]
    assumptions: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def make_buckets(params: list[Param], bucket_mb: float) -> list[Bucket]:
    cap_rest = max(1, int(bucket_mb * 1024 * 1024))
    cap = min(FIRST_BUCKET_BYTES, cap_rest)
    out: list[Bucket] = []
    cur_b = cur_n = 0
    ready = 0.0
    for p in params:
        cur_b += p.bytes
        cur_n += 1
        ready = max(ready, p.ready_s)
        if cur_b >= cap:
            out.append(Bucket(len(out), cur_b, cur_n, ready))
            cur_b = cur_n = 0
            cap = cap_rest
    if cur_n:
        out.append(Bucket(len(out), cur_b, cur_n, ready))
    return out


def allreduce_s(nbytes: int, workers: int, bandwidth: float, latency: float) -> float:
    if workers <= 1:
        return 0.0
    n = workers
    return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency


def simulate(
    step_s: float, backward_s: float, buckets: list[Bucket], workers: int, bandwidth: float, latency: float
) -> tuple[float, float, float]:
    """(step time, total allreduce time, exposed allreduce time) for ``workers`` at ``bandwidth``."""
    if workers <= 1:
        return step_s, 0.0, 0.0
    end = 0.0
    total = 0.0
    for b in buckets:
        c = allreduce_s(b.bytes, workers, bandwidth, latency)
        total += c
        end = max(end, b.ready_s) + c
    exposed = max(0.0, end - backward_s)
    return step_s + exposed, total, exposed


def _solve(pred: Any, lo: float = 1.0, hi: float = 1e15) -> float | None:
    """Smallest bandwidth (bytes/s) at which ``pred(bw)`` holds, ``pred`` monotone; None if never."""
    if not pred(hi):
        return None
    if pred(lo):
        return lo
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if pred(mid):
            hi = mid
        else:
            lo = mid
        if hi / lo < 1 + 1e-9:
            break
    return hi


def predict(
    m: Measured,
    workers: list[int],
    bandwidths: list[float],
    latency_s: float = DEFAULT_LATENCY_S,
    bucket_mb: float = DEFAULT_BUCKET_MB,
) -> WhatIf:
    if not bucket_mb > 0:
        raise HoloprofError(f"--bucket-mb must be positive (got {bucket_mb}); DDP's default is 25")
    if latency_s < 0:
        raise HoloprofError(f"--latency must not be negative (got {latency_s})")
    buckets = make_buckets(m.params, bucket_mb)
    return WhatIf(
        schema=SCHEMA,
        run=m.run,
        process=m.process,
        step_s=m.step_s,
        backward_s=m.backward_s,
        grad_bytes=m.grad_bytes,
        params=len(m.params),
        batch_size=m.batch_size,
        sampled_steps=m.sampled_steps,
        removed_comm_s=m.removed_comm_s,
        bucket_mb=bucket_mb,
        latency_s=latency_s,
        buckets=buckets,
        predictions=_predictions(m, buckets, workers, bandwidths, latency_s),
        min_bandwidth=_min_bandwidths(m, buckets, workers, latency_s),
        assumptions=_assumptions(m),
    )


def _predictions(
    m: Measured, buckets: list[Bucket], workers: list[int], bandwidths: list[float], latency_s: float
) -> list[Prediction]:
    """The step, communication and throughput of every worker count at every bandwidth."""
    t1 = m.step_s
    unit = "samples/s" if m.batch_size else "steps/s"
    per_step = float(m.batch_size) if m.batch_size else 1.0
    preds = []
    for n in workers:
        for bw in bandwidths:
            step, comm, exposed = simulate(t1, m.backward_s, buckets, n, bw, latency_s)
            thr = (n * per_step / step) if (m.batch_size and step > 0) else (1.0 / step if step > 0 else 0.0)
            preds.append(
                Prediction(
                    workers=n,
                    bandwidth_bytes_per_s=bw,
                    bandwidth=format_bandwidth(bw),
                    step_s=step,
                    comm_s=comm,
                    exposed_comm_s=exposed,
                    throughput=thr,
                    throughput_unit=unit,
                    speedup=n * t1 / step if step > 0 else 0.0,
                    scaling_efficiency=t1 / step if step > 0 else 0.0,
                )
            )
    return preds


def _min_bandwidths(
    m: Measured, buckets: list[Bucket], workers: list[int], latency_s: float
) -> list[MinBandwidth]:
    """For every worker count above one, the least bandwidth at which it beats one worker, and at
    which it scales at 90% efficiency."""
    t1 = m.step_s
    mins = []
    for n in workers:
        if n <= 1:
            continue

        def beats(bw: float, n: int = n) -> bool:
            return simulate(t1, m.backward_s, buckets, n, bw, latency_s)[0] < n * t1

        def eff90(bw: float, n: int = n) -> bool:
            return simulate(t1, m.backward_s, buckets, n, bw, latency_s)[0] * 0.9 <= t1

        b1, b9 = _solve(beats), _solve(eff90)
        mins.append(
            MinBandwidth(
                workers=n,
                beats_one_bytes_per_s=b1,
                beats_one=format_bandwidth(b1) if b1 is not None else "never (latency alone is too high)",
                efficiency_90_bytes_per_s=b9,
                efficiency_90=format_bandwidth(b9) if b9 is not None else "never (latency alone is too high)",
            )
        )
    return mins


def _assumptions(m: Measured) -> list[str]:
    return [
        "weak scaling: every worker keeps the measured per-worker batch and step compute",
        "ring allreduce per bucket: 2(N-1)/N x bytes / bandwidth + 2(N-1) x latency",
        "DDP-style buckets in gradient-ready order (first 1 MiB, then --bucket-mb), one allreduce at a time",
        "allreduce overlaps the rest of backward; only what outlasts backward adds to the step",
        "compute is not slowed by communication; no stragglers; full-duplex links at the given bandwidth",
    ] + (
        [
            f"measured on a data-parallel rank: its exposed communication ({m.removed_comm_s * 1e3:.2f} ms "
            "per step) was taken out of the step and backward times"
        ]
        if m.removed_comm_s > 0
        else []
    )


def whatif(
    run: Run,
    workers: list[int],
    bandwidths: list[float],
    latency_s: float = DEFAULT_LATENCY_S,
    bucket_mb: float = DEFAULT_BUCKET_MB,
) -> WhatIf:
    return predict(measure(run), workers, bandwidths, latency_s, bucket_mb)
