"""Tracing from inside a script with the Python API: ``python api_trace.py OUT [STEPS]``.

Traces a small torch loop inside ``holoprof.trace(out=OUT)``, marked with a stage, a standard phase
and a custom one; then uses the same markers again after tracing stopped (they must do nothing).
"""

import sys
import time

import holoprof

out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 5

with holoprof.trace(out=out, sample_interval_s=0.2) as run_dir:
    import torch  # imported while tracing: the torch collector installs itself on import
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with holoprof.stage("train"):
        for _ in range(n):
            opt.zero_grad()
            with holoprof.phase("forward"):
                loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            with holoprof.phase("custom"):
                time.sleep(0.002)

print(f"run_dir {run_dir}")
# after tracing: markers are no-ops
with holoprof.stage("after"), holoprof.phase("forward"), holoprof.phase("custom"):
    holoprof.step()
print(f"final loss {loss.item():.6f}")
