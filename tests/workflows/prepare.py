"""Data preparation: numpy writes the training set as .npy shards and a text file of keys.

``python prepare.py DATA_DIR [--shards N] [--rows R] [--keys K]``. Knows nothing about holoprof.
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data_dir")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--keys", type=int, default=300_000)
    args = ap.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(args.shards):
        x = rng.standard_normal((args.rows, 16)).astype(np.float32)
        y = (x[:, 0] > 0).astype(np.int64)
        np.save(os.path.join(args.data_dir, f"x{i}.npy"), x)
        np.save(os.path.join(args.data_dir, f"y{i}.npy"), y)
    keys = rng.integers(0, 1 << 40, size=args.keys)
    np.savetxt(os.path.join(args.data_dir, "keys.txt"), keys, fmt="%d")
    with open(os.path.join(args.data_dir, "keys.txt"), "rb") as f:
        os.fsync(f.fileno())
    print(f"prepared {args.shards} shards and {args.keys} keys in {args.data_dir}")


if __name__ == "__main__":
    main()
