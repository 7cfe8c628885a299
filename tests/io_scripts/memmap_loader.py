"""A nanoGPT-style loader: batches of random windows from a uint16 token file through np.memmap.

``memmap_loader.py DATA windows STEPS`` draws, at each step, a batch of token windows from a memmap
made anew (as nanoGPT does); ``... whole 1`` reads the whole file through one memmap. Prints a JSON
line with what the script itself read: the bytes of the windows and the file's size.
"""

import json
import os
import sys

import numpy as np
import torch

path, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
block, batch = 64, 8
torch.manual_seed(0)
model = torch.nn.Embedding(65536, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
touched = 0
for _ in range(steps):
    data = np.memmap(path, dtype=np.uint16, mode="r")
    if mode == "whole":
        x = torch.from_numpy(data.astype(np.int64))
        touched += data.nbytes
    else:
        ix = torch.randint(len(data) - block, (batch,))
        x = torch.stack([torch.from_numpy(data[i : i + block].astype(np.int64)) for i in ix.tolist()])
        touched += batch * block * data.itemsize
    del data
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print(json.dumps({"size": os.path.getsize(path), "bytes_touched": touched, "steps": steps}))
