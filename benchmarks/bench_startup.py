"""Agent start-up: the time `holoprof run` adds to each short Python process and to a DataLoader
worker started with "spawn".

1. Short processes: one traced job (`holoprof run`, native I/O layer preloaded when built, as users run
   it) starts 100 `python -c "import json"` children, alternately traced (the job's environment) and
   untraced (the same without holoprof's variables), and times each from its start to its exit. The
   added time per process is the difference of the medians (and of the means); every traced child
   must be in the run afterwards, ended (its row's end time set at its exit).
2. Spawned DataLoader workers: alternating plain and traced runs of a DataLoader with 2 workers
   started with "spawn" and a few batches; the time from iter() to the first batch (the workers'
   start, torch's import in them included) and each worker's own start (from the kernel's start of
   its process to its init function) and CPU time until then, median of the runs.

CPU times are given beside wall times: on a shared machine they move much less.

    python benchmarks/bench_startup.py [--procs 100] [--code "import json"] [--loader-pairs 7]

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


def spawn_workers(tmp: str, pairs: int) -> None:
    first: dict[str, list[float]] = {"plain": [], "traced": []}
    start: dict[str, list[float]] = {"plain": [], "traced": []}
    cpu: dict[str, list[float]] = {"plain": [], "traced": []}
    for i in range(pairs):
        for kind in ("plain", "traced") if i % 2 == 0 else ("traced", "plain"):
            out = os.path.join(tmp, f"loader-{kind}-{i}")
            os.makedirs(out)
            env = {**os.environ, "SPAWN_LOADER_OUT": out, "OMP_NUM_THREADS": "1"}
            job = [sys.executable, LOADER]
            if kind == "traced":
                job = [*HOLOPROF, "run", "--no-report", "--out", os.path.join(out, "run"), "--", *job]
            res = _json_line(job, env)
            first[kind].append(res["first_batch_s"])
            start[kind].extend(res["worker_start_s"])
            cpu[kind].extend(res["worker_cpu_s"])
    fp, ft = statistics.median(first["plain"]), statistics.median(first["traced"])
    sp, st = statistics.median(start["plain"]), statistics.median(start["traced"])
    cp, ct = statistics.median(cpu["plain"]), statistics.median(cpu["traced"])
    print("## Agent start-up: DataLoader workers started with spawn\n")
    print(f"`python benchmarks/bench_startup.py --loader-pairs {pairs}`\n")
    print(f"{pairs} plain and {pairs} traced runs, alternating; 2 workers each, 8 batches.\n")
    print("| measure | plain | traced | added |\n| --- | --- | --- | --- |")
    print(f"| iter() to first batch, median | {_ms(fp)} | {_ms(ft)} | {_ms(ft - fp)} |")
    print(f"| a worker's start to its init function, median | {_ms(sp)} | {_ms(st)} | {_ms(st - sp)} |")
    print(f"| a worker's CPU time until its init function, median | {_ms(cp)} | {_ms(ct)} | {_ms(ct - cp)} |")
    print("| target | | | ≤ 10 ms per worker |\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=100)
    ap.add_argument("--code", default="import json")
    ap.add_argument("--loader-pairs", type=int, default=7, help="0: skip the DataLoader part")
    args = ap.parse_args()
    # lazy: the package's own folder, to byte-compile it
    import holoprof

    compileall.compile_dir(os.path.dirname(holoprof.__file__), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        if args.procs > 0:
            short_processes(tmp, args.procs, args.code)
        if args.loader_pairs > 0:
            spawn_workers(tmp, args.loader_pairs)


if __name__ == "__main__":
    main()
