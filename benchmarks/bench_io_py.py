"""Cost of the Python I/O layer per read: a loop of 4 KiB reads with and without it, in process.

    python benchmarks/bench_io_py.py [--reads N] [--repeat R]

Reads a 64 MiB file (page cache) in 4 KiB reads through ``open(path, "rb")`` (each ``f.read(4096)``
is one raw read) and through ``os.read`` on a descriptor, best of R alternating rounds, and prints the time per
read without the layer, with it, the added ns and the ratio. Budget: at most 1500 ns added per read.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

BLOCK = 4096
FILE_BYTES = 64 << 20
BUDGET_NS = 1500.0


def file_reads(path: str, n: int) -> float:
    with open(path, "rb") as f:
        read, seek = f.read, f.seek
        t0 = time.perf_counter_ns()
        for _ in range(n):
            if not read(BLOCK):
                seek(0)
        return (time.perf_counter_ns() - t0) / n


def fd_reads(path: str, n: int) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            if not os.read(fd, BLOCK):
                os.lseek(fd, 0, 0)
        return (time.perf_counter_ns() - t0) / n
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reads", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    from holoprof.agent.core import Agent
    from holoprof.collect.io_collector import IoCollector

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(FILE_BYTES))
        results = {}
        for name, fn in (("file.read(4096)", file_reads), ("os.read(fd, 4096)", fd_reads)):
            fn(path, 20_000)  # warm the page cache
            # alternate untraced and traced rounds (best of each) so that load on the machine hits both
            base = traced = float("inf")
            reads = 0
            for _ in range(args.repeat):
                base = min(base, fn(path, args.reads))
                agent = Agent(os.path.join(tmp, "run"), options={"io_layer": "python"})
                col = IoCollector(agent)
                agent.collectors = [col]
                col.install()
                try:
                    traced = min(traced, fn(path, args.reads))
                    rows = col.python_rows()
                finally:
                    col.uninstall()
                reads += sum(json.loads(r["counters"])["POSIX_READS"] for r in rows if r["path"] == path)
            results[name] = {
                "baseline_ns": round(base, 1),
                "traced_ns": round(traced, 1),
                "added_ns": round(traced - base, 1),
                "ratio": round(traced / base, 3),
                "reads_counted": reads,
                "within_budget": traced - base <= BUDGET_NS,
            }
    for name, r in results.items():
        print(
            f"{name:20s} baseline {r['baseline_ns']:7.1f} ns  traced {r['traced_ns']:7.1f} ns  "
            f"added {r['added_ns']:6.1f} ns  ratio {r['ratio']:.2f}  (budget {BUDGET_NS:.0f} ns: "
            f"{'ok' if r['within_budget'] else 'OVER'})"
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
