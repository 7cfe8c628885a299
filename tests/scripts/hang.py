"""A small 2-rank job on gloo for the hang watchdog (run under torchrun).

HANG_RANK sleeps HANG_SLEEP_S seconds before its all_reduce at step HANG_STEP (the others wait in it);
DEAD_RANK exits right after joining the process group (run it with TORCH_GLOO_LAZY_INIT=1: the others
then wait in their first collective for a peer that never comes).
"""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == int(os.environ.get("DEAD_RANK", "-1")):
    sys.exit(0)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 8), torch.randn(16, 1)
hang_rank = int(os.environ.get("HANG_RANK", "-1"))
hang_step = int(os.environ.get("HANG_STEP", "3"))
for step in range(int(os.environ.get("HANG_STEPS", "6"))):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None
        dist.all_reduce(p.grad)
    if rank == hang_rank and step == hang_step:
        time.sleep(float(os.environ.get("HANG_SLEEP_S", "20")))  # the hang
    total = loss.detach().clone()
    dist.all_reduce(total)
    opt.step()
print(f"rank {rank} done, loss {total.item() / dist.get_world_size():.6f}", flush=True)
dist.destroy_process_group()
