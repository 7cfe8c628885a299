"""A training loop that checkpoints a large state every N steps with torch.save (+ fsync).

python ckpt_loop.py DIR STEPS EVERY
"""

import os
import sys

import torch

out, steps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
ballast = torch.zeros(8 * 1024 * 1024)  # 32 MiB of state saved with the model
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(steps):
    opt.zero_grad()
    model(torch.randn(32, 64)).pow(2).mean().backward()
    opt.step()
    if (i + 1) % every == 0:
        path = os.path.join(out, f"ckpt-{i}.pt")
        torch.save({"model": model.state_dict(), "ballast": ballast}, path)
        with open(path, "rb") as f:
            os.fsync(f.fileno())
print("done", steps)
