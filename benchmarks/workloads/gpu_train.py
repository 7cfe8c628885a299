"""A GPU training loop (bf16 autocast) that measures itself; the workload of benchmarks/gpu_check.py.

    python gpu_train.py --model cnn|transformer [--steps 40] [--warmup 10] [--small] [--sync-debug]
        [--profile DIR]

``cnn`` is a ResNet-18-like network on 224x224 images (batch 192), ``transformer`` a 8-layer,
1024-wide decoder-only language model on 1024 tokens (batch 12): about 20-200 ms a step on an H100.
``--small`` shrinks both to seconds on a CPU (the plumbing check without a GPU). Data are made once on
the device (no DataLoader), so a step is forward, loss, backward and optimizer only.

What the script measures itself, without holoprof (nothing here knows about it):

* the loop time of the timed steps (``torch.cuda.synchronize`` before and after the loop only);
* per step, ``torch.cuda.Event`` timings of forward (the model's call), backward and optimizer, and
  of the whole step, resolved after the loop (no synchronization inside it);
* ``torch.cuda.memory_allocated`` deltas on the first step: weights (moving the model), activations
  (after the forward), gradients (after the backward, activations freed), optimizer state (after the
  first ``step``), and the peak;
* the FLOPs of one forward+backward with ``FlopCounterMode`` (on warm-up step 3, not on step 1
  which a profiler may count itself), and from them the MFU against the data-sheet dense bf16 peak;
* with ``--sync-debug``, ``torch.cuda.set_sync_debug_mode("warn")`` around the timed loop and the
  number of synchronization warnings raised in it;
* with ``--profile DIR``, ``torch.profiler`` (CPU and CUDA activities, wait=1, warmup=2,
  active=STEPS) writes a trace into DIR.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch
from torch import nn

#: dense bf16 tensor-core peak (no sparsity), FLOP/s, from NVIDIA's data sheets
PEAKS = [
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989.4e12),
    ("H200", 989.4e12),
    ("A100", 312e12),
]


def peak_for(name: str) -> tuple[float | None, str]:
    for key, peak in PEAKS:
        if key in name:
            return peak, f"{key} data sheet, dense bf16"
    return None, f"no data-sheet peak known for {name!r}"


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        return torch.relu(self.b2(self.c2(y)) + self.skip(x))


def resnet(width: int, classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 7, 2, 3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = width
    for i, mult in enumerate((1, 2, 4, 8)):
        cout = width * mult
        layers += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


class LM(nn.Module):
    def __init__(self, vocab: int, width: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) + self.pos
        return self.head(self.enc(h, mask=self.mask, is_causal=True))


def build(kind: str, small: bool, dev: torch.device) -> tuple[nn.Module, torch.Tensor, torch.Tensor, int]:
    g = torch.Generator(device="cpu").manual_seed(0)
    if kind == "cnn":
        batch, size, width = (4, 64, 16) if small else (192, 224, 64)
        model = resnet(width)
        x = torch.randn(batch, 3, size, size, generator=g)
        y = torch.randint(0, 1000, (batch,), generator=g)
        return model, x.to(dev), y.to(dev), batch
    batch, seq, width, layers, vocab = (2, 32, 64, 2, 1000) if small else (12, 1024, 1024, 8, 32000)
    model = LM(vocab, width, layers, max(1, width // 64), seq)
    x = torch.randint(0, vocab, (batch, seq), generator=g)
    y = torch.randint(0, vocab, (batch, seq), generator=g)
    return model, x.to(dev), y.to(dev), batch


def main() -> None:  # long: one straight-line training loop with its own measurements
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=("cnn", "transformer"), default="cnn")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--sync-debug", action="store_true")
    ap.add_argument("--profile", metavar="DIR")
    a = ap.parse_args()
    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    amp_dtype = torch.bfloat16
    alloc = torch.cuda.memory_allocated if cuda else (lambda: 0)
    before_model = alloc()
    model, x, y, batch = build(a.model, a.small, dev)
    base = alloc()
    model.to(dev)
    mem = {"weights": alloc() - base, "inputs": base - before_model}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    loss_fn = nn.CrossEntropyLoss()
    warm = max(a.warmup, 4)
    total = warm + a.steps
    ev = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else None
    marks: list[tuple] = []
    wall: list[float] = []  # without CUDA: host step times (the plumbing check on a CPU)
    flops = None
    sync_warnings = 0
    prof = None
    if a.profile:
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        prof = profile(
            activities=acts,
            schedule=schedule(wait=1, warmup=2, active=a.steps, repeat=1),
            on_trace_ready=tensorboard_trace_handler(a.profile, worker_name="gpu_train"),
        )
        prof.start()
        total = 3 + a.steps + 1
        warm = 0
    rec = warnings.catch_warnings(record=True)
    caught = None
    t_start = time.perf_counter()
    for i in range(total):
        if i == warm:
            if cuda:
                torch.cuda.synchronize()
                if a.sync_debug:
                    caught = rec.__enter__()
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
            t_start = time.perf_counter()
        timed = i >= warm and not a.profile
        counting = i == 3 and not a.profile
        e = [ev() for _ in range(5)] if (ev and timed) else None
        t_step = time.perf_counter()
        if counting:
            from torch.utils.flop_counter import FlopCounterMode

            fc = FlopCounterMode(display=False)
            fc.__enter__()
        if e:
            e[0].record()
        opt.zero_grad(set_to_none=True)
        a0 = alloc() if i == 0 else 0
        with torch.autocast(dev.type, dtype=amp_dtype):
            out = model(x)
            if e:
                e[1].record()
            if i == 0:
                mem["activations"] = alloc() - a0
            loss = loss_fn(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
        if e:
            e[2].record()
        loss.backward()
        if e:
            e[3].record()
        if counting:
            fc.__exit__(None, None, None)
            flops = fc.get_total_flops()
        if i == 0:
            mem["gradients"] = alloc() - a0
            a2 = alloc()
        opt.step()
        if e:
            e[4].record()
            marks.append(tuple(e))
        if i == 0:
            mem["optimizer_state"] = alloc() - a2
        if prof is not None:
            prof.step()
        if timed and not cuda:
            wall.append(time.perf_counter() - t_step)
        del out, loss
    if cuda and a.sync_debug and caught is not None:
        torch.cuda.set_sync_debug_mode("default")
        sync_warnings = sum("synchroniz" in str(w.message).lower() for w in caught)
        rec.__exit__(None, None, None)
    if cuda:
        torch.cuda.synchronize()
    loop_s = time.perf_counter() - t_start
    if prof is not None:
        prof.stop()
    res: dict = {
        "model": a.model,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
    }
    res.update(steps=a.steps, batch=batch, loop_s=loop_s, flops_per_step=flops, sync_warnings=sync_warnings)
    if marks:
        ph = {
            "forward": [m[0].elapsed_time(m[1]) for m in marks],
            "backward": [m[2].elapsed_time(m[3]) for m in marks],
            "optimizer": [m[3].elapsed_time(m[4]) for m in marks],
            "step": [m[0].elapsed_time(m[4]) for m in marks],
        }
        res["phases_ms_median"] = {k: statistics.median(v) for k, v in ph.items()}
        step_s = res["phases_ms_median"]["step"] / 1000
        res["median_step_s"] = step_s
        peak, src = peak_for(res["device"])
        res.update(peak_flops_per_s=peak, peak_source=src)
        if flops and peak:
            res["mfu"] = flops / step_s / peak
    if wall:
        res["median_step_s"] = statistics.median(wall)
    if cuda:
        mem["peak"] = torch.cuda.max_memory_allocated()
        res["memory_bytes"] = mem
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
