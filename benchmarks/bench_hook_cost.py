"""Where a traced step's added time goes, on a loop whose step is mostly holoprof's bookkeeping
(``workloads/tiny_loop_parts.py``: a 0.5 ms CPU step). Three kinds of run, alternated: untraced,
traced, and traced with every patch and optimizer step hook taken out after start-up ("patches
off": what remains is the process-wide cost, the agent's threads and the native I/O library). Per
part of the step, the median over runs of each run's median; the median time of each of holoprof's
optimizer step hooks; and what the wrapper adds to a nested module call (``workloads/nested_calls.py``).

    python benchmarks/bench_hook_cost.py [--runs 5] [--steps 4000]
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
WORKLOAD = os.path.join(HERE, "workloads", "tiny_loop_parts.py")
NESTED = os.path.join(HERE, "workloads", "nested_calls.py")
PARTS = ("step", "data", "zero_grad", "forward", "backward", "optimizer")


def one(kind: str, steps: int, tmp: str, i: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, WORKLOAD, str(steps)]
    if kind != "untraced":
        cmd = [
            sys.executable,
            "-m",
            "holoprof.cli",
            "run",
            "--no-report",
            "--out",
            os.path.join(tmp, f"{kind}{i}"),
            "--",
            *cmd,
        ]
        if kind == "patches off":
            env["PATCHES_OFF"] = "1"
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=4000)
    args = ap.parse_args()
    kinds = ("untraced", "traced", "patches off")
    got: dict[str, list[dict]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for k in kinds:
                got[k].append(one(k, args.steps, tmp, i))
    med = {k: {p: statistics.median(r["parts_us"][p] for r in got[k]) for p in PARTS} for k in kinds}
    print("## Where a traced step's added time goes (a 0.5 ms step)\n")
    print(f"`python benchmarks/bench_hook_cost.py --runs {args.runs} --steps {args.steps}`\n")
    print("| part | untraced | traced | added | traced, patches off | added |")
    print("| --- | --- | --- | --- | --- | --- |")
    for p in PARTS:
        u, t, o = med["untraced"][p], med["traced"][p], med["patches off"][p]
        print(f"| {p} | {u:.1f} µs | {t:.1f} µs | {t - u:+.1f} µs | {o:.1f} µs | {o - u:+.1f} µs |")
    hooks: dict[str, list[float]] = {}
    for r in got["traced"]:
        for name, v in r["hooks_us"].items():
            hooks.setdefault(name, []).append(v)
    print("\n| holoprof's optimizer step hook | median time per call |")
    print("| --- | --- |")
    for name, v in sorted(hooks.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"| `{name}` | {statistics.median(v):.2f} µs |")
    print()
    # a nested module call (each module inside the outermost one: hundreds a step in a transformer)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "holoprof.cli", "run", "--no-report", "--out", os.path.join(tmp, "n")]
        cmd += ["--", sys.executable, NESTED]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    print(next(line for line in out.splitlines() if line.startswith("per nested")) + "\n")


if __name__ == "__main__":
    main()
