"""A training loop that checkpoints with a BurstBuffer every N steps and prints what save() reported.

python burst_loop.py FAST DURABLE STEPS EVERY
"""

import json
import sys

import torch

from holoprof.checkpoint import BurstBuffer

fast, durable, steps, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
results = []
with BurstBuffer(fast, durable, route="fast") as bb:
    for i in range(steps):
        opt.zero_grad()
        model(torch.randn(32, 256)).pow(2).mean().backward()
        opt.step()
        if (i + 1) % every == 0:
            r = bb.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": i}, f"step-{i:05d}")
            results.append({"name": r.name, "seq": r.seq, "blocking_s": r.blocking_s})
    bb.wait()
    sizes = {info.name: info.size_bytes for info in bb.list()}
for r in results:
    r["size_bytes"] = sizes[r["name"]]
print("RESULTS " + json.dumps(results))
