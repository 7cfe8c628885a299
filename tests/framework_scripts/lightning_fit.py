"""PyTorch Lightning's Trainer as people use it: automatic optimization (the optimizer steps with a
closure that runs training_step, zero_grad and backward), a training DataLoader with 2 worker
processes, a validation loop every epoch and ModelCheckpoint. No logger, no progress bar."""

from __future__ import annotations

import os
import time
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from truth import Truth

TRUTH = Truth()


class TimedSGD(torch.optim.SGD):
    """SGD whose update (the step without its closure) the job times itself."""

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        t0 = time.perf_counter()
        super().step()
        TRUTH.add("optimizer", time.perf_counter() - t0)
        return loss


class TimedLoader(DataLoader):
    """A DataLoader whose iterators time each fetch the loop asks for (the job's own data wait)."""

    def __iter__(self) -> Any:
        it = super().__iter__()

        class Timed:
            def __iter__(self) -> Any:
                return self

            def __next__(self) -> Any:
                t0 = time.perf_counter()
                try:
                    return next(it)
                finally:
                    TRUTH.add("data_wait", time.perf_counter() - t0)

            def __len__(self) -> int:
                return len(it)

        return Timed()


class Regressor(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 1),
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        t0 = time.perf_counter()
        out = self.net(x)
        TRUTH.add("forward", time.perf_counter() - t0)
        return F.mse_loss(out, y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        t0 = time.perf_counter()
        super().backward(loss, *args, **kwargs)
        TRUTH.add("backward", time.perf_counter() - t0)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        t0 = time.perf_counter()
        optimizer.zero_grad()
        TRUTH.add("optimizer", time.perf_counter() - t0)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        TRUTH.losses.append(repr(float(outputs["loss"])))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return TimedSGD(self.parameters(), lr=0.01, momentum=0.9)


def main() -> None:
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    train = TensorDataset(torch.randn(1024, 16, generator=g), torch.randn(1024, 1, generator=g))
    val = TensorDataset(torch.randn(256, 16, generator=g), torch.randn(256, 1, generator=g))
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=os.getcwd(),
        callbacks=[L.pytorch.callbacks.ModelCheckpoint(dirpath="checkpoints", save_last=False)],
    )
    trainer.fit(
        Regressor(),
        TimedLoader(train, batch_size=16, shuffle=True, num_workers=2),
        DataLoader(val, batch_size=64),
    )
    TRUTH.steps = trainer.global_step
    TRUTH.epochs = trainer.current_epoch
    TRUTH.write()


if __name__ == "__main__":
    main()
