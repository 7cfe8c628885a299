"""Second half of a shell pipeline: sums the numbers it reads, one step per line."""

import sys
import time

import holoprof

total = 0
for line in sys.stdin:
    with holoprof.phase("forward"):
        time.sleep(0.005)
        total += int(line)
    holoprof.step()
print(f"sum {total}")
