"""A plain PyTorch loop with LBFGS: every step is ``optimizer.step(closure)``, whose closure runs
zero_grad, forward and backward (several times per step). Two epochs over a DataLoader."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from truth import Truth


def main() -> None:
    torch.manual_seed(0)
    truth = Truth()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 16, generator=g), torch.randn(512, 1, generator=g))
    loader = DataLoader(data, batch_size=32, shuffle=True, generator=g)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.LBFGS(model.parameters(), max_iter=3, history_size=5)
    loss_fn = nn.MSELoss()
    in_closure = 0.0
    started: list[float] = []

    # the optimizer's own work: its step without the closure it calls (plus zero_grad), timed by
    # the optimizer's own step hooks
    def step_pre(_opt: object, _args: object, _kwargs: object) -> None:
        started[:] = [time.perf_counter(), in_closure]

    def step_post(_opt: object, _args: object, _kwargs: object) -> None:
        t0, before = started
        truth.add("optimizer_step", time.perf_counter() - t0 - (in_closure - before))

    opt.register_step_pre_hook(step_pre)
    opt.register_step_post_hook(step_post)
    for _ in range(2):
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                truth.add("data_wait", time.perf_counter() - t0)
                break
            truth.add("data_wait", time.perf_counter() - t0)

            def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                nonlocal in_closure
                c0 = time.perf_counter()
                z0 = time.perf_counter()
                opt.zero_grad()
                truth.add("zero_grad", time.perf_counter() - z0)
                f0 = time.perf_counter()
                loss = loss_fn(model(x), y)  # the loss is a module call too: forward
                truth.add("forward", time.perf_counter() - f0)
                b0 = time.perf_counter()
                loss.backward()
                truth.add("backward", time.perf_counter() - b0)
                in_closure += time.perf_counter() - c0
                return loss

            loss = opt.step(closure)
            truth.steps += 1
            truth.losses.append(repr(float(loss)))
        truth.epochs += 1
    truth.timers["optimizer"] = truth.timers.pop("optimizer_step") + truth.timers.pop("zero_grad")
    truth.write()


if __name__ == "__main__":
    main()
