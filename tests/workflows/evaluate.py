"""Evaluation: load the saved weights and measure accuracy on the prepared shards, no training."""

from __future__ import annotations

import argparse
import glob
import os

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir")
    ap.add_argument("model")
    args = ap.parse_args()
    xs = [np.load(p) for p in sorted(glob.glob(os.path.join(args.data_dir, "x*.npy")))]
    ys = [np.load(p) for p in sorted(glob.glob(os.path.join(args.data_dir, "y*.npy")))]
    ds = TensorDataset(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
    model.load_state_dict(torch.load(args.model))
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in DataLoader(ds, batch_size=256):
            correct += int((model(x).argmax(1) == y).sum())
    print(f"accuracy {correct / len(ds):.4f}")


if __name__ == "__main__":
    main()
