"""Always-on overhead of `holoprof run` on a CPU training loop (5-10 ms steps, with a DataLoader).

Alternates plain and traced runs of the same script; each run times its own loop (after warm-up);
the result is the median of the traced/plain ratios of adjacent pairs. By default the sampled steps
are excluded: the step whose FLOPs are counted (step 1) and the memory sampler's first steps are among
the 20 untimed warm-up steps, so what is timed is the always-on collection only (`--warmup 0` times
them too). Where `taskset` exists, the job runs on one core (the same one in both variants) so that
run-to-run noise is smaller; `--unpinned` lets the scheduler place it, as most jobs run.

    python benchmarks/bench_overhead.py [--pairs 21] [--steps 150] [--width 1024] [--batch 64]
        [--warmup 20] [--unpinned] [--option memory=off ...]

`--concurrent` runs each pair's plain and traced job at the same time, each pinned to a core of its own
(the cores swapped from pair to pair), so that both see the same machine (another VM's load, clock
changes) and the pair's ratio keeps only what tracing adds; it needs two cores.

`--short` is the short-step case: about 7 ms steps of batch 32, timed from the first step (the steps
the memory collector samples first included): `--width 640 --batch 32 --warmup 0 --steps 400`.
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


def _run_together(cmds: dict[str, list[str]]) -> dict[str, dict]:
    """Each command started at once; their last JSON lines."""
    procs = {
        k: subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k, c in cmds.items()
    }
    res = {}
    for k, p in procs.items():
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{' '.join(cmds[k])} failed: {err[-2000:]}")
        res[k] = json.loads(out.strip().splitlines()[-1])
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=21)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--short", action="store_true", help="--width 640 --batch 32 --warmup 0 --steps 400")
    ap.add_argument("--unpinned", action="store_true", help="do not pin the job to one core")
    ap.add_argument(
        "--concurrent", action="store_true", help="run each pair's two jobs at once, on a core each"
    )
    ap.add_argument(
        "--option", action="append", default=[], help="holoprof run option NAME=VALUE, e.g. memory=off"
    )
    args = ap.parse_args()
    if args.short:
        args.width, args.batch, args.warmup, args.steps = 640, 32, 0, 400
    import shutil

    holoprof = [sys.executable, "-m", "holoprof.cli"]
    opts = [x for o in args.option for x in (f"--{o.split('=', 1)[0]}", o.split("=", 1)[1])]
    pin = (
        []
        if args.unpinned or not shutil.which("taskset")
        else ["taskset", "-c", str((os.cpu_count() or 1) - 1)]
    )
    job = [sys.executable, WORKLOAD, str(args.steps), str(args.width), str(args.batch), str(args.warmup)]
    ratios, plain_steps, traced_steps = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            out = os.path.join(tmp, f"run{i}")
            traced = [*holoprof, "run", "--no-report", "--out", out, *opts, "--"]
            if args.concurrent:
                cores = (0, 1) if i % 2 == 0 else (1, 0)
                res = _run_together(
                    {
                        "plain": ["taskset", "-c", str(cores[0]), *job],
                        "traced": [*traced, "taskset", "-c", str(cores[1]), *job],
                    }
                )
            else:
                order = ("plain", "traced") if i % 2 == 0 else ("traced", "plain")
                res = {}
                for kind in order:
                    res[kind] = _run([*pin, *job] if kind == "plain" else [*traced, *pin, *job])
            ratios.append(res["traced"]["loop_s"] / res["plain"]["loop_s"])
            plain_steps.append(res["plain"]["median_step_s"])
            traced_steps.append(res["traced"]["median_step_s"])
    med = statistics.median(ratios)
    print("## Always-on overhead (CPU loop with DataLoader)\n")
    flags = f"--pairs {args.pairs} --steps {args.steps} --width {args.width} --batch {args.batch} --warmup {args.warmup}"
    flags += " --unpinned" if not pin and not args.concurrent else ""
    flags += " --concurrent" if args.concurrent else ""
    flags += "".join(f" --option {o}" for o in args.option)
    print(f"`python benchmarks/bench_overhead.py {flags}`\n")
    if args.warmup >= 4:
        print(
            "The sampled steps (the FLOP-counted step 1, the memory sampler's first 3) are among the "
            f"{args.warmup} untimed warm-up steps: excluded.\n"
        )
    print("| measure | value |\n| --- | --- |")
    print(f"| median plain step | {1e3 * statistics.median(plain_steps):.2f} ms |")
    print(f"| median traced step | {1e3 * statistics.median(traced_steps):.2f} ms |")
    print(
        f"| loop time ratio traced/plain, median of {args.pairs} {'concurrent' if args.concurrent else 'alternating'} pairs | {med:.4f} ({100 * (med - 1):+.2f}%) |"
    )
    print(f"| all ratios | {', '.join(f'{r:.3f}' for r in ratios)} |")
    print("| target | ≤ 1.01 |\n")


if __name__ == "__main__":
    main()
