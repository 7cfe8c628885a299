"""A loop with no framework at all: ``holoprof.step()`` marks the end of each iteration.

``python manual_steps.py N [--phases] [--announce]``: N iterations of 10 ms; with ``--phases`` each
iteration's work is marked ``holoprof.phase("forward")``; with ``--announce`` it prints ``started``
after 5 iterations.
"""

import sys
import time

import holoprof

n = int(sys.argv[1])
phases = "--phases" in sys.argv
announce = "--announce" in sys.argv
for i in range(n):
    if phases:
        with holoprof.phase("forward"):
            time.sleep(0.01)
    else:
        time.sleep(0.01)
    holoprof.step()
    if announce and i == 4:
        print("started", flush=True)
print(f"iterations {n}")
