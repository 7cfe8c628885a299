"""A Keras fit that runs until STOP_FILE exists (or LIMIT_S passes): python keras_live.py STOP_FILE LIMIT_S"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras
import numpy as np
import tensorflow as tf

stop_file, limit_s = sys.argv[1], float(sys.argv[2])
t_end = time.monotonic() + limit_s


class StopOnFile(keras.callbacks.Callback):
    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        if os.path.exists(stop_file) or time.monotonic() > t_end:
            self.model.stop_training = True


x = np.random.default_rng(0).normal(size=(1024, 32)).astype("float32")
y = (x.sum(1) > 0).astype("int32")
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).prefetch(2)
model = keras.Sequential(
    [keras.Input((32,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(2)]
)
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(ds, epochs=100000, verbose=0, callbacks=[StopOnFile()])
print("stopped")
