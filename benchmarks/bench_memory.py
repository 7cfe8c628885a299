"""Cost of memory accounting: default sampled steps (target ≤ 1%) and `--memory full` (target ≤ 10%).

Runs benchmarks/workloads/cpu_loop.py (a 5-10 ms CPU step with a DataLoader, timing its own loop)
in rounds: plain, `holoprof run --memory off`, default (sampled), `--memory full`, in a rotating
order. The cost of memory accounting is measured against `--memory off` (the same tracing without
it), median over rounds, two ways:

* wall: the loop time the workload reports (what a user sees; noisy on a shared machine);
* CPU: the CPU time of the whole run (launcher and job, from the kernel's accounting) at two loop
  lengths, ``--steps`` and ``--steps // 5``; their difference is the CPU time of the extra steps, with
  start-up and shutdown cancelled out. CPU time does not count time spent waiting for a core, so it
  holds still when other work shares the machine.

    python benchmarks/bench_memory.py [--rounds-inproc 30] [--block 50] [--subprocess] [--json FILE]

By default it measures in one process, interleaving blocks of steps (see :func:`inprocess_bench`),
which holds still on a busy machine; ``--subprocess`` adds the whole-run comparison above.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "workloads", "cpu_loop.py")
KINDS = ("plain", "off", "sampled", "full")


def _run(cmd: list[str]) -> tuple[dict[str, float], float]:
    """The workload's JSON line, and the CPU seconds of the command and its descendants."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(json.loads(out.strip().splitlines()[-1])), cpu


