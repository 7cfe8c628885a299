"""A DataLoader job reading many small files with 2 workers; times its own loop.

    python small_files_loader.py DATA_DIR   (DATA_DIR holds the files; made by the benchmark)
Prints one JSON line: {"files": N, "loop_s": ...}. Nothing here knows about holoprof.
"""

import json
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Files(Dataset):
    def __init__(self, root: str) -> None:
        self.paths = sorted(os.path.join(root, f) for f in os.listdir(root))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> torch.Tensor:
        with open(self.paths[i], "rb") as f:
            data = f.read()
        # decode and augment as an image dataset does (a 64x64 grey image per 4 KiB file)
        img = torch.frombuffer(bytearray(data), dtype=torch.uint8).reshape(64, 64).float() / 255.0
        img = torch.nn.functional.avg_pool2d(img[None, None], 3, stride=1, padding=1)[0, 0]
        img = (img - img.mean()) / (img.std() + 1e-6)
        return img.flip(1).mean()


loader = DataLoader(Files(sys.argv[1]), batch_size=64, num_workers=2)
t0 = time.perf_counter()
total = 0.0
n = 0
for batch in loader:
    total += float(batch.sum())
    n += len(batch)
print(json.dumps({"files": n, "loop_s": time.perf_counter() - t0}))
