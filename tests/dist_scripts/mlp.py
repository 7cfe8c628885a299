"""An MLP trained on random data: one process, or DDP on gloo when RANK/WORLD_SIZE are set.

``python mlp.py [--steps N] [--width W] [--depth D] [--batch B]`` prints one line
``median_step_s <seconds> steps <N>`` (the median of the steps after the first two).
"""

import argparse
import os
import statistics
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.depth):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    model: nn.Module = nn.Sequential(*layers, nn.Linear(args.width, 10))
    distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model)
    data = TensorDataset(
        torch.randn(args.steps * args.batch, args.width), torch.randint(0, 10, (args.steps * args.batch,))
    )
    loader = DataLoader(data, batch_size=args.batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    times = []
    t0 = time.perf_counter()
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    print(f"median_step_s {statistics.median(times[2:] or times):.6f} steps {len(times)}", flush=True)
    if distributed:
        torch.distributed.barrier()  # leave together: gloo can abort a rank whose peer tears down first
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
