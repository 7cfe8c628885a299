"""A training loop during which the file system fills up; nothing in it knows about holoprof.

``python fill_disk.py FILLER [--free] [--exit N] [--wait-for FILE]``: trains a few steps, then writes
FILLER until the file system is full (``ENOSPC``), trains more steps (with ``--wait-for``: first waits
until FILE exists), removes FILLER again with ``--free``, prints its results and exits with N.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import time

import torch


def fill(path: str) -> int:
    """Write ``path`` until the disk is full; returns the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    total = 0
    try:
        for block in (1 << 20, 1 << 16, 1 << 12, 1):
            data = b"x" * block
            while True:
                try:
                    n = os.write(fd, data)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                total += n
                if n < block:
                    break
    finally:
        os.close(fd)
    return total


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("filler")
    ap.add_argument("--free", action="store_true")
    ap.add_argument("--exit", type=int, default=0)
    ap.add_argument("--wait-for", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 16), torch.randint(0, 2, (64,))
    loss = torch.zeros(())
    steps = 0

    def train(n: int, sleep_s: float) -> None:
        nonlocal loss, steps
        for _ in range(n):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
            time.sleep(sleep_s)

    train(5, 0.0)
    if args.wait_for:
        print("started", flush=True)
        while not os.path.exists(args.wait_for):
            time.sleep(0.05)
    else:
        fill(args.filler)
    train(60, 0.03)  # about two seconds: flushes of the agent happen meanwhile
    if args.free and os.path.exists(args.filler):
        os.remove(args.filler)
    print(f"steps {steps}")
    print(f"final loss {loss.item():.6f}")
    sys.stdout.flush()
    return args.exit


if __name__ == "__main__":
    sys.exit(main())
