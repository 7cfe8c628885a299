"""Run every benchmark and write their raw output to benchmarks/out/RESULTS-<date>.md (`make bench`).

benchmarks/RESULTS.md is the curated record: each section there names the command that produced its
figures, with what they mean. Compare a fresh run's output with it; it is never overwritten.
Longer or optional benchmarks run only when named: ``python benchmarks/run_all.py bench_hta.py``.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHES = [
    "bench_overhead.py",  # always-on overhead on a CPU training loop (issue: foundation)
    "bench_step_cost.py",  # what holoprof adds to a 6 ms step, measured inside one traced process
    "bench_hook_cost.py",  # a 0.5 ms step: added time by part, patches off, each optimizer hook
    "bench_hotpath.py",  # cost per span, per module call, agent memory bound
    "bench_startup.py",  # ms added per short Python process and per spawned DataLoader worker
    "bench_report_scale.py",  # report on 10M generated spans
    "bench_multihost_scale.py",  # 64 hosts x 8 ranks generated: load, report, exports
    "bench_io_native.py",  # ns added per intercepted read()
    "bench_io_py.py",  # ns added per read in the Python layer
    "bench_io_dataloader.py",  # DataLoader reading 10,000 small files, traced/untraced
    "bench_memory.py",  # sampled and full memory accounting
    "bench_iobench_fio.py",  # holoprof iobench against fio (needs Debian's fio)
    "bench_burst.py",  # BurstBuffer blocking time; pass --durable-dir on slow (network) storage
    "bench_whatif.py",  # what-if predictions against tc-limited veth links (needs root, iproute2)
    "bench_input_model.py",  # input-pipeline model: predicted against measured step, 0/1/2 workers
    "bench_serve.py",  # holoprof serve: /metrics over 100 runs, 1,050 idle connections
    "bench_flight_recorder.py",  # torch's flight recorder on and off: a gloo DDP loop, one collective
]


def main() -> None:
    sections = []
    for b in BENCHES + [a for a in sys.argv[1:] if a not in BENCHES]:
        path = os.path.join(HERE, b)
        if not os.path.exists(path):
            continue
        print(f"running {b} ...", file=sys.stderr, flush=True)
        out = subprocess.run([sys.executable, path], capture_output=True, text=True)
        if out.returncode != 0:
            sections.append(f"## {b}\n\nfailed:\n\n```\n{out.stderr[-2000:]}\n```\n")
        else:
            sections.append(out.stdout)
    head = (
        "# Benchmark results\n\n"
        f"Produced by `make bench` (`python benchmarks/run_all.py`) on {time.strftime('%Y-%m-%d')}, "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
        "Every overhead is a ratio against the untraced run in the same process or run.\n\n"
    )
    out_dir = os.path.join(HERE, "out")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"RESULTS-{time.strftime('%Y%m%d-%H%M%S')}.md")
    with open(path, "w") as f:
        f.write(head + "\n".join(sections))
    print(f"raw results written to {path}; the curated record is benchmarks/RESULTS.md", file=sys.stderr)
    print(head + "\n".join(sections))


if __name__ == "__main__":
    main()
