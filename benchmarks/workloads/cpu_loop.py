"""A CPU training loop of about 5-10 ms per step with a DataLoader; times its own loop.

    python cpu_loop.py [STEPS] [WIDTH] [BATCH] [WARMUP]

WARMUP 0 times the loop from its first step (the steps a profiler samples first included).

Prints one JSON line: {"steps": N, "loop_s": seconds for the timed steps, "median_step_s": ...}.
Nothing here knows about holoprof.
"""

import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
width = int(sys.argv[2]) if len(sys.argv) > 2 else 1024  # 1024: about 6 ms a step on one core here
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 64
warmup = int(sys.argv[4]) if len(sys.argv) > 4 else 20
torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(batch * (steps + warmup), 256)
y = torch.randint(0, 10, (batch * (steps + warmup),))
loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True)
model = nn.Sequential(
    nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
times = []
t_start = time.perf_counter()
for i, (xb, yb) in enumerate(loader):
    if i == warmup and warmup:
        t_start = time.perf_counter()
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = loss_fn(model(xb), yb)
    loss.backward()
    opt.step()
    times.append(time.perf_counter() - t0)
loop_s = time.perf_counter() - t_start
times = sorted(times[warmup:])
print(json.dumps({"steps": len(times), "loop_s": loop_s, "median_step_s": times[len(times) // 2]}))
