"""A DataLoader job reading many small files with 2 workers; times its own loop.

    python small_files_loader.py DATA_DIR   (DATA_DIR holds the files; made by the benchmark)
Prints one JSON line: {"files": N, "loop_s": ..., "cpu_s": ...} (cpu_s: CPU time of this process and
of its workers during the loop; the workers have exited and been waited for when the loop ends).
Nothing here knows about holoprof.
"""

import json
import os
import resource
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


def cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


loader = DataLoader(Files(sys.argv[1]), batch_size=64, num_workers=2)
c0 = cpu()
t0 = time.perf_counter()
total = 0.0
n = 0
for batch in loader:
    total += float(batch.sum())
    n += len(batch)
loop_s = time.perf_counter() - t0
print(json.dumps({"files": n, "loop_s": loop_s, "cpu_s": cpu() - c0}))
