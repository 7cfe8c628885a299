"""The CPU loop of ``cpu_loop.py`` (one torch thread, a DataLoader over a TensorDataset), run under
``holoprof run``, timing blocks of steps with holoprof's patches in place and blocks with the
originals put back, alternately in one process (the same memory layout, the same moment of the
machine), and the CPU time of the agent's own threads.

    holoprof run -- python cpu_loop_toggled.py [BLOCKS] [BLOCK_STEPS] [WIDTH] [BATCH] [WARMUP]

With BLOCK_STEPS 1 the mode changes every step (on, off, off, on, ...): a drift of the machine
cancels. holoprof's global optimizer step hooks (the torch collector's two, which call the memory
and FLOP collectors and the layer sampler on the steps they measure) are taken out of torch's hook
tables in "off" and put back in "on", like the patches. ``TOGGLE_ONLY=NAME`` switches one
collector's patches only (and no hook).

Prints one JSON line: for each step with holoprof's patches ("on") and without ("off"), its seconds
and those of its parts (data, zero_grad, forward and loss, backward, optimizer step), the loop's wall
seconds, and the CPU seconds of the process's other threads (the agent's writer and
sampler) over the loop.
"""

import json
import os
import sys
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from holoprof.agent.core import get_agent

blocks = int(sys.argv[1]) if len(sys.argv) > 1 else 800
block_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 1
width = int(sys.argv[3]) if len(sys.argv) > 3 else 640
batch = int(sys.argv[4]) if len(sys.argv) > 4 else 32
warmup = int(sys.argv[5]) if len(sys.argv) > 5 else 30
steps = warmup + blocks * block_steps
torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(batch * steps, 256)
y = torch.randint(0, 10, (batch * steps,))
loader = DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True)
model = nn.Sequential(
    nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()


def switches():
    """{(object, attribute): (holoprof's value, the original)} over every collector's patches."""
    agent = get_agent()
    if agent is None:
        raise SystemExit("run this under holoprof run")
    out = {}
    only = os.environ.get("TOGGLE_ONLY")
    for c in agent.collectors:
        if only and c.name != only:
            continue
        for obj, attr, orig in c._patches:
            key = (id(obj), attr)
            if key not in out:  # the first patch of an attribute holds the true original
                out[key] = (obj, attr, getattr(obj, attr), orig)
    return list(out.values())


def hooks():
    """holoprof's entries in torch's global optimizer step hook tables: [(table, key, hook)]."""
    if os.environ.get("TOGGLE_ONLY"):
        return []
    import torch.optim.optimizer as om

    tables = (om._global_optimizer_pre_hooks, om._global_optimizer_post_hooks)
    return [
        (t, k, fn)
        for t in tables
        for k, fn in list(t.items())
        if getattr(fn, "__module__", "").startswith("holoprof")
    ]


def set_mode(sw, on):
    patches, hooked = sw
    for obj, attr, patched, orig in patches:
        setattr(obj, attr, patched if on else orig)
    for table, key, fn in hooked:
        if on:
            table[key] = fn
        else:
            table.pop(key, None)


def other_threads_cpu_s():
    main = threading.get_native_id()
    total = 0
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == main:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


times = {"on": [], "off": []}
sw = None
it = iter(loader)
for i in range(steps):
    if i == warmup:
        sw = (switches(), hooks())
        cpu0, t_loop = other_threads_cpu_s(), time.perf_counter()
    mode = "on"
    if i >= warmup:
        b = (i - warmup) // block_steps
        mode = "on" if b % 4 in (0, 3) else "off"  # on off off on: a drift cancels
        if (i - warmup) % block_steps == 0:
            set_mode(sw, mode == "on")
    t0 = time.perf_counter()
    xb, yb = next(it)
    t1 = time.perf_counter()
    opt.zero_grad()
    t2 = time.perf_counter()
    loss = loss_fn(model(xb), yb)
    t3 = time.perf_counter()
    loss.backward()
    t4 = time.perf_counter()
    opt.step()
    t5 = time.perf_counter()
    if i >= warmup:
        times[mode].append((t5 - t0, t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4))
set_mode(sw, True)
loop_s = time.perf_counter() - t_loop
print(
    json.dumps(
        {
            "on": times["on"],
            "off": times["off"],
            "loop_s": loop_s,
            "agent_threads_cpu_s": other_threads_cpu_s() - cpu0,
            "patches": len(sw[0]),
            "hooks": len(sw[1]),
        }
    )
)
