"""Real PyTorch profiler traces of a 2-rank DDP (gloo) loop: python profile_ddp.py OUT_DIR [--device].

Each rank writes ``rank<R>.*.pt.trace.json`` through ``tensorboard_trace_handler`` (wait=1, warmup=1,
active=4). ``--device`` then adds a device timeline to each file, as a GPU would have written it (this
machine has none; that part is made up): for every leaf ``aten::`` op, a ``cudaLaunchKernel`` inside
it and a kernel linked by ``correlation`` (matrix products on stream 7, the rest on stream 8, so that
they overlap), an NCCL kernel on stream 20 for each ``c10d::allreduce_`` and a ``Memcpy HtoD`` after
each batch fetch.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader, TensorDataset


def train(rank: int, out: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(256, 32), torch.randint(0, 4, (256,))), batch_size=16)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=4, repeat=1),
        on_trace_ready=tensorboard_trace_handler(out, worker_name=f"rank{rank}"),
    ) as prof:
        for i, (x, y) in enumerate(loader):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            prof.step()
            if i >= 6:
                break
    dist.barrier()
    dist.destroy_process_group()
    # gloo can abort a process at interpreter exit after its group is gone (a teardown race in torch):
    # the traces are written, so leave at once
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def add_device(path: str) -> None:
    with open(path) as f:
        doc = json.load(f)
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    ops = sorted((e for e in xs if e.get("cat") == "cpu_op"), key=lambda e: (e["tid"], e["ts"], -e["dur"]))
    corr = 5000
    added = []

    def launch(host: dict, name: str, cat: str, stream: int, start: float, dur: float) -> None:
        nonlocal corr
        corr += 1
        added.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": host["pid"],
                "tid": host["tid"],
                "ts": host["ts"],
                "dur": 1.0,
                "args": {"correlation": corr},
            }
        )
        added.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": start,
                "dur": dur,
                "args": {"device": 0, "stream": stream, "correlation": corr},
            }
        )

    for i, e in enumerate(ops):
        end = e["ts"] + e["dur"]
        leaf = i + 1 == len(ops) or ops[i + 1]["tid"] != e["tid"] or ops[i + 1]["ts"] >= end
        if e["name"].startswith("c10d::allreduce"):
            launch(
                e,
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                "kernel",
                20,
                e["ts"] + 2.0,
                40.0,
            )
        elif leaf and e["name"].startswith("aten::"):
            mm = e["name"] in ("aten::mm", "aten::addmm")
            launch(
                e,
                "sm90_gemm_kernel" if mm else f"elementwise_kernel<{e['name']}>",
                "kernel",
                7 if mm else 8,
                e["ts"] + 3.0,
                max(e["dur"], 1.5),
            )
    for e in xs:
        if e["name"].startswith("enumerate(DataLoader)"):
            host = dict(e, ts=e["ts"] + e["dur"])
            launch(host, "Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 7, host["ts"] + 2.0, 5.0)
    doc["traceEvents"] += added
    with open(path, "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    out = sys.argv[1]
    mp.spawn(train, args=(out, 20000 + os.getpid() % 20000), nprocs=2)
    if "--device" in sys.argv:
        for name in os.listdir(out):
            add_device(os.path.join(out, name))
