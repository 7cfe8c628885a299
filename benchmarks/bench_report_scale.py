"""`holoprof report` on a generated run of 10 million spans (known totals checked).

python benchmarks/bench_report_scale.py [--steps 2000000] [--repeat 3]

Peak memory is the maximum resident set size of the whole `holoprof report --json` process. The same
command on a generated run of 1,000 steps gives its fixed part (interpreter, libraries, DuckDB), and an
interpreter that only imports duckdb, nanoarrow and numpy the floor below that.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from measure import peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2_000_000)  # 5 spans per step
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from holoprof.bench.synth import generate_run

    report = [sys.executable, "-m", "holoprof.cli", "report"]
    with tempfile.TemporaryDirectory() as tmp:
        run, small = os.path.join(tmp, "run"), os.path.join(tmp, "small")
        totals = generate_run(run, args.steps)
        generate_run(small, 1_000)
        disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(run) for f in fs)
        runs = [peak([*report, run, "--json"]) for _ in range(args.repeat)]
        _, fixed_rss, _ = peak([*report, small, "--json"])
        _, import_rss, _ = peak([sys.executable, "-c", "import duckdb, nanoarrow, numpy"])
    walls = sorted(w for w, _, _ in runs)
    rss = max(r for _, r, _ in runs)
    doc = json.loads(runs[0][2])
    assert doc["steps"]["count"] == args.steps, doc["steps"]["count"]
    for p, ns in totals.phase_ns.items():
        got = doc["phases"][p]["total_s"]
        assert abs(got - ns / 1e9) <= 1e-6, (p, got, ns)
    assert abs(doc["steps"]["total_s"] - totals.step_ns / 1e9) <= 1e-6
    mib = 2**20
    print("## Report at scale\n")
    print(f"`python benchmarks/bench_report_scale.py --steps {args.steps} --repeat {args.repeat}`\n")
    print("| measure | value | target |\n| --- | --- | --- |")
    print(f"| spans | {totals.spans:,} | |")
    print(f"| on disk | {disk / mib:.0f} MiB ({disk / totals.spans:.1f} bytes/span) | ≤ 16 bytes/span |")
    print(
        f"| `holoprof report --json` wall time (whole command, 2 cores), median of {len(walls)} "
        f"| {walls[len(walls) // 2]:.2f} s (min {walls[0]:.2f}, max {walls[-1]:.2f}) | ≤ 5 s |"
    )
    print(
        f"| peak memory of the report process | {rss / mib:.0f} MiB ({rss / disk:.2f}x on disk, the largest of the runs) "
        f"| ≤ 1.5x on disk ({1.5 * disk / mib:.0f} MiB) |"
    )
    print(f"| same command on a 5,000-span run (fixed part) | {fixed_rss / mib:.0f} MiB | |")
    print(
        f"| data-dependent part (peak - fixed part) | {(rss - fixed_rss) / mib:.0f} MiB "
        f"({(rss - fixed_rss) / disk:.1f}x on disk) | |"
    )
    print(f"| interpreter with duckdb, nanoarrow, numpy imported | {import_rss / mib:.0f} MiB | |")
    print("| totals checked | step count, step time and every phase's time equal the generator's | |\n")


if __name__ == "__main__":
    main()
