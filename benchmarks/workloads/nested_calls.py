"""What holoprof's ``Module.__call__`` wrapper adds to each nested module call: a ``Sequential`` of 200
``Identity`` modules called under ``no_grad``, its calls alternately with the wrapper in place and with
torch's own ``__call__`` put back, in one traced process. Prints one line.

    holoprof run --no-report -- python nested_calls.py
"""

import statistics
import time

import torch
from torch import nn

from holoprof.agent.core import get_agent

MODULES = 200
torch.set_num_threads(1)
model = nn.Sequential(*[nn.Identity() for _ in range(MODULES)])
x = torch.randn(2, 2)
agent = get_agent()
if agent is None:
    raise SystemExit("run this under holoprof run")
patches = {}
for c in agent.collectors:
    for obj, attr, orig in c._patches:
        patches.setdefault((obj, attr), (getattr(obj, attr), orig))
on, off = patches[(nn.Module, "__call__")]
pc = time.perf_counter_ns
took: dict[str, list[int]] = {"on": [], "off": []}
with torch.no_grad():
    for i in range(3000):
        mode = "on" if i % 2 else "off"
        nn.Module.__call__ = on if mode == "on" else off
        t0 = pc()
        model(x)
        t1 = pc()
        if i > 200:
            took[mode].append(t1 - t0)
nn.Module.__call__ = on
a, b = statistics.median(took["on"]), statistics.median(took["off"])
print(
    f"per nested module call: +{(a - b) / MODULES:.0f} ns "
    f"(on {a / 1000:.0f} us, off {b / 1000:.0f} us for {MODULES + 1} calls)"
)
