"""Real PyTorch profiler (Kineto) traces of a 2-rank DDP training job, one file per rank.

    python kineto_trace_job.py OUT_DIR [--steps N] [--ranks R] [--width W] [--gzip] [--gpu-shape]

A small transformer encoder trains with DistributedDataParallel over gloo on loopback (real
``torch.distributed``, ``torch.multiprocessing.spawn``), with a DataLoader, AdamW and
``torch.profiler`` under a schedule (wait=1, warmup=1, active=N) and ``tensorboard_trace_handler``:
each rank writes ``rank<R>.<...>.pt.trace.json[.gz]`` into OUT_DIR, with ``ProfilerStep#N`` steps and
``distributedInfo``. ``--steps`` sets the active steps (hence the size of the files).

``--gpu-shape`` then adds a device timeline to each file, because this machine has no GPU. THIS PART
IS SYNTHESIZED, not measured: every leaf CPU op (an ``aten::`` op with no child op) gets a
``cudaLaunchKernel`` runtime event inside it and a ``kernel`` on stream 7 of device 0, linked by a
``correlation`` id; the kernel runs for half the op's CPU time, as soon as the stream is free after its
launch (so the stream idles when the host is slow to launch); every ``c10d::allreduce_`` op launches an
``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` kernel on stream 20 that starts no earlier than gloo's
real ``gloo:all_reduce`` of that bucket and lasts as long; every DataLoader fetch gets a
``cudaMemcpyAsync`` and a 6 us ``Memcpy HtoD (Pageable -> Device)`` ``gpu_memcpy`` on stream 7. ``deviceProperties`` gets one device whose name
says it is synthesized. Everything else in the files (CPU ops, steps, timings) is the real trace.
Prints one JSON line: {"files": [...], "bytes": total, "seconds": wall time}.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

import torch


def _train(rank: int, world: int, out: str, steps: int, width: int, use_gzip: bool, port: int) -> None:
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    seq, vocab, batch = 32, 1000, 8
    n = batch * world * (steps + 4)
    data = TensorDataset(torch.randint(0, vocab, (n, seq)), torch.randint(0, vocab, (n, seq)))
    loader = DataLoader(data, batch_size=batch, sampler=DistributedSampler(data, world, rank))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, width)
            layer = nn.TransformerEncoderLayer(width, 4, 2 * width, batch_first=True, dropout=0.0)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(width, vocab)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.enc(self.emb(x)))

    model = DistributedDataParallel(Net())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
        on_trace_ready=tensorboard_trace_handler(out, worker_name=f"rank{rank}", use_gzip=use_gzip),
        record_shapes=True,
    ) as prof:
        for i, (x, y) in enumerate(loader):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
            loss.backward()
            opt.step()
            prof.step()
            if i >= steps + 2:
                break
    dist.barrier()
    dist.destroy_process_group()
    # gloo can abort a process at interpreter exit after its group is gone (a teardown race in torch):
    # the traces are written, so leave at once
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


DEVICE = {
    "id": 0,
    "name": "Synthesized device (no GPU here; kernels derived from CPU ops)",
    "totalGlobalMem": 85_000_000_000,
    "computeMajor": 9,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "regsPerMultiprocessor": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "sharedMemPerMultiprocessor": 233472,
    "numSms": 132,
    "sharedMemPerBlockOptin": 232448,
}


def _kernel_name(op: str) -> str:
    if op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
        return "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_kernel"
    if "softmax" in op:
        return "void (anonymous namespace)::softmax_warp_forward<float, float, float, 9, false, false>(float*, float const*, int, int, int, bool const*, int, bool)"
    if "layer_norm" in op:
        return "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float, float const*, float const*, float const*, float*, float*, float*)"
    if "embedding" in op or "index" in op:
        return "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo<float, unsigned int>, at::cuda::detail::TensorInfo<float const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)"
    if "foreach" in op or "_fused_adamw" in op:
        return "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, float*, float*>"
    if "sum" in op or "mean" in op or "nll" in op:
        return "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4>)"
    return f"void at::native::vectorized_elementwise_kernel<4, {op.replace('aten::', 'at::native::')}_functor<float>, at::detail::Array<char*, 2> >(int, {op.replace('aten::', 'at::native::')}_functor<float>, at::detail::Array<char*, 2>)"


def gpu_shape(path: str) -> None:
    """Add a synthesized device timeline to one real CPU trace (see the module docstring)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e]
    # leaf cpu ops per thread: no other cpu_op nested inside
    by_tid: dict[object, list[dict]] = {}
    for e in xs:
        if e.get("cat") == "cpu_op":
            by_tid.setdefault(e.get("tid"), []).append(e)
    leaves: list[dict] = []
    for ops in by_tid.values():
        ops.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        for i, e in enumerate(ops):
            end = float(e["ts"]) + float(e["dur"])
            nxt = ops[i + 1] if i + 1 < len(ops) else None
            if nxt is None or float(nxt["ts"]) >= end:
                leaves.append(e)
    # collectives: the c10d op launches, gloo's worker thread shows how long the transfer took
    launches = sorted(
        (e for e in xs if e.get("cat") == "cpu_op" and str(e["name"]).startswith("c10d::allreduce")),
        key=lambda e: float(e["ts"]),
    )
    transfers = sorted(
        (e for e in xs if str(e.get("name", "")).startswith("gloo:all_reduce")), key=lambda e: float(e["ts"])
    )
    loads = [e for e in xs if str(e.get("name", "")).startswith("enumerate(DataLoader)")]
    skip = {id(e) for e in launches}
    work: list[tuple[float, str, dict]] = [(float(e["ts"]), "kernel", e) for e in leaves if id(e) not in skip]
    work += [(float(e["ts"]), "nccl", dict(e, transfer=t)) for e, t in zip(launches, transfers, strict=False)]
    work += [(float(e["ts"]) + float(e["dur"]), "memcpy", e) for e in loads]
    work.sort(key=lambda w: w[0])
    pid0 = next((e.get("pid") for e in xs), 0)
    free = {7: 0.0, 20: 0.0}
    corr = 1_000_000
    added: list[dict] = []
    for ts, what, e in work:
        corr += 1
        tid = e.get("tid")
        dur = float(e["dur"])
        if what == "memcpy":
            launch_ts, launch_dur, stream, name, cat, kdur = (
                ts,
                3.0,
                7,
                "Memcpy HtoD (Pageable -> Device)",
                "gpu_memcpy",
                6.0,
            )
            api = "cudaMemcpyAsync"
        elif what == "nccl":
            t = e["transfer"]
            launch_ts, launch_dur, stream, cat = ts + 0.1 * dur, min(4.0, 0.1 * dur), 20, "kernel"
            kdur = float(t["dur"])
            free[20] = max(free[20], float(t["ts"]))
            name = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
            api = "cudaLaunchKernel"
        else:
            launch_ts, launch_dur, stream, cat, kdur = (
                ts + 0.3 * dur,
                min(4.0, 0.2 * dur),
                7,
                "kernel",
                0.5 * dur,
            )
            name = _kernel_name(str(e["name"]))
            api = "cudaLaunchKernel"
        launch_ts = round(launch_ts, 3)
        launch_dur = round(launch_dur, 3)
        start = round(max(launch_ts + launch_dur + 1.5, free[stream]), 3)
        kdur = round(max(kdur, 1.0), 3)
        free[stream] = start + kdur
        args_rt = {"cbid": 211 if api == "cudaLaunchKernel" else 41, "correlation": corr}
        added.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": api,
                "pid": pid0,
                "tid": tid,
                "ts": launch_ts,
                "dur": launch_dur,
                "args": args_rt,
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
                "dur": kdur,
                "args": {"device": 0, "stream": stream, "correlation": corr, "context": 1, "synthesized": 1},
            }
        )
    for s in (7, 20):
        added.append(
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": 0, "tid": s, "args": {"name": f"stream {s}"}}
        )
    doc["deviceProperties"] = [DEVICE]
    doc["traceEvents"] = events + added
    with opener(path + ".tmp", "wt") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--gzip", action="store_true")
    ap.add_argument("--gpu-shape", action="store_true")
    ap.add_argument("--port", type=int, default=29500 + os.getpid() % 1000)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.perf_counter()
    import torch.multiprocessing as mp

    mp.spawn(_train, args=(a.ranks, a.out, a.steps, a.width, a.gzip, a.port), nprocs=a.ranks)
    files = sorted(os.path.join(a.out, f) for f in os.listdir(a.out) if ".pt.trace.json" in f)
    if a.gpu_shape:
        for f in files:
            gpu_shape(f)
    print(
        json.dumps(
            {
                "files": files,
                "bytes": sum(os.path.getsize(f) for f in files),
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
