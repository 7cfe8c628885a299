"""A loop of N marked steps of a fixed length (no framework).

``python steps.py N [--step S] [--extra S] [--start-at T]``: every step does a little arithmetic and
sleeps S (+ extra) seconds, then calls ``holoprof.step()``. Two runs that differ only by
``--extra 0.005`` differ by 5 ms per step. ``--start-at T`` waits until wall-clock time T before the
loop, so that runs to be compared share the machine's load.
"""

from __future__ import annotations

import argparse
import time

import holoprof

ap = argparse.ArgumentParser()
ap.add_argument("n", type=int)
ap.add_argument("--step", type=float, default=0.02)
ap.add_argument("--extra", type=float, default=0.0)
ap.add_argument("--start-at", type=float, default=0.0, help="wall-clock time (s) to start the loop at")
args = ap.parse_args()
time.sleep(max(0.0, args.start_at - time.time()))
total = 0
for _ in range(args.n):
    with holoprof.phase("forward"):
        total += sum(range(1000))
        time.sleep(args.step + args.extra)
    holoprof.step()
print(f"steps {args.n}")
