"""Agent start-up: the time `holoprof run` adds to each short Python process and to a DataLoader
worker started with "spawn".

1. Short processes: one traced job (`holoprof run`, native I/O layer preloaded when built, as users run
   it) starts 100 `python -c "import json"` children, alternately traced (the job's environment) and
   untraced (the same without holoprof's variables), and times each from its start to its exit. The
   added time per process is the difference of the medians (and of the means); every traced child
   must be in the run afterwards, ended (its row's end time set at its exit).
2. Spawned DataLoader workers: alternating plain and traced runs of a DataLoader with 2 workers
   started with "spawn" (or "forkserver") and a few batches; the time from iter() to the first batch
   (the workers' start, torch's import in them included) and each worker's own start (from the
   kernel's start of its process to its init function) and CPU time until then, and that CPU time
   less the worker's full garbage collections (whose number is the garbage collector's clock: a few
   thousand objects more or less add or spare one, tens of milliseconds); medians of the runs, the
   median of the adjacent pairs' differences and the difference of the minima.

CPU times are given beside wall times: on a shared machine they move much less.

    python benchmarks/bench_startup.py [--procs 100] [--code "import json"] [--loader-pairs 7]
                                       [--loader-context spawn|forkserver]

holoprof's modules are byte-compiled first, as an installed package is (a checkout run with
PYTHONDONTWRITEBYTECODE would compile them again in every process).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SHORT = os.path.join(HERE, "workloads", "short_processes.py")
LOADER = os.path.join(HERE, "workloads", "spawn_loader.py")
HOLOPROF = [sys.executable, "-m", "holoprof.cli"]


def _json_line(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def _ms(s: float) -> str:
    return f"{1e3 * s:.1f} ms"


def short_processes(tmp: str, procs: int, code: str) -> None:
    run_dir = os.path.join(tmp, "short")
    res = _json_line(
        [*HOLOPROF, "run", "--no-report", "--out", run_dir, "--", sys.executable, SHORT, str(procs), code]
    )
    traced, plain = res["times_s"]["traced"], res["times_s"]["untraced"]
    cpu_t, cpu_u = statistics.median(res["cpu_s"]["traced"]), statistics.median(res["cpu_s"]["untraced"])
    pairs = [t - u for t, u in zip(traced, plain, strict=True)]
    # lazy: the run is read once the job is over
    import holoprof

    rows = holoprof.load(run_dir).rows("SELECT pid, max(end_ns) FROM processes GROUP BY pid")
    ended = {pid for pid, end_ns in rows if end_ns}
    ok = sum(1 for pid in res["traced_pids"] if pid in ended)
    med_t, med_u = statistics.median(traced), statistics.median(plain)
    print("## Agent start-up: short Python processes\n")
    print(f"`python benchmarks/bench_startup.py --procs {procs} --code {json.dumps(code)}`\n")
    print(
        f"{procs} traced and {procs} untraced `python -c {json.dumps(code)}`, alternating, started by one traced job.\n"
    )
    print("| measure | value |\n| --- | --- |")
    print(f"| median untraced process | {_ms(med_u)} |")
    print(f"| median traced process | {_ms(med_t)} |")
    print(f"| added per process, difference of the medians | {_ms(med_t - med_u)} |")
    print(
        f"| added per process, difference of the means | {_ms(statistics.mean(traced) - statistics.mean(plain))} |"
    )
    print(f"| added per process, median of the adjacent pairs | {_ms(statistics.median(pairs))} |")
    print(f"| ratio traced/untraced (medians) | {med_t / med_u:.2f} |")
    print(f"| CPU time per process, median untraced / traced | {_ms(cpu_u)} / {_ms(cpu_t)} |")
    print(f"| CPU time added per process, difference of the medians | {_ms(cpu_t - cpu_u)} |")
    print(f"| traced processes in the run, ended | {ok} of {len(res['traced_pids'])} |")
    print("| target | ≤ 10 ms added per process |\n")


def _median_ms(xs: list[float]) -> float:
    return 1e3 * statistics.median(xs)


def spawn_workers(tmp: str, pairs: int, context: str, workers: int = 2) -> None:
    """Alternating plain and traced runs of the DataLoader workload; per run, its workers' mean."""
    keys = ("first", "start", "cpu", "cpu_less_gc", "full_gc")
    runs: dict[str, dict[str, list[float]]] = {k: {key: [] for key in keys} for k in ("plain", "traced")}
    load = [os.getloadavg()[0]]
    for i in range(pairs):
        for kind in ("plain", "traced") if i % 2 == 0 else ("traced", "plain"):
            out = os.path.join(tmp, f"loader-{context}-{kind}-{i}")
            os.makedirs(out)
            env = {**os.environ, "SPAWN_LOADER_OUT": out, "OMP_NUM_THREADS": "1"}
            job = [sys.executable, LOADER, "8", context, str(workers)]
            if kind == "traced":
                job = [*HOLOPROF, "run", "--no-report", "--out", os.path.join(out, "run"), "--", *job]
            res = _json_line(job, env)
            r = runs[kind]
            r["first"].append(res["first_batch_s"])
            r["start"].append(statistics.mean(res["worker_start_s"]))
            r["cpu"].append(statistics.mean(res["worker_cpu_s"]))
            less = [c - g for c, g in zip(res["worker_cpu_s"], res["worker_full_gc_cpu_s"], strict=True)]
            r["cpu_less_gc"].append(statistics.mean(less))
            r["full_gc"].append(statistics.mean(res["worker_full_gc"]))
        load.append(os.getloadavg()[0])
    p, t = runs["plain"], runs["traced"]
    print(f"## Agent start-up: DataLoader workers started with {context}\n")
    print(
        f"`python benchmarks/bench_startup.py --procs 0 --loader-pairs {pairs} --loader-context {context}"
        f" --loader-workers {workers}`\n"
    )
    print(
        f"{pairs} plain and {pairs} traced runs, alternating; {workers} worker(s) each, 8 batches; per run, the "
        f"mean of its workers; load average {min(load):.1f}–{max(load):.1f}.\n"
    )
    print("| measure | plain | traced | added (medians) | added (median of pairs) | added (minima) |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows = [
        ("iter() to first batch", "first"),
        ("a worker's start to its init function", "start"),
        ("a worker's CPU time until its init function", "cpu"),
        ("the same less its full garbage collections", "cpu_less_gc"),
    ]
    for label, key in rows:
        mp, mt = _median_ms(p[key]), _median_ms(t[key])
        pair = _median_ms([b - a for a, b in zip(p[key], t[key], strict=True)])
        low = 1e3 * (min(t[key]) - min(p[key]))
        print(f"| {label} | {mp:.1f} ms | {mt:.1f} ms | {mt - mp:+.1f} ms | {pair:+.1f} ms | {low:+.1f} ms |")
    gp, gt = statistics.median(p["full_gc"]), statistics.median(t["full_gc"])
    print(
        f"| full garbage collections until the init function, median | {gp:g} | {gt:g} | {gt - gp:+g} | | |"
    )
    print(
        f"| ratio traced/plain, CPU until init (medians) | | {statistics.median(t['cpu']) / statistics.median(p['cpu']):.3f} | | | |"
    )
    print("| target | | | ≤ 10 ms per worker | | |\n")
    print(
        "A worker's CPU time until its init function, per run, sorted (the lower quantiles carry the least noise):\n"
    )
    print("| quantile | plain | traced | added |\n| --- | --- | --- | --- |")
    ps, ts = sorted(p["cpu"]), sorted(t["cpu"])
    for q in (0.0, 0.25, 0.5, 0.75):
        i = round(q * (pairs - 1))
        print(f"| {q:.0%} | {1e3 * ps[i]:.0f} ms | {1e3 * ts[i]:.0f} ms | {1e3 * (ts[i] - ps[i]):+.0f} ms |")
    print()


