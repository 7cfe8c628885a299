"""`holoprof report` on a generated run of 10 million spans (known totals checked).

python benchmarks/bench_report_scale.py [--steps 2000000]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2_000_000)  # 5 spans per step
    args = ap.parse_args()
    from holoprof.bench.synth import generate_run

    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "run")
        totals = generate_run(run, args.steps)
        disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(run) for f in fs)
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "holoprof.cli", "report", run, "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        wall = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    import json

    doc = json.loads(proc.stdout)
    assert doc["steps"]["count"] == args.steps, doc["steps"]["count"]
    fwd = doc["phases"]["forward"]["total_s"]
    assert abs(fwd - totals.phase_ns["forward"] / 1e9) < 1e-3 * fwd, (fwd, totals.phase_ns["forward"])
    print("## Report at scale\n")
    print(f"`python benchmarks/bench_report_scale.py --steps {args.steps}`\n")
    print("| measure | value | target |\n| --- | --- | --- |")
    print(f"| spans | {totals.spans:,} | |")
    print(f"| on disk | {disk / 2**20:.0f} MiB ({disk / totals.spans:.1f} bytes/span) | |")
    print(f"| `holoprof report --json` wall time (whole command, 2 cores) | {wall:.2f} s | ≤ 5 s |")
    print(f"| peak memory of the report process | {rss / 2**20:.0f} MiB | |")
    print("| totals checked | step count and forward time equal the generator's | |\n")


if __name__ == "__main__":
    main()
