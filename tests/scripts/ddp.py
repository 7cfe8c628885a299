"""A small DistributedDataParallel job on gloo (CPU), launched two ways.

``python ddp.py spawn PORT``: ``torch.multiprocessing.spawn`` starts two ranks.
``torchrun --nproc-per-node 2 ddp.py``: torchrun starts the ranks (RANK, WORLD_SIZE, MASTER_* set).
Each rank runs ``STEPS`` optimizer steps and prints its final loss.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = 6


def train(rank: int, world_size: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        loss = torch.zeros(())
        for _ in range(STEPS):
            x = torch.randn(4, 8, generator=g)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"rank {rank} final loss {loss.item():.6f}", flush=True)
        dist.barrier()  # leave together: gloo can abort a rank whose peer tears the group down first
    finally:
        dist.destroy_process_group()


def spawned(rank: int, world_size: int, port: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    train(rank, world_size)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "spawn":
        import torch.multiprocessing as mp

        mp.spawn(spawned, args=(2, sys.argv[2]), nprocs=2, join=True)
    else:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
