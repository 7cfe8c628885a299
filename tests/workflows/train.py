"""A small PyTorch training loop over the prepared shards; saves the weights at the end.

``python train.py DATA_DIR MODEL [--steps N] [--batch-size B] [--sleep-per-step S]``. The final save
is marked as a stage of its own with ``holoprof.stage`` (a no-op when the script is not traced).
"""

from __future__ import annotations

import argparse
import glob
import os
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import holoprof


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir")
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--sleep-per-step", type=float, default=0.0)
    args = ap.parse_args()
    torch.manual_seed(0)
    xs = [np.load(p) for p in sorted(glob.glob(os.path.join(args.data_dir, "x*.npy")))]
    ys = [np.load(p) for p in sorted(glob.glob(os.path.join(args.data_dir, "y*.npy")))]
    ds = TensorDataset(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)))
    loader = DataLoader(
        ds, batch_size=args.batch_size, shuffle=True, generator=torch.Generator().manual_seed(1)
    )
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    steps = 0
    loss = torch.zeros(())
    while steps < args.steps:
        for x, y in loader:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            if args.sleep_per_step:
                time.sleep(args.sleep_per_step)
            if steps >= args.steps:
                break
    with holoprof.stage("save"):
        torch.save(model.state_dict(), args.model)
    print(f"steps {steps} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
