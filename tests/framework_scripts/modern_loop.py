"""A plain PyTorch loop written the way training code is written today, one feature at a time, each
trained in turn in one process (the arguments; all of them by default): activation checkpointing
(``ckpt``: non-reentrant, ``ckpt-reentrant``), ``torch.compile`` (``compile``), mixed precision with
a gradient scaler (``amp``: bf16 autocast on the CPU and ``torch.amp.GradScaler``), and saved
activations offloaded with ``save_on_cpu`` (``offload``). Each trains 2 epochs of 12 steps.

Seeded: the losses are compared bit for bit with an untraced run. The script's own timers (around the
model call, loss.backward(), optimizer.step() and the next batch) and, under ``compile``, Dynamo's own
counts of graphs and graph breaks go to $TRUTH_OUT."""

from __future__ import annotations

import sys
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset
from truth import Truth

D, H, N, BATCH, EPOCHS = 32, 128, 384, 32, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(D, H)
        self.down = nn.Linear(H, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(D, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.mode == "ckpt":
                x = checkpoint(block, x, use_reentrant=False)
            elif self.mode == "ckpt-reentrant":
                x = checkpoint(block, x, use_reentrant=True)
            else:
                x = block(x)
        return self.head(x)


MODES = ("ckpt", "ckpt-reentrant", "compile", "amp", "offload")


def main(modes: list[str]) -> None:
    torch.set_num_threads(1)
    truth = Truth()
    for mode in modes:
        train(mode, truth)
    truth.timers["optimizer"] = truth.timers.pop("optimizer_step") + truth.timers.pop("zero_grad")
    extra = {}
    if "compile" in modes:
        from torch._dynamo.utils import counters

        extra = {
            "graphs": counters["stats"].get("unique_graphs", 0),
            "graph_breaks": sum(counters["graph_break"].values()),
        }
    truth.write(**extra)


def train(mode: str, truth: Truth) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(N, D, generator=g), torch.randn(N, 1, generator=g))
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, generator=g)
    net = Net(mode)
    model: nn.Module = torch.compile(net) if mode == "compile" else net
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu") if mode == "amp" else None
    loss_fn = nn.MSELoss()
    for _ in range(EPOCHS):
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                truth.add("data_wait", time.perf_counter() - t0)
                break
            truth.add("data_wait", time.perf_counter() - t0)
            if mode == "ckpt-reentrant":
                x.requires_grad_(True)  # reentrant checkpointing needs an input that requires grad
            t0 = time.perf_counter()
            opt.zero_grad()
            truth.add("zero_grad", time.perf_counter() - t0)
            t0 = time.perf_counter()
            if mode == "amp":
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = loss_fn(model(x).float(), y)
            elif mode == "offload":
                with torch.autograd.graph.save_on_cpu():
                    loss = loss_fn(model(x), y)
            else:
                loss = loss_fn(model(x), y)
            truth.add("forward", time.perf_counter() - t0)
            t0 = time.perf_counter()
            (scaler.scale(loss) if scaler is not None else loss).backward()
            truth.add("backward", time.perf_counter() - t0)
            t0 = time.perf_counter()
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            truth.add("optimizer_step", time.perf_counter() - t0)
            truth.steps += 1
            truth.losses.append(loss.item().hex())
        truth.epochs += 1


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODES))
