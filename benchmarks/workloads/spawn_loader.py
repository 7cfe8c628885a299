"""A DataLoader whose 2 workers are started with "spawn": how long until they serve batches.

    python spawn_loader.py [BATCHES] [CONTEXT] [WORKERS]

CONTEXT: how the workers start, "spawn" (default) or "forkserver"; WORKERS: how many (default 2). For counting a worker's
instructions (``bench_startup.py --instructions``): SPAWN_LOADER_EXECUTABLE starts the workers with
that program in place of the interpreter (a valgrind wrapper), SPAWN_LOADER_EXIT_AT_INIT=1 makes each
worker leave at once from its init function (the program's counts end there) and the training process
report as soon as both have, and SPAWN_LOADER_KEEP=N keeps N more objects alive in every process
(the garbage collector's clock moved by as many objects, as an agent's own would).

Prints one JSON line: first_batch_s (from iter() to the first batch: the workers' start, torch's
import in them included), loop_s (all BATCHES batches), worker_start_s (per worker, from the
kernel's start of its process to the worker's init function: its own start-up), worker_cpu_s (the
CPU time each worker used until then, which moves less than wall time when other work shares the
machine), and worker_full_gc (how many full garbage collections each worker ran until then) and
worker_full_gc_cpu_s (their CPU time: one full collection more or less, tens of milliseconds, is the
garbage collector's clock, which any few thousand objects more or less move). Nothing here knows
about holoprof.
"""

import gc
import json
import os
import sys
import time

FULL_GC = {"n": 0, "cpu_s": 0.0, "since": 0.0}


def count_full_gc(phase: str, info: dict) -> None:
    """The full (generation 2) collections of this process and their CPU time (a gc callback)."""
    if info["generation"] != 2:
        return
    if phase == "start":
        FULL_GC["since"] = time.process_time()
    else:
        FULL_GC["n"] += 1
        FULL_GC["cpu_s"] += time.process_time() - FULL_GC["since"]


gc.callbacks.append(count_full_gc)  # in each worker too: it loads this module before torch

import torch  # noqa: E402

KEPT = [[] for _ in range(int(os.environ.get("SPAWN_LOADER_KEEP", "0")))]
from torch.utils.data import DataLoader, Dataset  # noqa: E402


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
        f.write(f"{process_age_s()} {time.process_time()} {FULL_GC['n']} {FULL_GC['cpu_s']}")
    if os.environ.get("SPAWN_LOADER_EXIT_AT_INIT"):
        import posix

        posix._exit(0)  # the interpreter's own exit: nothing more runs in the worker


def main() -> None:
    batches = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    context = sys.argv[2] if len(sys.argv) > 2 else "spawn"
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    out = os.environ["SPAWN_LOADER_OUT"]
    if os.environ.get("SPAWN_LOADER_EXECUTABLE"):
        import multiprocessing

        multiprocessing.get_context(context).set_executable(os.environ["SPAWN_LOADER_EXECUTABLE"])
    loader = DataLoader(
        Squares(),
        batch_size=64 // batches,
        num_workers=workers,
        multiprocessing_context=context,
        worker_init_fn=init_worker,
    )
    t0 = time.perf_counter()
    it = iter(loader)
    if os.environ.get("SPAWN_LOADER_EXIT_AT_INIT"):
        while not all(os.path.exists(os.path.join(out, f"worker{w}")) for w in range(workers)):
            time.sleep(0.5)
        time.sleep(1)  # the files' contents
        print(json.dumps({"exited_at_init": True}), flush=True)
        os._exit(0)
    next(it)
    t1 = time.perf_counter()
    n = 1 + sum(1 for _ in it)
    t2 = time.perf_counter()
    starts, cpu, full, full_cpu = [], [], [], []
    for w in range(workers):
        with open(os.path.join(out, f"worker{w}")) as f:
            age, used, n_full, full_s = f.read().split()
        starts.append(float(age))
        cpu.append(float(used))
        full.append(int(n_full))
        full_cpu.append(float(full_s))
    res = {
        "batches": n,
        "first_batch_s": t1 - t0,
        "loop_s": t2 - t0,
        "worker_start_s": starts,
        "worker_cpu_s": cpu,
        "worker_full_gc": full,
        "worker_full_gc_cpu_s": full_cpu,
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
