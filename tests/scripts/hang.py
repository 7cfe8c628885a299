"""A small 2-rank job on gloo for the hang watchdog (run under torchrun).

HANG_RANK sleeps HANG_SLEEP_S seconds before its all_reduce at step HANG_STEP (the others wait in it),
or until the file HANG_WAKE_FILE exists;
DEAD_RANK exits there instead. On gloo the others would fail at once on the closed connection, so the
dying rank leaves a child holding its connections open (DEAD_LINGER_S seconds): the others wait for
a peer that is gone, as they do on NCCL.
"""

import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
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
        wake = os.environ.get("HANG_WAKE_FILE")  # the test ends the hang early once it has seen it
        until = time.monotonic() + float(os.environ.get("HANG_SLEEP_S", "20"))
        while time.monotonic() < until and not (wake and os.path.exists(wake)):
            time.sleep(0.1)  # the hang
    if rank == int(os.environ.get("DEAD_RANK", "-1")) and step == hang_step:
        linger = ["sleep", os.environ.get("DEAD_LINGER_S", "60")]
        out = subprocess.DEVNULL
        child = subprocess.Popen(linger, close_fds=False, env={}, stdout=out, stderr=out)
        if os.environ.get("DEAD_PID_FILE"):
            with open(os.environ["DEAD_PID_FILE"], "w") as f:
                f.write(str(child.pid))
        sys.exit(0)
    total = loss.detach().clone()
    dist.all_reduce(total)
    opt.step()
print(f"rank {rank} done, loss {total.item() / dist.get_world_size():.6f}", flush=True)
dist.destroy_process_group()
