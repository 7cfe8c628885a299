"""Always-on overhead of `holoprof run` on a CPU training loop (5-10 ms steps, with a DataLoader).

Alternates plain and traced runs of the same script; each run times its own loop (after warm-up);
the result is the median of the traced/plain ratios of adjacent pairs. The sampled steps are
excluded: the step whose FLOPs are counted (step 1) and the memory sampler's first steps are among
the 20 untimed warm-up steps, so what is timed is the always-on collection only. Where `taskset` exists, the
job runs on one core (the same one in both variants) so that run-to-run noise is smaller.

    python benchmarks/bench_overhead.py [--pairs 21] [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "workloads", "cpu_loop.py")


def _run(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=21)
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    import shutil

    holoprof = [sys.executable, "-m", "holoprof.cli"]
    pin = ["taskset", "-c", str((os.cpu_count() or 1) - 1)] if shutil.which("taskset") else []
    ratios, plain_steps, traced_steps = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            order = ("plain", "traced") if i % 2 == 0 else ("traced", "plain")
            res = {}
            for kind in order:
                if kind == "plain":
                    res[kind] = _run([*pin, sys.executable, WORKLOAD, str(args.steps)])
                else:
                    out = os.path.join(tmp, f"run{i}")
                    res[kind] = _run(
                        [
                            *holoprof,
                            "run",
                            "--no-report",
                            "--out",
                            out,
                            "--",
                            *pin,
                            sys.executable,
                            WORKLOAD,
                            str(args.steps),
                        ]
                    )
            ratios.append(res["traced"]["loop_s"] / res["plain"]["loop_s"])
            plain_steps.append(res["plain"]["median_step_s"])
            traced_steps.append(res["traced"]["median_step_s"])
    med = statistics.median(ratios)
    print("## Always-on overhead (CPU loop with DataLoader)\n")
    print(f"`python benchmarks/bench_overhead.py --pairs {args.pairs} --steps {args.steps}`\n")
    print(
        "The sampled steps (the FLOP-counted step 1, the memory sampler's first 3) are among the 20 "
        "untimed warm-up steps: excluded.\n"
    )
    print("| measure | value |\n| --- | --- |")
    print(f"| median plain step | {1e3 * statistics.median(plain_steps):.2f} ms |")
    print(f"| median traced step | {1e3 * statistics.median(traced_steps):.2f} ms |")
    print(
        f"| loop time ratio traced/plain, median of {args.pairs} alternating pairs | {med:.4f} ({100 * (med - 1):+.2f}%) |"
    )
    print(f"| all ratios | {', '.join(f'{r:.3f}' for r in ratios)} |")
    print("| target | ≤ 1.01 |\n")


if __name__ == "__main__":
    main()
