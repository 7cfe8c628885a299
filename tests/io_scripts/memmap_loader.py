"""A nanoGPT-style loader: batches of random windows from a uint16 token file through np.memmap.

``memmap_loader.py DATA windows STEPS`` draws, at each step, a batch of token windows from a memmap
made anew (as nanoGPT does); ``... whole 1`` reads the whole file through one memmap. Prints a JSON
line with what the script itself read: the bytes of the windows, the bytes of the distinct pages they
lie on, the file's size, and the bytes of the distinct pages of the file that were present in the
process's page tables (``/proc/self/pagemap``) when each memmap went: what the mappings brought in.
"""

import json
import os
import sys

import numpy as np
import torch

path, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
block, batch = 64, 8
PAGE = os.sysconf("SC_PAGESIZE")


def present_pages(mm: np.memmap) -> list[int]:
    """Pages of the file (from offset 0) that this process has in its page tables."""
    first, n = mm.ctypes.data // PAGE, -(-mm.nbytes // PAGE)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read(n * 8), dtype=np.uint64)
    return np.nonzero(entries >> np.uint64(63))[0].tolist()


torch.manual_seed(0)
model = torch.nn.Embedding(65536, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
touched = 0
pages: set[int] = set()
present: set[int] = set()
for _ in range(steps):
    data = np.memmap(path, dtype=np.uint16, mode="r")
    if mode == "whole":
        x = torch.from_numpy(data.astype(np.int64))
        touched += data.nbytes
        pages.update(range(-(-data.nbytes // PAGE)))
    else:
        ix = torch.randint(len(data) - block, (batch,))
        x = torch.stack([torch.from_numpy(data[i : i + block].astype(np.int64)) for i in ix.tolist()])
        touched += batch * block * data.itemsize
        for i in ix.tolist():
            pages.update(range(i * data.itemsize // PAGE, ((i + block) * data.itemsize - 1) // PAGE + 1))
    present.update(present_pages(data))
    del data
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print(
    json.dumps(
        {
            "size": os.path.getsize(path),
            "bytes_touched": touched,
            "pages_touched_bytes": len(pages) * PAGE,
            "pages_present_bytes": len(present) * PAGE,
            "steps": steps,
        }
    )
)
