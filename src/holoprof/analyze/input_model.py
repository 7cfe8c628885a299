"""The input-pipeline model: the step time with N DataLoader workers on this machine.

Stated with its assumptions in docs/input-pipeline.md. In short, from one run it measures (medians
over the training loop's steps):

* ``step_s`` (S0), ``wait_s`` (the data_wait per step) and ``compute_s = step_s - wait_s``;
* ``loader_cpu_s`` / ``loader_wall_s`` / ``loader_runq_s``: CPU time, wall time, and the part of it
  spent waiting for a CPU, of loading one batch (the dataset fetch: ``__getitem__`` and collate), in
  the training process or in the workers;
* ``ipc_cpu_s``: CPU the training process spends receiving one batch from a worker (measured when the
  run has workers; :data:`IPC_DEFAULT_S` otherwise);
* ``compute_cpu_s``: CPU of the training process per step outside the loader (all its threads);
* ``cores`` (affinity and cgroup quota) and ``others_runnable`` (threads of other processes that
  competed for them: from the training thread's run-queue wait, or the CPU samples), ``torch_threads``,
  ``gpu``.

and predicts the steady step with N workers as the largest of three bounds::

    main      compute_base + ipc                 the training loop itself, batches ready
    loaders   loader_wall / N                    N workers each making one batch per loader_wall
    cores     (compute_cpu + ipc + loader_cpu) / (available * efficiency)   all CPU work shares them

where ``available`` is the job's fair share of its cores beside the other processes' runnable
threads, given its own busy threads (compute threads plus busy workers).

``efficiency`` is 1 while the runnable threads (the training process's busy threads plus the busy
workers) fit in the cores, and :data:`OVERSUBSCRIBED_EFFICIENCY` when they do not: torch's
intra-op threads wait for each other at every parallel region, so a core taken by a worker stalls
the whole region. With N = 0, the step is ``compute_base + loader_wall``.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, replace
from typing import Any

from holoprof import model
from holoprof.analyze.stats import WARMUP_STEPS, mean_interval, steady
from holoprof.analyze.steps import ProcKey, StepStats
from holoprof.store.reader import Run

NS = 1e9
#: CPU the training process spends per batch received from a worker when the run had none to
#: measure it (unpickling the batch's tensors from shared memory; a chosen default, see
#: docs/input-pipeline.md).
IPC_DEFAULT_S = 0.0004
#: Share of the cores' time that does useful work when more threads want to run than there are
#: cores (a chosen constant that benchmarks/bench_input_model.py checks; docs/input-pipeline.md).
OVERSUBSCRIBED_EFFICIENCY = 0.8
#: Smallest predicted gain ever advised, whatever the noise (the diff's minimum effect).
MIN_GAIN = 0.05
#: The model advises only when it describes the run: its prediction for the configuration that ran is
#: within this share of the measured mean step (or of the measurement's noise, when larger). It is the
#: accuracy the model's predictions are held to (benchmarks/RESULTS.md); a model that misses the
#: measured step by more has missed where this run's time goes (time outside the fetches it measures).
MODEL_FIT_TOLERANCE = 0.25
#: CPU the training process's other threads burn while it waits for a batch, as a share of the step,
#: from which their spinning is worth measuring against OMP_WAIT_POLICY=PASSIVE.
SPIN_SHARE = 0.10
#: Share of the compute the training thread waited for a CPU, from which its threads are contended.
STALL_SHARE = 0.20


@dataclass
class PipelineInputs:
    """What the model needs, measured on one run (seconds)."""

    step_s: float  # the steady mean step (the throughput), not the median: see measure()
    wait_s: float
    compute_s: float
    compute_quiet_s: float  # the compute of the steps not slowed by contention (lower quartile)
    num_workers: int
    loader_cpu_s: float
    loader_wall_s: float
    loader_runq_s: float  # of the wall time, waiting for a CPU (other work had the cores)
    loader_quiet_s: float  # the wall time of one batch less its wait for a CPU: CPU and waits for data
    ipc_cpu_s: float
    ipc_measured: bool
    compute_cpu_s: float
    compute_runq_s: float  # of compute_s, the training thread's wait for a CPU
    cores: float  # the cores the job may use (affinity, cgroup quota)
    others_runnable: float  # threads of other processes competing for those cores while it ran
    cores_free: float  # the cores the job got at its measured configuration (from the two above)
    torch_threads: int
    gpu: bool
    batches: int
    noise: float  # relative half-width of the 95% interval of the mean step
    # CPU the training process's other threads burnt per step while it waited for a batch (torch's
    # idle OpenMP threads spin); 0 in runs recorded before it was measured
    spin_cpu_s: float = 0.0
    # epochs after the first whose DataLoader started its workers again (persistent_workers off), the
    # time each such start added to the epoch's first step (median), and the median epoch
    restarts: int = 0
    restart_s: float = 0.0
    epoch_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    if not s:
        return 0.0
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def _workers_of(run: Run, main: ProcKey) -> list[int]:
    rows = run.rows(
        "SELECT DISTINCT pid FROM processes WHERE host = ? AND ppid = ? AND role = 'dataloader_worker'",
        [main.host, main.pid],
    )
    return [int(r[0]) for r in rows]


def measure(run: Run, main: ProcKey, st: StepStats, loader: dict[str, Any]) -> PipelineInputs | None:
    """The model's inputs from ``run``'s training loop, or None when the run lacks them (a run
    recorded before the loader's CPU was measured, a tf.data pipeline)."""
    if st.count < 3 or not loader:
        return None
    vals = _data_waits(run, main)
    if len(vals) < 3:
        return None
    workers = int(loader.get("num_workers") or 0)
    every = int(loader.get("read_every") or model.BATCH_WAITS_READ_EVERY_UNSAID)
    fetch = _fetches(run, main, workers, every)
    if not fetch:
        return None
    # with workers that start again at each epoch, the steps in which they do are the restart's
    # (measured on its own below), not the steady loop's
    steps = _steady_steps(run, main, without_restarts=workers > 0 and not loader.get("persistent_workers"))
    if len(steps) < 3:
        return None
    return _inputs(run, main, st, loader, workers, _MainThread.of(vals, every), fetch, steps)


def _data_waits(run: Run, main: ProcKey) -> list[tuple[int, ...]]:
    """The training loop's data waits in time order, those with their CPU measured: (start, end, CPU
    of the waiting thread, CPU of the process, CPU of the thread so far, its run-queue wait during the
    wait, its run-queue wait so far, CPU of the process's other threads during the wait or -1, the
    wait's number in its thread or -1 where the run does not say: every wait read its clocks)."""
    rows = run.rows(
        """SELECT start_ns, end_ns, json_extract(attrs, '$.cpu_ns'), json_extract(attrs, '$.proc_cpu_ns'),
                  coalesce(json_extract(attrs, '$.thread_cpu_ns'), 0), coalesce(json_extract(attrs, '$.runq_ns'), 0),
                  coalesce(json_extract(attrs, '$.thread_runq_ns'), 0),
                  coalesce(json_extract(attrs, '$.proc_wait_cpu_ns'), -1),
                  coalesce(json_extract(attrs, '$.wait_n'), -1)
           FROM spans WHERE kind = 'phase' AND name = 'data_wait' AND host = ? AND pid = ? AND step >= 0
           ORDER BY start_ns""",
        [main.host, main.pid],
    )
    rows = [r for r in rows if r[2] is not None and r[3] is not None]
    return [tuple(int(v) for v in r) for r in rows]


@dataclass
class _MainThread:
    """The training process between and during its data waits."""

    own: list[tuple[int, int]]  # the training thread between two waits: its CPU and run-queue wait (ns)
    compute_cpu: list[float]  # CPU of the process between the end of one wait and the next
    wait_cpu: list[float]  # CPU of the training thread in each wait (receiving the batch)
    spin: list[float]  # CPU of the process's other threads while the training thread waited

    @classmethod
    def of(cls, vals: list[tuple[int, ...]], every: int) -> _MainThread:
        """From the thread's batch waits, of which two in every ``every`` read the clocks after its first
        ones."""
        # consecutive waits of the thread (after its first ones, only pairs of waits read the clocks),
        # each pair as many times as the pairs of waits it stands for
        pairs = [
            (a, b)
            for a, b in itertools.pairwise(vals)
            if a[8] < 0 or b[8] == a[8] + 1
            for _ in range(_stands_for(a[8], every))
        ]
        waits = [v for v in vals for _ in range(_stands_for(v[8], every // 2))]
        # the training thread between two waits: its CPU, and its time runnable but without a core
        own = [
            (b[4] - a[4] - a[2], b[6] - a[6] - a[5])
            for a, b in pairs
            if b[4] and a[4] and b[4] - a[4] >= a[2] and b[6] - a[6] >= a[5]
        ]
        # CPU of the training process between the end of one wait and the start of the next: compute
        compute_cpu = [(b[3] - a[3] - a[2]) / NS for a, b in pairs if b[3] >= a[3] + a[2]]
        main_wait_cpu = [w[2] / NS for w in waits]
        # the process's other threads while the training thread waited (torch's idle threads spinning)
        spin = [max(0, v[7] - v[2]) / NS for v in waits[WARMUP_STEPS:] or waits if v[7] >= 0]
        return cls(own, compute_cpu, main_wait_cpu, spin)


def _stands_for(n: int, later: int) -> int:
    """How many batch waits (or pairs of waits) the reading of wait number ``n`` stands for: one among
    a thread's first waits (each read), ``later`` after them (read in pairs, one in every few)."""
    return 1 if n < model.BATCH_WAITS_READ_ALL else later


def _fetches(run: Run, main: ProcKey, workers: int, every: int) -> list[tuple[int, int, int]]:
    """(wall, CPU, run-queue wait) in ns of every batch fetched: by the loader's workers, or without
    workers by the training process within its data waits (two in every ``every`` read after the
    first ones); [] when the workers are not found."""
    if workers > 0:
        pids = _workers_of(run, main)
        if not pids:
            return []
        fetch = run.rows(
            f"""SELECT (end_ns - start_ns), json_extract(attrs, '$.cpu_ns'),
                       coalesce(json_extract(attrs, '$.runq_ns'), 0), -1 FROM spans
                WHERE kind = 'op' AND name = 'fetch' AND host = ? AND pid IN ({",".join(map(str, pids))})""",
            [main.host],
        )
    else:
        fetch = run.rows(
            """SELECT (f.end_ns - f.start_ns), json_extract(f.attrs, '$.cpu_ns'),
                      coalesce(json_extract(f.attrs, '$.runq_ns'), 0),
                      coalesce(json_extract(f.attrs, '$.wait_n'), -1) FROM spans f
               WHERE f.kind = 'op' AND f.name = 'fetch' AND f.host = ? AND f.pid = ? AND EXISTS (
                 SELECT 1 FROM spans w WHERE w.kind = 'phase' AND w.name = 'data_wait' AND w.host = f.host
                   AND w.pid = f.pid AND w.step >= 0 AND f.start_ns >= w.start_ns AND f.end_ns <= w.end_ns)""",
            [main.host, main.pid],
        )
    # a fetch read inside a sampled batch wait stands for the waits that one does (a worker's: itself)
    half = every // 2
    return [
        (int(w), int(c), int(q))
        for w, c, q, n in fetch
        if c is not None
        for _ in range(_stands_for(int(n), half))
    ]


def _inputs(
    run: Run,
    main: ProcKey,
    st: StepStats,
    loader: dict[str, Any],
    workers: int,
    thread: _MainThread,
    fetch: list[tuple[int, int, int]],
    steps: list[tuple[float, float]],
) -> PipelineInputs:
    """The model's inputs from the steady steps, the training thread's CPU and the batches fetched."""
    step_s = sum(d for d, _ in steps) / len(steps)
    wait = sum(w for _, w in steps) / len(steps)
    lo, hi = mean_interval([d for d, _ in steps])
    cores = float(loader.get("cores") or 1)
    compute_s = max(step_s - wait, 0.0)
    compute_cpu_s = _median(thread.compute_cpu)
    loader_cpu_s = _median([c / NS for _, c, _ in fetch])
    busy = _busy_threads(loader, workers, compute_cpu_s, compute_s, loader_cpu_s, step_s)
    others = others_runnable(run, st, cores, int(loader.get("host_cpus") or 0), thread.own, busy, workers)
    if compute_s > 0:  # the job's compute ran on C / Tc cores: the others left it at least that many
        others = round(min(others, max(0.0, cores - compute_cpu_s / compute_s)), 3)
    # with workers some steps' compute is stalled by them (a worker holds the core a torch thread
    # needs); the lower quartile is the compute of steps that were not
    per_compute = sorted(max(0.0, d - w) for d, w in steps)
    compute_quiet = per_compute[len(per_compute) // 4] if workers > 0 else compute_s
    loader_quiet = _median([max(c, w - q) / NS for w, c, q in fetch])
    return PipelineInputs(
        step_s=step_s,
        wait_s=wait,
        compute_s=compute_s,
        compute_quiet_s=compute_quiet,
        num_workers=workers,
        loader_cpu_s=loader_cpu_s,
        loader_wall_s=_median([w / NS for w, _, _ in fetch]),
        loader_runq_s=_median([q / NS for _, _, q in fetch]),
        loader_quiet_s=loader_quiet,
        ipc_cpu_s=_median(thread.wait_cpu) if workers > 0 else IPC_DEFAULT_S,
        ipc_measured=workers > 0,
        compute_cpu_s=compute_cpu_s,
        compute_runq_s=min(compute_s, _median([q / NS for _, q in thread.own])),
        cores=cores,
        others_runnable=others,
        cores_free=round(available(cores, others, busy), 3),
        torch_threads=int(loader.get("torch_threads") or 1),
        gpu=bool(loader.get("gpu")),
        batches=len(fetch),
        noise=max(step_s - lo, hi - step_s) / step_s if step_s > 0 else 1.0,
        spin_cpu_s=_median(thread.spin),
        **_restarts(run, main, loader, workers, compute_quiet, loader_quiet),
    )


def _busy_threads(
    loader: dict[str, Any],
    workers: int,
    compute_cpu_s: float,
    compute_s: float,
    loader_cpu_s: float,
    step_s: float,
) -> float:
    """Runnable threads of the training process while it computes."""
    threads = max(1.0, float(loader.get("torch_threads") or 1))
    busy = min(max(1.0, compute_cpu_s / compute_s if compute_s > 0 else 1.0), threads)
    if workers > 0 and step_s > 0:
        # beside workers every torch thread wants a core while the loop computes (idle ones spin at
        # the end of each parallel region), whatever share of the stalled compute they got
        busy = threads + min(float(workers), loader_cpu_s / step_s)
    return busy


def available(cores: float, others: float, threads: float) -> float:
    """Cores a job with ``threads`` runnable threads gets beside ``others`` runnable threads of other
    processes: all of ``cores`` while everything fits, else its fair share (what Linux's scheduler
    aims at), ``cores * threads / (others + threads)``."""
    t = max(threads, 1.0)
    return cores if others + t <= cores else cores * t / (others + t)


def others_runnable(
    run: Run,
    st: StepStats,
    cores: float,
    host_cpus: int,
    own: list[tuple[int, int]],
    busy: float,
    workers: int,
) -> float:
    """Runnable threads of other processes that shared the job's cores while it ran.

    Without workers, from the training thread itself when the kernel reports its run-queue wait:
    between two fetches it ran a share ``s`` of the time it was runnable; with ``busy`` runnable
    threads of its own and fair sharing, ``s = cores / (others + busy)`` (when the threads outnumber
    the cores). With workers the job's own threads outnumber the cores and make that wait themselves,
    so it says nothing about other processes; then, and without ``schedstat``, from the CPU samples:
    the cores the rest of the machine used (``host.cpu_percent`` of all its CPUs less
    ``job.cpu_percent``, the job's whole process tree), over the training loop, or over the whole run
    when the loop was too short for samples."""
    cpu, runq = sum(c for c, _ in own), sum(q for _, q in own)
    if workers == 0 and cpu > 0 and runq > 0:
        share = cpu / (cpu + runq)
        return round(max(0.0, cores / share - max(busy, 1.0)), 3) if share < 0.98 else 0.0
    if host_cpus <= 0:
        return 0.0
    sql = """SELECT h.value, j.value FROM samples h JOIN samples j ON h.ts_ns = j.ts_ns
             WHERE h.name = 'host.cpu_percent' AND j.name = 'job.cpu_percent' AND h.target_pid = -1
               AND j.target_pid = -1"""
    rows = run.rows(sql + " AND h.ts_ns BETWEEN ? AND ?", [st.first_start_ns, st.last_end_ns])
    if len(rows) < 3:
        rows = run.rows(sql)
    if not rows:
        return 0.0
    return round(_median([max(0.0, h / 100 * host_cpus - j / 100) for h, j in rows]), 3)


def _restarts(
    run: Run, main: ProcKey, loader: dict[str, Any], workers: int, compute_s: float, loader_s: float
) -> dict[str, Any]:
    """What starting the DataLoader workers again at each epoch cost: ``restarts`` (epochs after the
    first, when the loader has workers and no ``persistent_workers``), ``restart_s`` (median over them
    of the step in which the epoch began — the end of the last one, ``iter()`` starting the workers,
    the first batch — less a step that loads its first batch without that start: compute plus one
    batch's loading) and ``epoch_s`` (the median time from one epoch's start to the next)."""
    if workers <= 0 or loader.get("persistent_workers"):
        return {}
    epochs = run.rows(
        """SELECT e.start_ns, (SELECT s.end_ns - s.start_ns FROM spans s WHERE s.kind = 'step' AND s.host = e.host
                 AND s.pid = e.pid AND s.start_ns <= e.start_ns AND s.end_ns > e.start_ns ORDER BY s.start_ns DESC LIMIT 1)
           FROM spans e WHERE e.kind = 'epoch' AND e.host = ? AND e.pid = ?
             AND json_extract_string(e.attrs, '$.loader') = ? ORDER BY e.start_ns""",
        [main.host, main.pid, str(loader.get("loader", ""))],
    )
    later = [int(step) / NS for _, step in epochs[1:] if step is not None]
    if not later:
        return {}
    return {
        "restarts": len(later),
        "restart_s": round(max(0.0, _median(later) - compute_s - loader_s), 6),
        "epoch_s": round(_median([(b - a) / NS for (a, _), (b, _) in itertools.pairwise(epochs)]), 6),
    }


def _steady_steps(run: Run, main: ProcKey, without_restarts: bool = False) -> list[tuple[float, float]]:
    """(duration, data wait) in seconds of each steady step of the training loop (the first
    :data:`~holoprof.analyze.diff.WARMUP_STEPS` left out when enough remain), in step order;
    ``without_restarts``: without the steps in which a later epoch began (its loader started)."""
    restart = """AND NOT EXISTS (SELECT 1 FROM spans e WHERE e.kind = 'epoch' AND e.host = s.host
                   AND e.pid = s.pid AND e.start_ns > s.start_ns AND e.start_ns < s.end_ns)"""
    rows = run.rows(
        f"""SELECT (s.end_ns - s.start_ns) / 1e9, coalesce((
                 SELECT sum(w.end_ns - w.start_ns) FROM spans w WHERE w.kind = 'phase' AND w.name = 'data_wait'
                   AND w.host = s.host AND w.pid = s.pid AND w.step = s.step), 0) / 1e9
           FROM spans s WHERE s.kind = 'step' AND s.host = ? AND s.pid = ? AND s.end_ns >= s.start_ns
             {restart if without_restarts else ""}
           ORDER BY s.step, s.start_ns""",
        [main.host, main.pid],
    )
    steps = [(float(d), min(float(w), float(d))) for d, w in rows]
    keep = steady([d for d, _ in steps])
    return steps[len(steps) - len(keep) :]


# --- the model ---------------------------------------------------------------------------------------
def _parallelism(x: PipelineInputs) -> float:
    """Busy threads of the training process while it computes (1 .. torch threads): its CPU per
    second of compute; with workers all of torch's threads (the compute measured there is stretched
    by the workers' stalls, which would make it look less parallel than it is)."""
    threads = max(1.0, float(x.torch_threads))
    if x.num_workers > 0:
        return threads
    if x.compute_s <= 0:
        return 1.0
    return min(max(1.0, x.compute_cpu_s / x.compute_s), threads)


def _oversubscribed(busy_main: float, busy_workers: float, cores: float) -> bool:
    return busy_main + busy_workers > cores + 0.25


def base_compute(x: PipelineInputs) -> float:
    """The training loop's own time per step without loading and without contention: the measured
    compute when the run loaded in the training loop; with workers, the compute of the steps that
    no worker stalled."""
    return x.compute_s if x.num_workers == 0 else x.compute_quiet_s


def loader_wall(x: PipelineInputs, workers: int) -> float:
    """The wall time of loading one batch with ``workers`` workers before the cores are shared: in
    the training loop (0) as the run measured it when it had no workers; otherwise its CPU and its
    waits for data, the waits for a CPU left to the cores bound."""
    return x.loader_wall_s if workers == 0 and x.num_workers == 0 else x.loader_quiet_s


def predict(x: PipelineInputs, workers: int) -> dict[str, float]:
    """Predicted steady step time (s) with ``workers`` DataLoader workers, and its three bounds."""
    compute = base_compute(x)
    if workers <= 0:
        wall = loader_wall(x, 0)
        step = compute + wall
        return {"step_s": step, "main_s": step, "loaders_s": wall, "cores_s": 0.0}
    main = compute + x.ipc_cpu_s
    loaders = loader_wall(x, workers) / workers
    cpu = x.compute_cpu_s + x.ipc_cpu_s + x.loader_cpu_s
    p = _parallelism(x)
    k = available(x.cores, x.others_runnable, p + workers)
    step = max(main, loaders, cpu / k)
    eff = 1.0
    for _ in range(20):  # the cores it gets and their efficiency depend on how busy the workers are
        busy_workers = min(float(workers), x.loader_cpu_s / step)
        k = available(x.cores, x.others_runnable, p + busy_workers)
        eff = OVERSUBSCRIBED_EFFICIENCY if _oversubscribed(p, busy_workers, k) else 1.0
        nxt = max(main, loaders, cpu / (k * eff))
        if abs(nxt - step) < 1e-9:
            break
        step = nxt
    return {"step_s": step, "main_s": main, "loaders_s": loaders, "cores_s": cpu / (k * eff)}


def quiet(x: PipelineInputs) -> PipelineInputs:
    """``x`` as it would be on the same machine with no other process competing: the waits for a CPU
    taken out of the loading and compute times."""
    return replace(
        x,
        others_runnable=0.0,
        loader_wall_s=max(x.loader_cpu_s, x.loader_wall_s - x.loader_runq_s),
        loader_runq_s=0.0,
        compute_s=max(0.0, x.compute_s - x.compute_runq_s),
        compute_quiet_s=max(0.0, min(x.compute_quiet_s, x.compute_s - x.compute_runq_s)),
        compute_runq_s=0.0,
    )


def margin(x: PipelineInputs) -> float:
    """The smallest relative gain worth advising: the measurement's noise, at least :data:`MIN_GAIN`."""
    return max(MIN_GAIN, x.noise)


@dataclass
class Advice:
    workers: int  # the recommended num_workers (== current when nothing helps)
    predicted_step_s: float
    gain: float  # predicted fraction of the step saved (0 when nothing is advised)
    candidates: dict[int, float]  # num_workers -> predicted step (s)
    limit: str  # what bounds the step at the recommended configuration: main | loaders | cores
    advised: bool


def advise(x: PipelineInputs, max_workers: int | None = None) -> Advice:
    """The best worker count the model sees, advised only if it beats the measured step by more than
    the noise and is no slower than the current one on the machine without its other load (a gain
    taken from other processes' share of the cores must not turn into a loss when they stop);
    otherwise the current one, with ``advised`` False."""
    top = max(x.num_workers, max_workers if max_workers is not None else max(2, round(2 * x.cores)))
    cands = {n: predict(x, n)["step_s"] for n in range(0, top + 1)}
    # a count that only wins by taking cores from other processes must not lose once they are gone
    q = quiet(x)
    now_quiet = predict(q, x.num_workers)["step_s"]
    safe = [n for n in cands if n == x.num_workers or predict(q, n)["step_s"] <= now_quiet]
    best = min(safe, key=lambda n: (cands[n], n))
    # the smallest count within 2% of the best: as fast, fewer processes and cores
    best = min(n for n in safe if cands[n] <= cands[best] * 1.02)
    b = predict(x, best)
    # what bounds the step: at the best count, or (when that is none) at the best count with workers
    with_workers = min((n for n in cands if n > 0), key=lambda n: (cands[n], n), default=best)
    lim = b if best > 0 else predict(x, with_workers)
    limit = max(
        ("main", lim["main_s"]), ("loaders", lim["loaders_s"]), ("cores", lim["cores_s"]), key=lambda t: t[1]
    )[0]
    gain = 1 - b["step_s"] / x.step_s if x.step_s > 0 else 0.0
    ok = best != x.num_workers and gain >= margin(x)
    return Advice(
        workers=best if ok else x.num_workers,
        predicted_step_s=b["step_s"] if ok else x.step_s,
        gain=gain if ok else 0.0,
        candidates={n: round(v, 6) for n, v in cands.items()},
        limit=limit,
        advised=ok,
    )


def spin_worth_measuring(x: PipelineInputs, adv: Advice) -> bool:
    """Whether torch's threads contend for the cores enough to measure ``OMP_WAIT_POLICY=PASSIVE``:
    several torch threads, and either their spinning while the loop waited for a batch took
    :data:`SPIN_SHARE` of the step or more beside workers (there are, or would be), other processes or
    cores that bound the step, or the training thread waited for a CPU for :data:`STALL_SHARE` of its
    compute or more (a parallel region waits for its slowest thread: one without a core stalls it)."""
    if x.torch_threads <= 1 or x.step_s <= 0:
        return False
    contended = x.num_workers > 0 or adv.workers > 0 or adv.limit == "cores" or x.others_runnable > 0
    return (spinning(x) and contended) or stalled(x)


def spinning(x: PipelineInputs) -> bool:
    """The training process's other threads burnt :data:`SPIN_SHARE` of the step or more while it
    waited for a batch."""
    return x.step_s > 0 and x.spin_cpu_s >= SPIN_SHARE * x.step_s


def stalled(x: PipelineInputs) -> bool:
    """The training thread waited for a CPU for :data:`STALL_SHARE` of its compute or more."""
    return x.compute_s > 0 and x.compute_runq_s >= STALL_SHARE * x.compute_s


def best_with_workers(adv: Advice) -> int:
    """The worker count (> 0) with the best predicted step."""
    return min((n for n in adv.candidates if n > 0), key=lambda n: (adv.candidates[n], n), default=1)


def persistent_gain(x: PipelineInputs) -> float:
    """The share of the training loop's time ``persistent_workers=True`` is predicted to save (0 when it
    does not apply): the workers' start measured at each epoch after the first, over the median epoch,
    for the ``restarts`` of the run's ``restarts + 1`` epochs (a longer job saves nearer the whole
    ``restart_s / epoch_s``)."""
    if x.restarts <= 0 or x.epoch_s <= 0:
        return 0.0
    return min(1.0, x.restarts / (x.restarts + 1) * x.restart_s / x.epoch_s)


def advise_persistent(x: PipelineInputs) -> bool:
    """Advise ``persistent_workers=True`` when the workers' start at each epoch is predicted to cost
    more of an epoch than the measurement's noise (at least :data:`MIN_GAIN`)."""
    return persistent_gain(x) >= margin(x)


@dataclass
class PipelineModel:
    """Everything the input-pipeline model says of a run, computed once: its inputs, the advice on
    the worker count, and the verdicts the ``input_bound`` finding reads (and nothing else computes)."""

    inputs: PipelineInputs
    advice: Advice
    margin: float
    #: the worker count (> 0) with the best predicted step
    best_with_workers: int
    #: the training loop's own time per step, and one batch's loading time with the advised workers
    base_compute_s: float
    loader_wall_s: float
    spinning: bool
    stalled: bool
    spin_worth_measuring: bool
    persistent_advised: bool
    persistent_gain: float
    #: the predicted saving of everything advised (workers and persistent workers compound)
    gain: float
    #: the predicted step of the configuration that ran, its relative error against the measured
    #: one, and whether that is within :data:`MODEL_FIT_TOLERANCE` (else nothing is advised from it)
    predicted_now_s: float = 0.0
    fit_error: float = 0.0
    fits: bool = True

    def evidence(self) -> dict[str, Any]:
        """The model as the finding's evidence shows it."""
        adv = self.advice
        return {
            "inputs": self.inputs.to_dict(),
            "predicted_step_s": {str(n): v for n, v in adv.candidates.items()},
            "recommended_workers": adv.workers,
            "limit": adv.limit,
            "spin_worth_measuring": self.spin_worth_measuring,
            "persistent_workers_advised": self.persistent_advised,
            "persistent_gain": round(self.persistent_gain, 4),
            "margin": round(self.margin, 4),
            "fit": {
                "predicted_now_s": round(self.predicted_now_s, 6),
                "measured_s": round(self.inputs.step_s, 6),
                "error": round(self.fit_error, 4),
                "tolerance": round(max(MODEL_FIT_TOLERANCE, self.inputs.noise), 4),
                "fits": self.fits,
            },
        }


def fit_error(x: PipelineInputs) -> tuple[float, float]:
    """The predicted step of the configuration that ran, and its relative error against the measured
    mean step."""
    now = predict(x, x.num_workers)["step_s"]
    return now, (abs(now - x.step_s) / x.step_s if x.step_s > 0 else 1.0)


def pipeline_model(x: PipelineInputs) -> PipelineModel:
    """The model's whole result for the measured inputs ``x``."""
    adv = advise(x)
    persistent = advise_persistent(x)
    gain = adv.gain
    if persistent:  # the two savings compound
        gain = 1 - (1 - gain) * (1 - persistent_gain(x))
    now, err = fit_error(x)
    return PipelineModel(
        inputs=x,
        advice=adv,
        margin=margin(x),
        best_with_workers=best_with_workers(adv),
        base_compute_s=base_compute(x),
        loader_wall_s=loader_wall(x, max(1, adv.workers) if not adv.advised else adv.workers),
        spinning=spinning(x),
        stalled=stalled(x),
        spin_worth_measuring=spin_worth_measuring(x, adv),
        persistent_advised=persistent,
        persistent_gain=persistent_gain(x),
        gain=gain,
        predicted_now_s=now,
        fit_error=err,
        fits=err <= max(MODEL_FIT_TOLERANCE, x.noise),
    )
