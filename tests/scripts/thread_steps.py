"""Training loops in threads: ``python thread_steps.py THREADS STEPS [--torch]``.

Each of THREADS threads runs STEPS iterations of its own loop, all at once. Without ``--torch`` an
iteration is a ``holoprof.phase("forward")`` and a ``holoprof.step()``; with ``--torch`` each thread
trains a small model of its own (forward, backward, SGD step). Prints ``steps N``, the iterations run.
"""

import sys
import threading

import holoprof

threads, steps = int(sys.argv[1]), int(sys.argv[2])
use_torch = "--torch" in sys.argv
done = [0] * threads


def marked(i: int) -> None:
    for _ in range(steps):
        with holoprof.phase("forward"):
            sum(range(20))
        holoprof.step()
        done[i] += 1


def trained(i: int) -> None:
    import torch

    g = torch.Generator().manual_seed(i)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        done[i] += 1


if use_torch:
    import torch

    torch.set_num_threads(1)
workers = [threading.Thread(target=trained if use_torch else marked, args=(i,)) for i in range(threads)]
for w in workers:
    w.start()
for w in workers:
    w.join()
print(f"steps {sum(done)}")