def subprocess_bench(args: argparse.Namespace) -> None:
    holoprof = [sys.executable, "-m", "holoprof.cli", "run", "--no-report"]
    short = max(20, args.steps // 5)
    loop: dict[str, list[float]] = {k: [] for k in KINDS}
    step: dict[str, list[float]] = {k: [] for k in KINDS}
    cpu: dict[str, list[float]] = {k: [] for k in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            order = KINDS[i % len(KINDS) :] + KINDS[: i % len(KINDS)]
            for kind in order:
                spent = {}
                for n in (args.steps, short):
                    if kind == "plain":
                        res, c = _run([sys.executable, WORKLOAD, str(n)])
                    else:
                        out = os.path.join(tmp, f"{kind}{i}-{n}")
                        res, c = _run([*holoprof, "--out", out, "--memory", kind, "--", WORKLOAD, str(n)])
                    spent[n] = c
                    if n == args.steps:
                        loop[kind].append(res["loop_s"])
                        step[kind].append(res["median_step_s"])
                cpu[kind].append(max(1e-9, spent[args.steps] - spent[short]))

    def ratio(data: dict[str, list[float]], k: str, base: str) -> float:
        return statistics.median(a / b for a, b in zip(data[k], data[base], strict=True))

    wall = {k: ratio(loop, k, "off") for k in ("sampled", "full")}
    cpu_r = {k: ratio(cpu, k, "off") for k in ("sampled", "full")}
    vs_plain = {k: ratio(loop, k, "plain") for k in ("off", "sampled", "full")}
    cpu_plain = {k: ratio(cpu, k, "plain") for k in ("off", "sampled", "full")}
    extra = args.steps - short
    print("## Memory accounting overhead (CPU loop with DataLoader, Adam)\n")
    print(f"`python benchmarks/bench_memory.py --rounds {args.rounds} --steps {args.steps}`\n")
    print("| measure | value | target |\n| --- | --- | --- |")
    for k in KINDS:
        per_step = 1e3 * statistics.median(cpu[k]) / extra
        print(
            f"| median step, {k} | {1e3 * statistics.median(step[k]):.2f} ms wall, {per_step:.2f} ms CPU | |"
        )
    for k, target in (("sampled", "≤ 1.01"), ("full", "≤ 1.10")):
        print(
            f"| CPU per step {k} / off, median of {args.rounds} rounds | {cpu_r[k]:.4f} ({100 * (cpu_r[k] - 1):+.2f}%) | {target} |"
        )
        print(
            f"| loop wall time {k} / off, median of {args.rounds} rounds | {wall[k]:.4f} ({100 * (wall[k] - 1):+.2f}%) | {target} |"
        )
    for k in ("off", "sampled", "full"):
        print(f"| {k} / plain: CPU per step, loop wall time | {cpu_plain[k]:.4f}, {vs_plain[k]:.4f} | |")
    print(
        f"| all CPU ratios sampled/off | {', '.join(f'{a / b:.3f}' for a, b in zip(cpu['sampled'], cpu['off'], strict=True))} | |"
    )
    print(
        f"| all CPU ratios full/off | {', '.join(f'{a / b:.3f}' for a, b in zip(cpu['full'], cpu['off'], strict=True))} | |"
    )
    if args.json:
        with open(args.json, "w") as f:
            doc = {
                "loop_s": loop,
                "median_step_s": step,
                "cpu_s": cpu,
                "wall_ratio_vs_off": wall,
                "cpu_ratio_vs_off": cpu_r,
            }
            json.dump(doc, f, indent=2)


# --- in-process, interleaved ----------------------------------------------------------------------------
def inprocess_bench(args: argparse.Namespace) -> None:
    """The cpu_loop workload in one traced process, switching memory accounting between blocks of steps.

    Blocks of ``--block`` steps run with the memory collector off, sampled and full, in a rotating
    order; each block's training-thread CPU time and wall time are compared with the 'off' block of the
    same round. Neighbouring blocks share the machine's load, so their ratio holds still where whole
    runs do not. Sampled blocks run at the real rate: one measured step in 50 (step index % 50 == 0).
    """
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import holoprof
    from holoprof.agent.core import get_agent
    from holoprof.collect.memory import MemoryCollector, is_sampled

    with tempfile.TemporaryDirectory() as tmp:
        holoprof.start(out=os.path.join(tmp, "run"))
        agent = get_agent()
        assert agent is not None
        col = next(c for c in agent.collectors if isinstance(c, MemoryCollector))
        torch.manual_seed(0)
        torch.set_num_threads(1)
        block, rounds = args.block, args.rounds_inproc
        total = block * len(KINDS[1:]) * rounds + 100
        x = torch.randn(64 * total, 256)
        y = torch.randint(0, 10, (64 * total,))
        it = iter(DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True))
        w = args.width
        model = nn.Sequential(nn.Linear(256, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = nn.CrossEntropyLoss()

        def steps(n: int) -> tuple[float, float]:
            c0, w0 = time.thread_time(), time.perf_counter()
            for _ in range(n):
                xb, yb = next(it)
                opt.zero_grad()
                loss_fn(model(xb), yb).backward()
                opt.step()
            return time.thread_time() - c0, time.perf_counter() - w0

        def set_mode(mode: str) -> None:
            col.mode = mode
            if mode == "full" or (mode == "sampled" and is_sampled(agent.steps.index + 1, mode)):
                col.tracker.arm()
            else:
                col.tracker.disarm()

        set_mode("off")
        steps(60)  # warm-up (the first sampled steps happen here)
        kinds = ("off", "sampled", "full")
        cpu: dict[str, list[float]] = {k: [] for k in kinds}
        wall: dict[str, list[float]] = {k: [] for k in kinds}
        for i in range(rounds):
            order = kinds[i % 3 :] + kinds[: i % 3]
            for kind in order:
                set_mode(kind)
                c, w = steps(block)
                cpu[kind].append(c)
                wall[kind].append(w)
        holoprof.stop()

    def ratio(data: dict[str, list[float]], k: str) -> float:
        return statistics.median(a / b for a, b in zip(data[k], data["off"], strict=True))

    print(
        f"## Memory accounting overhead, in-process interleaved (MLP of width {args.width}, Adam, batch 64)\n"
    )
    width = "" if args.width == 512 else f" --width {args.width}"
    print(f"`python benchmarks/bench_memory.py --rounds-inproc {rounds} --block {block}{width}`\n")
    print("| measure | value | target |\n| --- | --- | --- |")
    for k in kinds:
        print(
            f"| median step, {k} | {1e3 * statistics.median(wall[k]) / block:.3f} ms wall, "
            f"{1e3 * statistics.median(cpu[k]) / block:.3f} ms CPU | |"
        )
    for k, target in (("sampled", "≤ 1.01"), ("full", "≤ 1.10")):
        print(
            f"| {k} / off, CPU time, median of {rounds} interleaved blocks of {block} steps | "
            f"{ratio(cpu, k):.4f} ({100 * (ratio(cpu, k) - 1):+.2f}%) | {target} |"
        )
        print(
            f"| {k} / off, wall time | {ratio(wall, k):.4f} ({100 * (ratio(wall, k) - 1):+.2f}%) | {target} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu_s": cpu, "wall_s": wall, "block": block}, f, indent=2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds-inproc", type=int, default=30, help="interleaved rounds (in-process)")
    ap.add_argument("--block", type=int, default=50, help="steps per block (in-process)")
    ap.add_argument(
        "--width",
        type=int,
        default=512,
        help="hidden width of the in-process MLP: 512 is a 2-3 ms step; 1024 is cpu_loop.py's model (about 4x)",
    )
    ap.add_argument("--subprocess", action="store_true", help="also compare whole runs of cpu_loop.py")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of whole runs (--subprocess)")
    ap.add_argument("--steps", type=int, default=300, help="steps of each whole run (--subprocess)")
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args()
    inprocess_bench(args)
    if args.subprocess:
        args.json = args.json and args.json + ".subprocess.json"
        subprocess_bench(args)


if __name__ == "__main__":
    main()
