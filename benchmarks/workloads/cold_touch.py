"""What a piece of Python code costs once a step inside a training step whose own work evicts the
caches (the ~6 ms step of ``bench_overhead.py --short``: width 640, batch 32, Adam, one torch thread),
without holoprof: the code runs before ``zero_grad`` on alternate steps (on, off, off, on, ...) and the
median time of the "on" runs less that of the "off" ones is printed.

    taskset -c 1 python cold_touch.py MODE K

MODE, each done K times:
  calls     calls of one trivial function
  objects   reads of an attribute, each of a different object
  records   records like a span (a 9-tuple appended to a list, a count in a dict), each into a
            different object
  functions K functions each reading 4 attributes of its own object
  inline    the same reads as ``functions``, in one function
  local     5 attribute reads of a ``threading.local``
  slots     5 attribute reads of a ``__slots__`` object reached through one ``threading.local`` read
"""

import statistics
import sys
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MODE, K = sys.argv[1], int(sys.argv[2])
STEPS = 1600
torch.manual_seed(0)
torch.set_num_threads(1)
x = torch.randn(32 * STEPS, 256)
y = torch.randint(0, 10, (32 * STEPS,))
loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(256, 640), nn.ReLU(), nn.Linear(640, 640), nn.ReLU(), nn.Linear(640, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
loss_fn = nn.CrossEntropyLoss()


class Obj:
    def __init__(self) -> None:
        self.a, self.b, self.c, self.d = 1, 2, 3, 4
        self.counts: dict = {}
        self.spans: list = []


class Local(threading.local):
    active = None
    loop = None
    fetch = None
    opt = None

    def __init__(self) -> None:
        self.tid = 5


class Slots:
    __slots__ = ("active", "fetch", "loop", "opt", "tid")

    def __init__(self) -> None:
        self.active = self.loop = self.fetch = self.opt = None
        self.tid = 5


class Holder(threading.local):
    def __init__(self) -> None:
        self.s = Slots()


objs = [Obj() for _ in range(K)]
local, holder = Local(), Holder()
ns: dict = {}
for i in range(K):
    exec(f"def f{i}(o):\n    return o.a + o.b + o.c + o.d\n", ns)
fns = [ns[f"f{i}"] for i in range(K)]
body = "".join(f"    o = objs[{i}]\n    s += o.a + o.b + o.c + o.d\n" for i in range(K))
exec(f"def inline(objs):\n    s = 0\n{body}    return s\n", ns)
inline = ns["inline"]


def trivial(o):
    return o.a


def record(o, t0, t1):
    v = o.counts.get("x")
    if v is None:
        o.counts["x"] = [1, t1 - t0]
    else:
        v[0] += 1
        v[1] += t1 - t0
    o.spans.append((1, 2, 3, "phase", "x", t0, t1, 5, None))
    if len(o.spans) > 1000:
        o.spans.clear()


def read_local():
    t = local
    return (t.active, t.loop, t.tid, t.fetch, t.opt)


def read_slots():
    t = holder.s
    return (t.active, t.loop, t.tid, t.fetch, t.opt)


def run_once(t0: int) -> None:
    if MODE == "calls":
        for _ in range(K):
            trivial(objs[0])
    elif MODE == "objects":
        for o in objs:
            trivial(o)
    elif MODE == "records":
        for o in objs:
            record(o, t0, t0 + 5)
    elif MODE == "functions":
        for f, o in zip(fns, objs, strict=True):
            f(o)
    elif MODE == "inline":
        inline(objs)
    elif MODE == "local":
        for _ in range(K):
            read_local()
    elif MODE == "slots":
        for _ in range(K):
            read_slots()
    else:
        raise SystemExit(f"unknown mode {MODE!r}: see the docstring")


times: dict[bool, list[int]] = {True: [], False: []}
for i, (xb, yb) in enumerate(loader):
    on = i % 4 in (0, 3)
    t0 = time.perf_counter_ns()
    if on:
        run_once(t0)
    t1 = time.perf_counter_ns()
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
    if i > 100:
        times[on].append(t1 - t0)
added = (statistics.median(times[True]) - statistics.median(times[False])) / 1000
print(f"{MODE} x{K}: +{added:.1f} µs per step")
