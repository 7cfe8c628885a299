"""``holoprof.trace`` inside a job that ``holoprof run`` already traces: it joins that run."""

import sys

import holoprof

with holoprof.trace(out=sys.argv[1]) as run_dir:
    with holoprof.phase("forward"):
        pass
    holoprof.step()
    with holoprof.phase("forward"):
        pass
    holoprof.step()
print(f"run_dir {run_dir}")
