"""Custom TensorFlow training loops: eager GradientTape, then a tf.function train step.

python custom_loop.py eager|function ITERATIONS
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras
import numpy as np
import tensorflow as tf

mode, iterations = sys.argv[1], int(sys.argv[2])
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(iterations * 16, 8)).astype("float32")
y = x.sum(1, keepdims=True)
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
model = keras.Sequential(
    [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
)
opt = keras.optimizers.SGD(0.01)


def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(xb) - yb) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


if mode == "function":
    step = tf.function(step)
done = 0
loss = None
for xb, yb in ds:
    loss = step(xb, yb)
    done += 1
print("iterations", done)
print(f"final loss {float(loss):.5f}")
