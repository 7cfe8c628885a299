"""A DistributedDataParallel job on gloo as torchrun starts it: a DistributedSampler over a
DataLoader, two epochs (set_epoch), and a synchronous all_reduce of the loss each step for logging.
Each rank writes its truth to $TRUTH_OUT.<rank>."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from truth import Truth


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    truth = Truth()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 32, generator=g), torch.randn(512, 4, generator=g))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            z0 = time.perf_counter()
            opt.zero_grad()
            truth.add("optimizer", time.perf_counter() - z0)
            f0 = time.perf_counter()
            out = model(x)
            truth.add("forward", time.perf_counter() - f0)
            loss = (out - y).pow(2).mean()
            b0 = time.perf_counter()
            loss.backward()  # DDP: includes the wait for the gradients' allreduce
            truth.add("backward", time.perf_counter() - b0)
            s0 = time.perf_counter()
            opt.step()
            truth.add("optimizer", time.perf_counter() - s0)
            logged = loss.detach().clone()
            a0 = time.perf_counter()
            dist.all_reduce(logged)
            truth.add("all_reduce", time.perf_counter() - a0)
            truth.steps += 1
            truth.losses.append(repr(float(logged)))
        truth.epochs += 1
    truth.write(f"{os.environ['TRUTH_OUT']}.{rank}", rank=rank)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
