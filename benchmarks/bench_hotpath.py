"""Hot-path cost per recorded span, per traced module call, and the agent's memory bound.

python benchmarks/bench_hotpath.py
"""

from __future__ import annotations

import gc
import os
import tempfile
import time

import psutil


def per_span_ns(agent, n: int = 1_000_000) -> float:
    span = agent.span
    t_start = time.perf_counter_ns()
    for i in range(n):
        span("phase", "forward", i, i + 1, 0)
    return (time.perf_counter_ns() - t_start) / n


def main() -> None:
    from holoprof.agent.core import Agent

    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(tmp, role="main", options={"buffer_limit": 2_000_000})
        agent.folder = os.path.join(tmp, "bench")
        os.makedirs(agent.folder)
        costs = []
        for _ in range(5):
            agent.spans_buf = []
            gc.collect()
            costs.append(per_span_ns(agent))
        span_ns = sorted(costs)[len(costs) // 2]

        # a traced outermost module call vs the same call untraced (tiny module: pure overhead)
        import torch

        from holoprof.collect.torch import TorchCollector

        mod = torch.nn.Identity()
        x = torch.zeros(1)
        n = 200_000

        def time_calls() -> float:
            t0 = time.perf_counter_ns()
            for _ in range(n):
                mod(x)
            return (time.perf_counter_ns() - t0) / n

        with torch.no_grad():
            base = min(time_calls() for _ in range(3))
            col = TorchCollector(agent)
            col._patch(torch)
            traced = min(time_calls() for _ in range(3))
            agent.spans_buf = []
            col.uninstall()

        # memory bound: a job producing spans far faster than any training loop, for 20 s
        agent2 = Agent(tmp, role="main", options={})
        agent2.folder = os.path.join(tmp, "mem")
        agent2.start(process_hooks=False)
        proc = psutil.Process()
        gc.collect()
        rss0 = proc.memory_info().rss
        peak = rss0
        t_end = time.monotonic() + 20
        produced = 0
        while time.monotonic() < t_end:
            for i in range(10_000):
                agent2.span("phase", "forward", i, i + 1, 0)
            produced += 10_000
            peak = max(peak, proc.memory_info().rss)
        agent2.shutdown()

    print("## Hot path and agent memory\n")
    print("`python benchmarks/bench_hotpath.py`\n")
    print("| measure | value | target |\n| --- | --- | --- |")
    print(f"| cost per recorded span (Agent.span) | {span_ns:.0f} ns | ≤ 1000 ns |")
    print(f"| added per outermost module call (forward span + phase logic) | {traced - base:.0f} ns | — |")
    print(
        f"| agent memory growth while recording {produced / 20 / 1e6:.2f} M spans/s for 20 s "
        f"({agent2.dropped} dropped) | {(peak - rss0) / 2**20:.1f} MiB | ≤ 64 MiB |\n"
    )


if __name__ == "__main__":
    main()
