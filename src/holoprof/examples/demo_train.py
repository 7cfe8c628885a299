"""A small image classifier trained on a folder of many small image files (the holoprof demo).

Ordinary PyTorch: nothing in it knows about holoprof. Each sample is one PPM image file that the
Dataset opens, decodes and augments in Python, one file per sample, with the DataLoader's default
of no worker processes: the classic input-bound job. Try ``--workers 2`` and compare the reports.

    python demo_train.py --data DIR [--make-data] [--epochs 2] [--workers 0] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

CLASSES = 4
SIZE = 48  # stored resolution; the model sees 32x32 crops


def make_dataset(root: str, n_train: int, n_val: int, seed: int = 0) -> None:
    """Write PPM images whose class is the quadrant holding a bright blob."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("val", n_val)):
        d = os.path.join(root, split)
        os.makedirs(d, exist_ok=True)
        for i in range(n):
            label = i % CLASSES
            img = rng.integers(0, 90, size=(SIZE, SIZE, 3), dtype=np.uint8)
            cy, cx = (label // 2) * (SIZE // 2) + SIZE // 4, (label % 2) * (SIZE // 2) + SIZE // 4
            img[cy - 6 : cy + 6, cx - 6 : cx + 6] = rng.integers(180, 255, size=3, dtype=np.uint8)
            with open(os.path.join(d, f"{i:06d}_{label}.ppm"), "wb") as f:
                f.write(f"P6\n{SIZE} {SIZE}\n255\n".encode())
                f.write(img.tobytes())


def decode_ppm(data: bytes) -> np.ndarray:
    parts = data.split(b"\n", 3)
    w, h = (int(x) for x in parts[1].split())
    return np.frombuffer(parts[3], dtype=np.uint8).reshape(h, w, 3)


class ImageFolder(Dataset):
    def __init__(self, root: str, train: bool) -> None:
        self.files = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".ppm"))
        self.train = train

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path = self.files[i]
        with open(path, "rb") as f:
            img = decode_ppm(f.read()).astype(np.float32) / 255.0
        rng = np.random.default_rng(i)
        # augmentation, as a real pipeline does it: random crop, flip, colour jitter, normalise
        y0, x0 = rng.integers(0, SIZE - 32, size=2) if self.train else ((SIZE - 32) // 2,) * 2
        img = img[y0 : y0 + 32, x0 : x0 + 32]
        if self.train:
            img = img * rng.uniform(0.8, 1.2, size=3).astype(np.float32)
            for _ in range(3):  # a little blur: stands in for the decode/resize work of JPEG datasets
                img = (img + np.roll(img, 1, 0) + np.roll(img, 1, 1)) / 3.0
        img = (img - img.mean()) / (img.std() + 1e-6)
        label = int(os.path.basename(path).split("_")[1].split(".")[0])
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))), label


def model_fn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, CLASSES),
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True)
    ap.add_argument("--make-data", action="store_true")
    ap.add_argument("--train-files", type=int, default=3000)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--checkpoint", default=None)
    args = ap.parse_args()
    if args.make_data or not os.path.isdir(os.path.join(args.data, "train")):
        make_dataset(args.data, args.train_files, max(64, args.train_files // 8))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train = DataLoader(ImageFolder(os.path.join(args.data, "train"), True), batch_size=args.batch_size,
                       shuffle=True, num_workers=args.workers)  # fmt: skip
    val = DataLoader(ImageFolder(os.path.join(args.data, "val"), False), batch_size=128)
    model = model_fn()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    loss_fn = nn.CrossEntropyLoss()
    ckpt = args.checkpoint or os.path.join(args.data, "model.pt")
    for epoch in range(args.epochs):
        model.train()
        for x, y in train:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in val:
                correct += int((model(x).argmax(1) == y).sum())
                total += len(y)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, ckpt)
        print(f"epoch {epoch}: loss {loss.item():.3f}, val accuracy {correct / total:.1%}", flush=True)


if __name__ == "__main__":
    main()
