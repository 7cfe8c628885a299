"""Rows of a np.memmap made in the parent, read by 2 forked DataLoader workers (as the Arrow table of a
Hugging Face ``datasets.load_from_disk`` is): the workers make no mapping of their own, they read
through the one they inherited.

``memmap_workers.py DATA`` reads every third row of 4,608 bytes (rows straddle pages), the workers
taking turns; at the end of its share each worker reports the pages of the file present in its own
page tables (``/proc/self/pagemap``), what it brought in. Prints a JSON line: the file's size, the
bytes of the rows the workers read, the bytes of the distinct pages those rows lie on, and the bytes
of the union of the pages the workers brought in.
"""

import json
import os
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

ROW = 4608
PAGE = os.sysconf("SC_PAGESIZE")


def present_pages(mm: np.memmap) -> list[int]:
    """Pages of the file (from offset 0) that this process has in its page tables."""
    first, n = mm.ctypes.data // PAGE, -(-mm.nbytes // PAGE)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read(n * 8), dtype=np.uint64)
    return np.nonzero(entries >> np.uint64(63))[0].tolist()


class Rows(IterableDataset):
    def __init__(self, mm: np.memmap) -> None:
        self.mm = mm
        self.rows = mm.reshape(-1, ROW)

    def __iter__(self):
        info = get_worker_info()
        mine = range(3 * info.id, len(self.rows), 3 * info.num_workers)
        for k in range(0, len(mine), 16):
            yield torch.tensor([int(self.rows[i].sum()) for i in mine[k : k + 16]], dtype=torch.int64)
        yield {"rows": len(mine), "pages": present_pages(self.mm)}


data = np.memmap(sys.argv[1], dtype=np.uint8, mode="r")
loader = DataLoader(Rows(data), batch_size=None, num_workers=2, multiprocessing_context="fork")
rows, total, brought = 0, 0, set()
for item in loader:
    if isinstance(item, dict):
        rows += item["rows"]
        brought.update(item["pages"])
    else:
        total += int(item.sum())
read = range(0, data.nbytes // ROW, 3)
touched = {p for i in read for p in range(i * ROW // PAGE, ((i + 1) * ROW - 1) // PAGE + 1)}
assert rows == len(read)
print(
    json.dumps(
        {
            "size": os.path.getsize(sys.argv[1]),
            "rows_bytes": rows * ROW,
            "pages_touched_bytes": len(touched) * PAGE,
            "pages_present_bytes": len(brought) * PAGE,
            "sum": total,
        }
    )
)
