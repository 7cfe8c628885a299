"""Models whose FLOPs, compile time and wall time the compute report is checked against, each
measuring its own truth.

    python flops_models.py MODEL [--compile]    train MODEL (mlp, cnn, gpt) for STEPS steps, then
                                                 evaluate it and save a checkpoint
    python flops_models.py --count              count one training step of every model with
                                                 torch.utils.flop_counter.FlopCounterMode (untraced)

Training writes to $TRUTH_OUT: the losses (bit for bit), each step's own time (time.perf_counter
around the whole iteration), the process's creation time and the time the script ended (its wall
time), when the first step started, the model's size (parameters, the GPT's layers, width, sequence
and tokens per step) and the line of the GPT's data-dependent branch (a graph break under
torch.compile). ``--count`` writes {model: FLOPs of one step}, with PyTorch's formulas plus the CPU
flash-attention kernels (``custom_mapping``), which PyTorch's table lacks.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

STEPS = 8
BATCH = 16
VOCAB, D, HEADS, LAYERS, SEQ = 96, 64, 4, 2, 32


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Cnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.up, self.down = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (z.view(b, t, HEADS, D // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, D))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Gpt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(SEQ, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        if logits.abs().max() > 1e4:  # BRANCH: data-dependent, a graph break under torch.compile
            logits = logits.clamp(-1e4, 1e4)
        return logits


def batch(name: str, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    if name == "mlp":
        return torch.randn(BATCH, 128, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    if name == "cnn":
        return torch.randn(BATCH, 3, 16, 16, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    idx = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return idx[:, :-1], idx[:, 1:]


def build(name: str) -> nn.Module:
    return {"mlp": Mlp, "cnn": Cnn, "gpt": Gpt}[name]()


def loss_of(name: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def created_s() -> float:
    """This process's creation time (seconds since the epoch): its start in clock ticks since boot,
    from /proc, against the time since boot now."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def branch_line() -> int:
    src, first = inspect.getsourcelines(Gpt.forward)
    return first + next(i for i, line in enumerate(src) if "# BRANCH" in line)


def train(name: str, compiled: bool) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    net = build(name)
    model = torch.compile(net, backend=os.environ.get("COMPILE_BACKEND", "inductor")) if compiled else net
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    data = [batch(name, g) for _ in range(STEPS)]
    losses, step_s = [], []
    first_step = time.time()
    for x, y in data:
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_of(name, model, x, y)
        loss.backward()
        opt.step()
        step_s.append(time.perf_counter() - t0)
        losses.append(loss.item().hex())
    t0 = time.perf_counter()
    with torch.no_grad():
        for x, y in data[:2]:
            loss_of(name, model, x, y)
    eval_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.save(net.state_dict(), os.path.join(os.path.dirname(os.environ["TRUTH_OUT"]), "ckpt.pt"))
    checkpoint_s = time.perf_counter() - t0
    params = sum(p.numel() for p in net.parameters())
    doc = {
        "losses": losses,
        "step_s": step_s,
        "eval_s": eval_s,
        "checkpoint_s": checkpoint_s,
        "created_s": created_s(),
        "first_step_s": first_step,
        "params": params,
        "tokens": BATCH * SEQ,
        "layers": LAYERS,
        "d_model": D,
        "seq": SEQ,
        "position_params": SEQ * D,
        "branch_line": branch_line(),
        "ended_s": time.time(),
    }
    with open(os.environ["TRUTH_OUT"], "w") as f:
        json.dump(doc, f)


def raw(formula: Any) -> Any:
    """A formula of PyTorch's table (already taking tensors), marked so that FlopCounterMode uses it
    as it is."""

    def f(*args: Any, **kwargs: Any) -> Any:
        return formula(*args, **kwargs)

    f._get_raw = True  # type: ignore[attr-defined]
    return f


def count() -> None:
    """FLOPs of one training step of each model, counted by PyTorch's FlopCounterMode."""
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    mapping = {
        aten._scaled_dot_product_flash_attention_for_cpu: raw(
            fc.flop_registry[aten._scaled_dot_product_flash_attention]
        ),
        aten._scaled_dot_product_flash_attention_for_cpu_backward: raw(
            fc.flop_registry[aten._scaled_dot_product_flash_attention_backward]
        ),
    }
    torch.set_num_threads(1)
    out = {}
    for name in ("mlp", "cnn", "gpt"):
        torch.manual_seed(0)
        net = copy.deepcopy(build(name))
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
        x, y = batch(name, torch.Generator().manual_seed(0))
        with fc.FlopCounterMode(display=False, custom_mapping=mapping) as counter:
            opt.zero_grad()
            loss_of(name, net, x, y).backward()
            opt.step()
        out[name] = counter.get_total_flops()
    with open(os.environ["TRUTH_OUT"], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    if sys.argv[1] == "--count":
        count()
    else:
        train(sys.argv[1], "--compile" in sys.argv[2:])
