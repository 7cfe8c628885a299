"""Keras 3 on the PyTorch backend: ``model.fit`` with validation, ``ModelCheckpoint`` saving a whole
model each epoch (``ep{epoch:02d}.keras``) and the weights (``.weights.h5``), Adam and dropout.

python keras_torch_fit.py OUT_DIR

Keras iterates a torch DataLoader of its own and runs each step in Python. The script times its own
steps with a callback (a batch's begin to its end: the forward, backward and update Keras runs), the
wait for the next batch (the previous batch's end, or the epoch's begin, to the batch's begin: Keras
fetches the batch in between) and its saves (``model.save``/``save_weights``, which
``ModelCheckpoint`` calls); it counts its steps, epochs and saves, and writes its losses (the running
mean Keras reports after each batch), a hash of the final weights and the bytes of its trainable
variables and of its optimizer's variables."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from typing import Any

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np
import torch
from truth import Truth

N, DIM, BATCH, EPOCHS = 512, 16, 32, 2  # 16 batches an epoch


class Timers(keras.callbacks.Callback):
    def __init__(self, truth: Truth) -> None:
        super().__init__()
        self.truth = truth
        self._t = 0.0
        self._b = 0.0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._t = time.perf_counter()

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._b = time.perf_counter()
        self.truth.add("data_wait", self._b - self._t)

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._t = time.perf_counter()
        self.truth.add("step", self._t - self._b)
        self.truth.steps += 1
        self.truth.losses.append(repr(float((logs or {})["loss"])))

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.truth.epochs += 1


def main(out: str) -> None:
    torch.set_num_threads(1)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, DIM)).astype("float32")
    y = (x @ rng.normal(size=(DIM, 1))).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((DIM,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dropout(0.1),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="adam", loss="mse")
    truth = Truth()
    saves: list[str] = []

    def counted(fn: Any) -> Any:
        """``model.save``/``save_weights`` (ModelCheckpoint calls them), counted and timed."""
        timed = truth.timed("checkpoint", fn)

        def call(filepath: str, *args: Any, **kwargs: Any) -> Any:
            saves.append(os.path.basename(filepath))
            return timed(filepath, *args, **kwargs)

        return call

    model.save = counted(model.save)  # type: ignore[method-assign]
    model.save_weights = counted(model.save_weights)  # type: ignore[method-assign]
    callbacks = [
        Timers(truth),
        keras.callbacks.ModelCheckpoint(os.path.join(out, "ep{epoch:02d}.keras")),
        keras.callbacks.ModelCheckpoint(os.path.join(out, "last.weights.h5"), save_weights_only=True),
    ]
    model.fit(
        x[:448], y[:448], batch_size=BATCH, epochs=EPOCHS, validation_data=(x[448:], y[448:]),
        verbose=0, callbacks=callbacks,
    )  # fmt: skip
    weights = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights()))
    trained = sum(int(v.value.nbytes) for v in model.trainable_variables)
    optimizer = sum(int(v.value.nbytes) for v in model.optimizer.variables)
    truth.write(
        weights=weights.hexdigest(),
        saves=saves,
        trainable_bytes=trained,
        optimizer_bytes=optimizer,
    )


if __name__ == "__main__":
    main(sys.argv[1])
