"""A DataLoader whose 2 workers are started with "spawn": how long until they serve batches.

    python spawn_loader.py [BATCHES]

Prints one JSON line: first_batch_s (from iter() to the first batch: the workers' start, torch's
import in them included), loop_s (all BATCHES batches), worker_start_s (per worker, from the
kernel's start of its process to the worker's init function: its own start-up) and worker_cpu_s (the
CPU time each worker used until then, which moves less than wall time when other work shares the
machine). Nothing here knows about holoprof.
"""

import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((4,), float(i * i))


def process_age_s() -> float:
    """Seconds since the kernel started this process (/proc/self/stat's start time)."""
    with open("/proc/self/stat", "rb") as f:
        stat = f.read()
    ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
    return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")


def init_worker(worker_id: int) -> None:
    # the parent reads these files once the loop is over
    with open(os.path.join(os.environ["SPAWN_LOADER_OUT"], f"worker{worker_id}"), "w") as f:
        f.write(f"{process_age_s()} {time.process_time()}")


def main() -> None:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    out = os.environ["SPAWN_LOADER_OUT"]
    loader = DataLoader(
        Squares(),
        batch_size=64 // batches,
        num_workers=2,
        multiprocessing_context="spawn",
        worker_init_fn=init_worker,
    )
    t0 = time.perf_counter()
    it = iter(loader)
    next(it)
    t1 = time.perf_counter()
    n = 1 + sum(1 for _ in it)
    t2 = time.perf_counter()
    starts, cpu = [], []
    for w in range(2):
        with open(os.path.join(out, f"worker{w}")) as f:
            age, used = f.read().split()
        starts.append(float(age))
        cpu.append(float(used))
    res = {
        "batches": n,
        "first_batch_s": t1 - t0,
        "loop_s": t2 - t0,
        "worker_start_s": starts,
        "worker_cpu_s": cpu,
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
