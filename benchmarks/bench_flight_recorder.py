"""What torch's flight recorder costs a gloo DDP loop: its default buffer against none.

python benchmarks/bench_flight_recorder.py [--pairs 5] [--steps 300]

torch 2.6+ records every collective in its flight recorder by default (2000 entries; gloo's too in
recent versions); holoprof's hang watchdog reads it, and turns a small one on only where torch records
nothing by default (holoprof.collect.flight_recorder). This measures what recording costs: the same
2-rank DDP job under torchrun (untraced), with ``TORCH_FR_BUFFER_SIZE=0`` and with torch's default,
in alternating pairs; each job times its own steady steps (the median of rank 0's). Prints a markdown
section.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile

JOB = """
import os, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randn(32, 1)
times = []
for step in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    opt.step()
    times.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    steady = sorted(times[len(times) // 5:])
    print("STEP", steady[len(steady) // 2], total.item(), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


#: One process, a gloo group of one: the time of one tiny synchronous all_reduce, where the
#: recorder's own work (an entry, the Python stack it captures) is the largest share.
ONE = """
import os, sys, tempfile, time, torch, torch.distributed as dist
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "s"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
t = torch.ones(4)
for _ in range(2000):
    dist.all_reduce(t)
best = []
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(int(sys.argv[1])):
        dist.all_reduce(t)
    best.append((time.perf_counter() - t0) / int(sys.argv[1]))
print("CALL", sorted(best)[len(best) // 2], flush=True)
dist.destroy_process_group()
"""


def job_env(buffer: str | None) -> dict[str, str]:
    """This environment with one OpenMP thread and the flight recorder's buffer set to ``buffer``
    (None: torch's default)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
    }
    env["OMP_NUM_THREADS"] = "1"
    if buffer is not None:
        env["TORCH_FR_BUFFER_SIZE"] = buffer
    return env


def per_call(n: int, buffer: str | None) -> float:
    env = job_env(buffer)
    out = subprocess.run(
        [sys.executable, "-c", ONE, str(n)], env=env, capture_output=True, text=True, timeout=600, check=True
    ).stdout
    return float(next(ln for ln in out.splitlines() if ln.startswith("CALL ")).split()[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one(script: str, steps: int, buffer: str | None) -> tuple[float, float]:
    env = job_env(buffer)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", str(free_port()), script, str(steps)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the job failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    out = proc.stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("STEP "))
    _, step_s, loss = line.split()
    return float(step_s), float(loss)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "ddp.py")
        with open(script, "w") as f:
            f.write(JOB)
        ratios, off_s, on_s, losses = [], [], [], set()
        for i in range(args.pairs):
            order = [("0", off_s), (None, on_s)] if i % 2 == 0 else [(None, on_s), ("0", off_s)]
            got = {}
            for buffer, acc in order:
                step_s, loss = one(script, args.steps, buffer)
                acc.append(step_s)
                got[buffer] = step_s
                losses.add(loss)
            ratios.append(got[None] / got["0"])
    print("## torch's flight recorder: its cost on a gloo DDP loop\n")
    print(f"torch {torch.__version__}, 2 ranks under torchrun, {args.steps} steps of a 64-64-1 MLP (DDP,")
    print("one loss all_reduce a step), the median of rank 0's steady steps per job; alternating pairs.\n")
    print("| buffer | median step (ms) |\n| --- | --- |")
    print(f"| `TORCH_FR_BUFFER_SIZE=0` (off) | {1e3 * statistics.median(off_s):.3f} |")
    print(f"| torch's default (2000 entries) | {1e3 * statistics.median(on_s):.3f} |\n")
    print(
        f"Ratio on/off per pair: {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}."
    )
    print(f"Final losses identical in every job: {len(losses) == 1}.\n")
    calls_off, calls_on = [], []
    for i in range(args.pairs):
        for buffer in ("0", None) if i % 2 == 0 else (None, "0"):
            (calls_off if buffer == "0" else calls_on).append(per_call(20_000, buffer))
    off, on = statistics.median(calls_off), statistics.median(calls_on)
    print("One synchronous all_reduce of 4 floats on a gloo group of one process (20,000 calls, the")
    print(f"median of 5 rounds, {args.pairs} processes each): {1e6 * off:.2f} µs off, {1e6 * on:.2f} µs")
    print(f"with the recorder: {1e6 * (on - off):+.2f} µs a collective.")


if __name__ == "__main__":
    main()
