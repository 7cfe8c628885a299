"""Report of a running job against the same report once the job has finished.

A job flushes every 5 ms (thousands of chunks: what a long job writes with the default 1 s flush over
hours); while it runs, ``holoprof report --json`` is timed every few seconds, and again after the job
ended. Prints the file count of the job's spans partition at each report and the step counts.

    python benchmarks/bench_live_report.py [--steps 6000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

JOB = """
import sys, time
import holoprof
for i in range(int(sys.argv[1])):
    with holoprof.phase("forward"):
        time.sleep(0.005)
    holoprof.step()
"""


def report(run: str) -> tuple[float, int]:
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "holoprof.cli", "report", run, "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return time.perf_counter() - t, int(json.loads(out)["steps"]["count"])


def files(run: str) -> int:
    return sum(len(fs) for _, _, fs in os.walk(run) if fs) - 1  # less the manifest


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        job, run = os.path.join(d, "job.py"), os.path.join(d, "run")
        with open(job, "w") as f:
            f.write(JOB)
        cmd = [sys.executable, "-m", "holoprof.cli", "run", "--out", run, "--no-report"]
        proc = subprocess.Popen([*cmd, "--flush-interval", "0.005", "--", job, str(args.steps)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        time.sleep(5)
        live = []
        while proc.poll() is None:
            n = files(run)
            s, steps = report(run)
            live.append(s)
            print(f"running: report {s:.2f} s, {steps} steps, {n} files in the run", flush=True)
            time.sleep(3)
        done = [report(run)[0] for _ in range(3)]
        print(f"finished: report {sorted(done)[1]:.2f} s (median of 3), {files(run)} files")
        print(f"running: median {sorted(live)[len(live) // 2]:.2f} s over {len(live)} reports")


if __name__ == "__main__":
    main()
