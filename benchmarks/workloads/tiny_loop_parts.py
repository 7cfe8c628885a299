"""A loop whose step is mostly holoprof's bookkeeping: a 2-layer MLP on 8 features, batch 32, Adam, a
DataLoader over a TensorDataset (one torch thread). Prints one JSON line: the median microseconds of
each part of the step (data, zero_grad, forward and loss, backward, optimizer step, whole step) and,
traced, of each of holoprof's optimizer step hooks, timed in place.

    python tiny_loop_parts.py STEPS            # untraced, or under holoprof run
    PATCHES_OFF=1 holoprof run -- python tiny_loop_parts.py STEPS   # traced, every patch and hook taken out
"""

import json
import os
import statistics
import sys
import time

import torch
import torch.optim.optimizer as om
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
warmup = 200
torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(32 * (steps + warmup), 8)
y = torch.randint(0, 2, (32 * (steps + warmup),))
loader = DataLoader(TensorDataset(x, y), batch_size=32)
model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()
pc = time.perf_counter_ns
traced = "holoprof.agent.core" in sys.modules
hook_ns: dict[str, list[int]] = {}
tables = (om._global_optimizer_pre_hooks, om._global_optimizer_post_hooks)
ours = [
    (t, k, fn)
    for t in tables
    for k, fn in list(t.items())
    if getattr(fn, "__module__", "").startswith("holoprof")
]

if traced and os.environ.get("PATCHES_OFF"):
    from holoprof.agent.core import get_agent

    done = set()
    for c in get_agent().collectors:
        for obj, attr, orig in c._patches:
            if (id(obj), attr) not in done:
                done.add((id(obj), attr))
                setattr(obj, attr, orig)
    for t, k, _ in ours:
        t.pop(k)
else:

    def timed(name, fn):
        def hook(*args, **kwargs):
            t0 = pc()
            try:
                return fn(*args, **kwargs)
            finally:
                hook_ns.setdefault(name, []).append(pc() - t0)

        return hook

    for t, k, fn in ours:
        t[k] = timed(getattr(fn, "__qualname__", repr(fn)), fn)

names = ("data", "zero_grad", "forward", "backward", "optimizer", "step")
parts: dict[str, list[int]] = {n: [] for n in names}
it = iter(loader)
for i in range(steps + warmup):
    t0 = pc()
    xb, yb = next(it)
    t1 = pc()
    opt.zero_grad()
    t2 = pc()
    loss = loss_fn(model(xb), yb)
    t3 = pc()
    loss.backward()
    t4 = pc()
    opt.step()
    t5 = pc()
    if i >= warmup:
        for n, d in zip(names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0), strict=True):
            parts[n].append(d)
print(
    json.dumps(
        {
            "parts_us": {n: statistics.median(v) / 1e3 for n, v in parts.items()},
            "hooks_us": {n: statistics.median(v[warmup:]) / 1e3 for n, v in hook_ns.items()},
        }
    )
)
