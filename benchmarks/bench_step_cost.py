"""What holoprof adds to each step, measured inside one traced process: the ~6 ms CPU step of
``bench_overhead.py --short`` (one torch thread, a DataLoader over a TensorDataset, batch 32), its
steps alternately with holoprof's patches in place and with the originals put back
(``workloads/cpu_loop_toggled.py``), so that both modes see the same process (memory layout, warm
caches) and the same moment of the machine. Separate processes differ by ±15% in step time on a
shared VM (memory layout, neighbours), which a ratio of whole runs cannot resolve to 1%.

    python benchmarks/bench_step_cost.py [--runs 5] [--steps 800] [--unpinned]

Prints, per part of the step (data, zero_grad, forward and loss, backward, optimizer step), the
median over runs of (median "on" step − median "off" step), and the agent's own threads' CPU time
over the loop. holoprof's optimizer step hooks are switched with the patches.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "workloads", "cpu_loop_toggled.py")
PARTS = ("step", "data", "zero_grad", "forward", "backward", "optimizer")


def one_run(out: str, steps: int, pin: list[str]) -> dict:
    cmd = [sys.executable, "-m", "holoprof.cli", "run", "--no-report", "--out", out, "--"]
    cmd += [*pin, sys.executable, WORKLOAD, str(steps), "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--unpinned", action="store_true")
    args = ap.parse_args()
    pin = (
        []
        if args.unpinned or not shutil.which("taskset")
        else ["taskset", "-c", str((os.cpu_count() or 1) - 1)]
    )
    diffs: dict[str, list[float]] = {p: [] for p in PARTS}
    base: dict[str, list[float]] = {p: [] for p in PARTS}
    threads = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            d = one_run(os.path.join(tmp, f"r{i}"), args.steps, pin)
            for k, p in enumerate(PARTS):
                on = statistics.median(x[k] for x in d["on"])
                off = statistics.median(x[k] for x in d["off"])
                diffs[p].append(on - off)
                base[p].append(off)
            threads.append(d["agent_threads_cpu_s"] / d["loop_s"])
    step = statistics.median(base["step"])
    added = statistics.median(diffs["step"])
    print("## What holoprof adds to a step, measured in one process\n")
    flags = f"--runs {args.runs} --steps {args.steps}" + (" --unpinned" if not pin else "")
    print(f"`python benchmarks/bench_step_cost.py {flags}`\n")
    print("| part | untraced (patches off) | added by holoprof, median of runs | each run |")
    print("| --- | --- | --- | --- |")
    for p in PARTS:
        each = ", ".join(f"{1e6 * v:+.0f}" for v in diffs[p])
        print(
            f"| {p} | {1e6 * statistics.median(base[p]):.0f} µs | {1e6 * statistics.median(diffs[p]):+.1f} µs | {each} |"
        )
    print(f"| agent threads' CPU over the loop | | {100 * statistics.median(threads):.2f}% of the loop | |")
    print(f"\nstep ratio (on/off): {(step + added) / step:.4f}; target ≤ 1.01\n")


if __name__ == "__main__":
    main()
