"""A ``tf.distribute`` custom training loop: MirroredStrategy over 2 logical CPUs, the dataset
distributed with ``experimental_distribute_dataset``, and a ``@tf.function`` step that runs
``strategy.run(step_fn)`` and reduces the replicas' losses. Each mode (the arguments; both by default)
trains 2 epochs of 25 batches in turn, in one process: ``keras`` applies a Keras optimizer
(``apply_gradients``), ``plain`` updates the variables itself (``assign_sub``).

The input is slow on purpose (each batch sleeps 30 ms in the pipeline, longer than a step): the loop
waits for its input most of the time. Seeded: the losses are compared bit for bit with an untraced
run. The script counts its own steps (calls of the step function) and epochs (iterations over the
distributed dataset that ended) and times each ``next()`` on the distributed iterator and each step
call, and the median share of an iteration spent waiting for its batch; all go to $TRUTH_OUT."""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras
import numpy as np
import tensorflow as tf
from truth import Truth

BATCHES, BATCH, DIM, EPOCHS, SLEEP_S = 25, 32, 16, 2, 0.03
MODES = ("keras", "plain")


def slow(x: np.ndarray) -> np.ndarray:
    time.sleep(SLEEP_S)
    return x


def dataset() -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCHES * BATCH, DIM)).astype("float32")
    y = (x @ rng.normal(size=(DIM, 1))).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
    return ds.map(lambda a, b: (tf.numpy_function(slow, [a], tf.float32, stateful=True), b))


def train(mode: str, strategy: tf.distribute.Strategy, truth: Truth, shares: list[float]) -> None:
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((DIM,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)]
        )
        opt = keras.optimizers.Adam(1e-2) if mode == "keras" else None
        if opt is not None:
            opt.build(model.trainable_variables)  # its slots mirrored, before the step is traced
    dist = strategy.experimental_distribute_dataset(dataset())

    def step_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean((model(x, training=True) - y) ** 2, axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        if opt is not None:
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        else:
            for v, g in zip(model.trainable_variables, grads, strict=True):
                v.assign_sub(0.01 * g)
        return loss

    @tf.function
    def train_step(batch: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
        per_replica = strategy.run(step_fn, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    for _ in range(EPOCHS):
        it = iter(dist)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                truth.add("data_wait", time.perf_counter() - t0)
                break
            wait = time.perf_counter() - t0
            truth.add("data_wait", wait)
            t0 = time.perf_counter()
            loss = float(train_step(batch).numpy())
            call = time.perf_counter() - t0
            truth.add("step", call)
            shares.append(wait / (wait + call))
            truth.steps += 1
            truth.losses.append(loss.hex())
        truth.epochs += 1


def main(modes: list[str]) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    truth = Truth()
    shares: list[float] = []  # of each iteration, the share of its fetch and step call spent fetching
    for mode in modes:
        train(mode, strategy, truth, shares)
    truth.write(replicas=strategy.num_replicas_in_sync, wait_share_median=statistics.median(shares))


if __name__ == "__main__":
    main(sys.argv[1:] or list(MODES))
