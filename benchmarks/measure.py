"""Measurements the benchmarks share (imported by the scripts beside it, run as files)."""

from __future__ import annotations

import json
import subprocess
import sys


def peak(cmd: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (bytes) and stdout of ``cmd`` (the peak of the child, from its rusage,
    measured by a Python of its own so that no earlier child's peak counts)."""
    code = (
        "import resource, subprocess, sys, time, json; t = time.perf_counter(); "
        f"p = subprocess.run({cmd!r}, capture_output=True, text=True); "
        "w = time.perf_counter() - t; "
        "print(json.dumps([w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, p.returncode])); "
        "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    head, _, rest = proc.stdout.partition("\n")
    wall, rss, rc = json.loads(head)
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    return float(wall), int(rss), rest
