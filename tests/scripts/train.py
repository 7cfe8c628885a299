"""An ordinary PyTorch training script; nothing in it knows about holoprof.

One epoch = ``--batches`` training steps over a DataLoader, then an eval pass under ``no_grad`` and a
``torch.save`` of the weights. Options switch on the variants the tests need: a slow ``__getitem__``
(input-bound), a bigger model (compute-bound), worker processes, no optimizer (a manual update),
gradient accumulation, a crash, a slow loop that announces itself (for signals), a ``torch.load`` of
the checkpoint at the end.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

FEATURES = 16


class Samples(Dataset):
    """Random features with a learnable label; ``sleep_s`` per item makes the loader slow."""

    def __init__(self, n: int, features: int, seed: int, sleep_s: float = 0.0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=g)
        self.y = (self.x[:, 0] > 0).long()
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[i], self.y[i]


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batches", type=int, default=8, help="training steps per epoch")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--features", type=int, default=FEATURES)
    ap.add_argument("--optimizer", choices=("sgd", "adam", "none"), default="sgd")
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--sleep-per-sample", type=float, default=0.0)
    ap.add_argument("--sleep-per-step", type=float, default=0.0)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--mp-context", default=None)
    ap.add_argument("--raise-after", type=int, default=-1, help="raise after this many steps")
    ap.add_argument("--announce-after", type=int, default=-1, help="print 'started' after N steps")
    ap.add_argument("--no-eval", action="store_true")
    ap.add_argument("--checkpoint", default="checkpoint.pt")
    ap.add_argument("--reload", action="store_true", help="load the last checkpoint back at the end")
    return ap.parse_args()


def main() -> int:
    args = parse()
    torch.manual_seed(0)
    train = Samples(args.batches * args.batch_size * args.accum, args.features, 1, args.sleep_per_sample)
    val = Samples(2 * args.batch_size, args.features, 2)
    loader = DataLoader(
        train,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        multiprocessing_context=args.mp_context if args.workers else None,
        generator=torch.Generator().manual_seed(3),
    )
    val_loader = DataLoader(val, batch_size=args.batch_size)
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 2))
    loss_fn = nn.CrossEntropyLoss()
    opt: torch.optim.Optimizer | None = None
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    elif args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    steps = 0
    loss = torch.zeros(())
    for epoch in range(args.epochs):
        model.train()
        for i, (x, y) in enumerate(loader):
            loss = loss_fn(model(x), y) / args.accum
            loss.backward()
            if (i + 1) % args.accum:
                continue
            if opt is not None:
                opt.step()
                opt.zero_grad()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        assert p.grad is not None
                        p -= 0.05 * p.grad
                        p.grad = None
            steps += 1
            if args.sleep_per_step:
                time.sleep(args.sleep_per_step)
            if steps == args.announce_after:
                print("started", flush=True)
            if steps == args.raise_after:
                raise RuntimeError(f"boom after {steps} steps")
        if not args.no_eval:
            model.eval()
            correct = 0
            with torch.no_grad():
                for x, y in val_loader:
                    correct += int((model(x).argmax(1) == y).sum())
            print(f"epoch {epoch} accuracy {correct / len(val):.4f}")
        torch.save(model.state_dict(), args.checkpoint)
    if args.reload:
        state = torch.load(args.checkpoint)
        print(f"reloaded {sum(float(t.sum()) for t in state.values()):.6f}")
    print(f"steps {steps}")
    print(f"final loss {loss.item():.6f}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