VALGRIND = """#!/bin/sh
exec valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file={out}/cg.%p {python} "$@" 2>>{out}/valgrind.log
"""


def _worker_instructions(out: str, job: list[str], env: dict[str, str]) -> float:
    """The mean of the instructions the two workers of one run of ``job`` executed until their init
    function (the two largest counts: the run may start another process, the resource tracker)."""
    wrapper = os.path.join(out, "python-under-valgrind")
    with open(wrapper, "w") as f:
        f.write(VALGRIND.format(out=out, python=sys.executable))
    os.chmod(wrapper, 0o755)
    env = {**env, "SPAWN_LOADER_EXECUTABLE": wrapper, "SPAWN_LOADER_EXIT_AT_INIT": "1"}
    subprocess.run(job, capture_output=True, text=True, check=True, env=env)
    counts: list[int] = []
    for _ in range(120):  # each worker's counts are written as it exits
        counts = []
        for name in os.listdir(out):
            if name.startswith("cg."):
                with open(os.path.join(out, name)) as f:
                    counts += [int(line.split()[1]) for line in f if line.startswith("summary:")]
        if len(counts) >= 2:
            break
        time.sleep(0.5)
    return statistics.mean(sorted(counts)[-2:])


def worker_instructions(tmp: str, context: str, keep: int) -> None:
    """Instructions of a spawned worker until its init function (valgrind's cachegrind): plain, plain
    with ``keep`` more objects alive (one full garbage collection more, as in the traced worker), traced,
    and traced with ``keep`` more objects (a job whose worker has passed that collection by itself:
    what the agent adds there is its own work only). Counts move by about 0.1% from run to run, where
    CPU time moves by 10% on a shared machine."""
    got: dict[str, float] = {}
    more = {"SPAWN_LOADER_KEEP": str(keep)}
    for kind, extra in (
        ("plain", {}),
        (f"plain, {keep} objects more", more),
        ("traced", {}),
        (f"traced, {keep} objects more", more),
    ):
        out = os.path.join(tmp, f"instructions-{len(got)}")
        os.makedirs(out)
        # a worker holds its first flush while it starts, for at most 10 s (collect.startup); under
        # valgrind its start takes about a minute, so the limit is raised to keep what a native run does
        env = {
            **os.environ,
            "SPAWN_LOADER_OUT": out,
            "OMP_NUM_THREADS": "1",
            "HOLOPROF_LOADER_HOLD_S": "600",
            **extra,
        }
        job = [sys.executable, LOADER, "8", context]
        if kind.startswith("traced"):
            job = [*HOLOPROF, "run", "--no-report", "--out", os.path.join(out, "run"), "--", *job]
        got[kind] = _worker_instructions(out, job, env)
    base = got["plain"]
    print(f"## Agent start-up: instructions of a DataLoader worker started with {context}\n")
    print(
        f"`python benchmarks/bench_startup.py --procs 0 --loader-pairs 0 --instructions --loader-context {context}`\n"
    )
    print("| worker until its init function | instructions | added |\n| --- | --- | --- |")
    for kind, n in got.items():
        print(f"| {kind} | {n / 1e9:.3f} G | {(n - base) / 1e6:+.0f} M ({100 * (n - base) / base:+.2f}%) |")
    kept_plain, kept_traced = got[f"plain, {keep} objects more"], got[f"traced, {keep} objects more"]
    print(f"\nWith {keep} objects more in both: the agent adds {(kept_traced - kept_plain) / 1e6:+.0f} M.\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=100)
    ap.add_argument("--code", default="import json")
    ap.add_argument("--loader-pairs", type=int, default=7, help="0: skip the DataLoader part")
    ap.add_argument("--loader-context", default="spawn", choices=("spawn", "forkserver"))
    ap.add_argument("--loader-workers", type=int, default=2, help="DataLoader workers per run")
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="also count a worker's instructions under valgrind (minutes)",
    )
    ap.add_argument(
        "--keep", type=int, default=3000, help="objects kept alive in the --instructions control run"
    )
    args = ap.parse_args()
    # lazy: the package's own folder, to byte-compile it
    import holoprof

    compileall.compile_dir(os.path.dirname(holoprof.__file__), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        if args.procs > 0:
            short_processes(tmp, args.procs, args.code)
        if args.loader_pairs > 0:
            spawn_workers(tmp, args.loader_pairs, args.loader_context, args.loader_workers)
        if args.instructions:
            worker_instructions(tmp, args.loader_context, args.keep)


if __name__ == "__main__":
    main()
