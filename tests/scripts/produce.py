"""First half of a shell pipeline: writes numbered lines, marking each as a step."""

import sys
import time

import holoprof

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5
with holoprof.phase("data_wait"):
    time.sleep(0.01)
for i in range(N):
    with holoprof.phase("forward"):
        time.sleep(0.01)
    print(i, flush=True)
    holoprof.step()
