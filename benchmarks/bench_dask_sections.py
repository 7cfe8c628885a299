"""The I/O and communication sections on DuckDB and on a Dask LocalCluster, over generated runs with
comm spans and io_files snapshots: time of each engine and whether the sections are identical.

Each section gets the context the report gives it (the main loop's steps, the step processes, the
engine); ``+rank_stats``: the context also carries every rank's step statistics, as the report passes
them. Optional (minutes): ``python benchmarks/run_all.py bench_dask_sections.py``, or directly with
``--ranks R --steps S --files F [--workers W] [--dir DIR]`` for one run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

#: (ranks, steps per rank, shard files per rank): the two runs of benchmarks/RESULTS.md
RUNS = ((8, 20_000, 2_500), (64, 5_000, 500))


def sections(run: Any, eng: Any) -> tuple[dict[str, Any], dict[str, float]]:
    from holoprof.analyze.comm import communication
    from holoprof.analyze.io import io_section
    from holoprof.analyze.steps import step_processes, step_stats

    procs = step_processes(run, eng)
    main = procs[0]
    ctx = {"main": main, "steps": step_stats(run, main, engine=eng), "step_processes": procs, "engine": eng}
    out: dict[str, Any] = {}
    times: dict[str, float] = {}
    for name, f in (("io", io_section), ("communication", communication)):
        t = time.perf_counter()
        sec, fs = f(run, ctx)
        times[name] = time.perf_counter() - t
        out[name] = (sec, [x.to_dict() for x in fs])
    ctx["rank_stats"] = {p: step_stats(run, p, timeline_points=1, engine=eng) for p in procs if p != main}
    t = time.perf_counter()
    sec, fs = communication(run, ctx)
    times["communication +rank_stats"] = time.perf_counter() - t
    out["communication +rank_stats"] = (sec, [x.to_dict() for x in fs])
    return out, times


def measure(path: str, workers: int) -> list[str]:
    import distributed

    import holoprof
    from holoprof.analyze.engine import DuckDBEngine
    from holoprof.analyze.engine_dask import DaskEngine

    run = holoprof.load(path)
    duck, dt = sections(run, DuckDBEngine(run))
    with (
        distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        run2 = holoprof.load(path)
        dask, kt = sections(run2, DaskEngine(run2, client))
    spans, comm = run.rows("SELECT count(*), count(*) FILTER (WHERE kind = 'comm') FROM spans")[0]
    io_rows = run.rows("SELECT count(*) FROM io_files")[0][0]
    ranks = len(duck["communication"][0]["per_rank"])
    lines = [
        f"| {ranks} ranks | {spans / 1e6:.2f} M spans ({comm / 1e3:.0f} k comm), {io_rows:,} io_files rows | | | |"
    ]
    for k in dt:
        lines.append(f"| | {k} | {dt[k]:.2f} s | {kt[k]:.2f} s | {'yes' if dask[k] == duck[k] else 'NO'} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--files", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dir", help="where to write the runs (default: a temporary directory)")
    args = ap.parse_args()
    import logging

    from holoprof.bench.synth import generate_run

    logging.getLogger("distributed.shuffle").setLevel(logging.ERROR)  # one warning per shuffle

    runs = [(args.ranks, args.steps, args.files)] if args.ranks and args.steps else list(RUNS)
    base = args.dir or tempfile.mkdtemp(prefix="holoprof-dask-sections-")
    print("## I/O and communication sections: DuckDB against Dask\n")
    print(
        f"`{' '.join([os.path.basename(sys.executable), *sys.argv])}`, LocalCluster of {args.workers} worker"
    )
    print("processes (1 thread each); runs from `generate_run(..., comm=True, io_files=F)`.\n")
    print("| run | section | DuckDB | Dask | identical |")
    print("|---|---|---|---|---|")
    for ranks, steps, files in runs:
        path = os.path.join(base, f"r{ranks}x{steps}")
        if not os.path.isdir(path):
            generate_run(
                path, steps=steps, ranks=ranks, chunk_steps=max(1, steps // 2), comm=True, io_files=files
            )
        print("\n".join(measure(path, args.workers)), flush=True)


if __name__ == "__main__":
    main()
