"""An ordinary Keras 3 script: fit with validation, a ModelCheckpoint, then evaluate.

python keras_fit.py OUT_DIR slow|fast [epochs]
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras
import numpy as np
import tensorflow as tf

out, mode = sys.argv[1], sys.argv[2]
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
keras.utils.set_random_seed(0)
n, batch = 2560, 256  # 10 steps per epoch, compute well above a fetch
x = np.random.default_rng(0).normal(size=(n, 64)).astype("float32")
y = (x.sum(1) > 0).astype("int32")


def slow_decode(a, b):
    def f(v):
        time.sleep(0.15)  # a slow Python decode step, far above the compute even on a loaded machine
        return v

    a = tf.numpy_function(f, [a], tf.float32)
    a.set_shape([None, 64])
    return a, b


ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
ds = ds.map(slow_decode) if mode == "slow" else ds.cache().prefetch(tf.data.AUTOTUNE)
val = tf.data.Dataset.from_tensor_slices((x[:512], y[:512])).batch(batch)
width = 768
model = keras.Sequential(
    [
        keras.Input((64,)),
        *[keras.layers.Dense(width, activation="relu") for _ in range(4)],
        keras.layers.Dense(2),
    ]
)
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
ckpt = keras.callbacks.ModelCheckpoint(os.path.join(out, "ck.weights.h5"), save_weights_only=True)
history = model.fit(ds, epochs=epochs, validation_data=val, verbose=0, callbacks=[ckpt])
model.evaluate(val, verbose=0)
print("epochs run", len(history.history["loss"]))
print(f"final loss {history.history['loss'][-1]:.4f}")
