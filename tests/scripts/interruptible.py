"""A training loop that runs until a signal stops it, then says what it received.

``python interruptible.py [--handle SIGINT|SIGTERM] [--no-torch]``: prints ``started`` after a few
steps, then trains until the handled signal arrives (at most ``--max-steps``). The handler only
counts; after the first signal the loop stops, waits a moment (a duplicate signal would arrive then),
prints ``signals <count>`` and ``steps <n>`` and exits with 128 + the signal number. Without
``--handle`` the default actions apply (SIGTERM kills the process). With ``--no-torch`` the loop is
plain Python marked with ``holoprof.phase`` and ``holoprof.step``.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable

received: list[int] = []


def torch_step() -> Callable[[], None]:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()

    return step


def plain_step() -> Callable[[], None]:
    import holoprof

    def step() -> None:
        with holoprof.phase("forward"):
            sum(i * i for i in range(1000))
        holoprof.step()

    return step


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--handle", choices=("SIGINT", "SIGTERM"))
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument("--announce-after", type=int, default=3)
    args = ap.parse_args()
    if args.handle:
        signal.signal(getattr(signal, args.handle), lambda signum, frame: received.append(signum))

    step = plain_step() if args.no_torch else torch_step()
    steps = 0
    while steps < args.max_steps and not received:
        step()
        steps += 1
        if steps == args.announce_after:
            print("started", flush=True)
        time.sleep(0.01)
    if received:
        time.sleep(0.5)
    print(f"signals {len(received)}", flush=True)
    print(f"steps {steps}", flush=True)
    return 128 + received[0] if received else 0


if __name__ == "__main__":
    sys.exit(main())
