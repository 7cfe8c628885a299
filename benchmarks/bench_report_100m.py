"""`holoprof report` on a generated run of 100 million spans over 64 ranks, with DuckDB and with Dask.

python benchmarks/bench_report_100m.py --out DIR [--ranks 64] [--steps 312500] [--phase all]

Phases (each can be run on its own, so that no single command holds the machine for long):
``generate`` writes the run into DIR in pieces (two generator processes at a time; the totals of every
rank go to DIR.totals.json); ``duckdb`` and ``dask`` time ``holoprof report DIR --json`` (Dask: a
LocalCluster of 2 worker processes), record wall time and peak memory (the resident memory of the
command and all its child processes, sampled every 50 ms: driver, scheduler and workers), check the
totals against the generator's and add a row to DIR.results.json; ``table`` prints the results.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def _piece(out: str, steps: int, ranks: int, a: int, b: int) -> dict[str, Any]:
    code = (
        "import json, sys; from holoprof.bench.synth import generate_run; "
        f"t = generate_run({out!r}, {steps}, ranks={ranks}, only_ranks=range({a}, {b})); "
        "print(json.dumps(t.per_rank))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def generate(out: str, steps: int, ranks: int, first: int, last: int, per_piece: int) -> None:
    from holoprof.bench.synth import create_run, finish_run

    totals_path = out + ".totals.json"
    totals: dict[str, Any] = {"steps": steps, "ranks": ranks, "per_rank": {}}
    if os.path.exists(totals_path):
        with open(totals_path) as f:
            totals = json.load(f)
    elif not os.path.exists(out):
        create_run(out)
    t0 = time.perf_counter()
    todo = [r for r in range(first, min(last, ranks)) if str(r) not in totals["per_rank"]]
    pieces = [(todo[i], todo[min(i + per_piece, len(todo)) - 1] + 1) for i in range(0, len(todo), per_piece)]
    with ThreadPoolExecutor(2) as ex:
        for got in ex.map(lambda ab: _piece(out, steps, ranks, *ab), pieces):
            totals["per_rank"].update({str(k): v for k, v in got.items()})
    with open(totals_path, "w") as f:
        json.dump(totals, f)
    done = len(totals["per_rank"])
    print(
        f"generated ranks {todo[:1]}..{todo[-1:]} in {time.perf_counter() - t0:.1f} s ({done}/{ranks} done)"
    )
    if done == ranks:
        finish_run(out)


def _peak_rss(proc: subprocess.Popen[str], stop: threading.Event, peak: dict[str, int]) -> None:
    import psutil

    root = psutil.Process(proc.pid)
    while not stop.is_set():
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            break
        total = 0
        for p in procs:
            try:
                rss = p.memory_info().rss
            except psutil.Error:
                continue
            total += rss
            key = "driver" if p.pid == root.pid else "children_max"
            peak[key] = max(peak.get(key, 0), rss)
        peak["total"] = max(peak.get("total", 0), total)
        stop.wait(0.05)


def report(out: str, engine: str) -> None:
    with open(out + ".totals.json") as f:
        totals = json.load(f)
    cmd = [sys.executable, "-m", "holoprof.cli", "report", out, "--json"]
    if engine == "dask":
        cmd += ["--engine", "dask"]
    stop, peak = threading.Event(), {}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    poller = threading.Thread(target=_peak_rss, args=(proc, stop, peak), daemon=True)
    poller.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    poller.join()
    if proc.returncode != 0:
        raise SystemExit(f"{engine} report failed (exit {proc.returncode}): {stderr[-2000:]}")
    doc = json.loads(stdout)
    r0 = totals["per_rank"]["0"]
    checks = {
        "step count": doc["steps"]["count"] == totals["steps"],
        "ranks": doc["run"]["ranks"] == totals["ranks"],
        "every rank's steps": len(doc["steps"]["per_rank"]) == totals["ranks"]
        and all(r["count"] == totals["steps"] for r in doc["steps"]["per_rank"]),
        "phase totals": all(
            abs(doc["phases"][p]["total_s"] - ns / 1e9) <= 1e-6 * ns / 1e9 for p, ns in r0["phase_ns"].items()
        ),
        "step time": abs(doc["steps"]["total_s"] - r0["step_ns"] / 1e9) <= 1e-6 * r0["step_ns"] / 1e9,
    }
    disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    row = {
        "engine": engine,
        "wall_s": round(wall, 1),
        "peak_total_mib": round(peak.get("total", 0) / 2**20),
        "peak_driver_mib": round(peak.get("driver", 0) / 2**20),
        "peak_worker_mib": round(peak.get("children_max", 0) / 2**20),
        "spans": sum(int(v["spans"]) for v in totals["per_rank"].values()),
        "disk_mib": round(disk / 2**20),
        "checks": checks,
        "ok": all(checks.values()),
        "warnings": doc["run"]["warnings"],
    }
    path = out + ".results.json"
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = [r for r in json.load(f) if r["engine"] != engine]
    with open(path, "w") as f:
        json.dump([*rows, row], f, indent=1)
    print(json.dumps(row))


def table(out: str) -> None:
    with open(out + ".results.json") as f:
        rows = json.load(f)
    print(
        "| engine | spans | on disk | wall time | peak memory, all processes | driver | largest worker | totals |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['engine']} | {r['spans']:,} | {r['disk_mib']} MiB | {r['wall_s']} s | {r['peak_total_mib']} MiB "
            f"| {r['peak_driver_mib']} MiB | {r['peak_worker_mib'] if r['engine'] == 'dask' else '-'} MiB "
            f"| {'equal the generator' if r['ok'] else 'MISMATCH ' + str(r['checks'])} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="the run directory (about 1.1 GB for 100 M spans)")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=312_500, help="steps per rank (5 spans per step)")
    ap.add_argument("--phase", default="all", choices=["all", "generate", "duckdb", "dask", "table"])
    ap.add_argument("--first-rank", type=int, default=0, help="generate: from this rank")
    ap.add_argument("--last-rank", type=int, default=1 << 30, help="generate: up to this rank (excluded)")
    ap.add_argument("--ranks-per-process", type=int, default=4)
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    if a.phase in ("all", "generate"):
        generate(out, a.steps, a.ranks, a.first_rank, a.last_rank, a.ranks_per_process)
    if a.phase in ("all", "duckdb"):
        report(out, "duckdb")
    if a.phase in ("all", "dask"):
        report(out, "dask")
    if a.phase in ("all", "table"):
        table(out)


if __name__ == "__main__":
    main()
