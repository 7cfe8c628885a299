"""A training job whose input pipeline is of one kind; nothing in it knows about holoprof.

    python input_pipeline.py KIND [--steps N] [--batch-size B] [--data DIR] [--workers W] [--epochs E]

KIND: ``sleep`` (each sample waits 1 ms: a remote store), ``cpu`` (each sample decompresses and
normalises a 16 KiB blob: decode), ``files`` (each sample opens and reads a small file from DIR and
decodes it), ``mixed`` (half the wait and half the decode). The model is a small MLP (about a
millisecond per step on 2 cores). ``--epochs E`` splits the N steps into E epochs (a new iterator, so
new workers, for each unless the loader's workers persist). Prints ``num_workers=N`` (the loader's own
value) and, at the end, one JSON line with the loop's wall time and steps, timed by the job itself.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import zlib

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

BLOB = zlib.compress(bytes(range(256)) * 64, 9)  # 16 KiB once decompressed


class Samples(Dataset):
    def __init__(self, kind: str, n: int, data: str | None) -> None:
        self.kind, self.n = kind, n
        self.paths = sorted(os.path.join(data, f) for f in os.listdir(data)) if data else []

    def __len__(self) -> int:
        return self.n

    def _decode(self, raw: bytes, rounds: int) -> torch.Tensor:
        x = torch.zeros(256)
        for _ in range(rounds):
            buf = zlib.decompress(raw)
            t = torch.frombuffer(bytearray(buf[:1024]), dtype=torch.uint8).float()
            x += (t - t.mean()).abs()[:256]
        return x / 255.0

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self.kind == "sleep":
            time.sleep(0.001)
            x = torch.full((256,), float(i % 7))
        elif self.kind == "cpu":
            x = self._decode(BLOB, 24)
        elif self.kind == "files":
            with open(self.paths[i % len(self.paths)], "rb") as f:
                raw = f.read()
            x = self._decode(raw, 2)
        else:  # mixed
            time.sleep(0.0005)
            x = self._decode(BLOB, 12)
        return x, i % 10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=("sleep", "cpu", "files", "mixed"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--data")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(0)
    ds = Samples(args.kind, args.steps * args.batch_size // args.epochs, args.data)
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    print(f"num_workers={loader.num_workers}", flush=True)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t0 = time.perf_counter()
    steps = 0
    for _ in range(args.epochs):
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
    print(json.dumps({"steps": steps, "loop_s": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
