"""Write a real PyTorch profiler trace of a small training loop: python profile_loop.py OUT.json [gz]."""

import gzip
import shutil
import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, TensorDataset

out = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loader = DataLoader(TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,))), batch_size=16)
with profile(
    activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=5), record_shapes=True
) as prof:
    for i, (x, y) in enumerate(loader):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        prof.step()
        if i >= 6:
            break
prof.export_chrome_trace(out)
if len(sys.argv) > 2:
    with open(out, "rb") as src, gzip.open(out + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
