"""A seeded Keras 3 fit on TFRecord shards, measuring its own truth.

python keras_tfrecord_seeded.py DATA_DIR RESULT_JSON

The dataset's length is unknown to Keras (TFRecordDataset), it is shuffled, the model has dropout and
Adam: every way tracing could change the training shows in the losses, the optimizer's iteration count
or the weights. The script counts its own train batches and epochs and times each batch with a
callback (batch begin to batch end: what Keras runs for one step), and writes them to RESULT_JSON.
"""

import hashlib
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras
import numpy as np
import tensorflow as tf

data_dir, result = sys.argv[1], sys.argv[2]
n, dim, batch, epochs = 1000, 32, 64, 3  # 16 batches an epoch, the last one partial
if not os.path.exists(os.path.join(data_dir, "train-1.tfrecord")):
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(n, dim)).astype("float32")
    for s in range(2):
        with tf.io.TFRecordWriter(os.path.join(data_dir, f"train-{s}.tfrecord")) as w:
            for x in xs[s::2]:
                feature = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x.sum() > 0)])),
                }
                w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())

keras.utils.set_random_seed(0)
spec = {"x": tf.io.FixedLenFeature([dim], tf.float32), "y": tf.io.FixedLenFeature([1], tf.int64)}


def parse(record):
    d = tf.io.parse_single_example(record, spec)
    return d["x"], d["y"][0]


files = sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir) if f.endswith(".tfrecord"))
ds = tf.data.TFRecordDataset(files).map(parse).shuffle(500, seed=1).batch(batch).prefetch(1)
val = tf.data.TFRecordDataset(files[:1]).map(parse).take(128).batch(batch)
model = keras.Sequential(
    [
        keras.Input((dim,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(2),
    ]
)
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Truth(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.batches = 0
        self.epochs = 0
        self.batch_s = 0.0
        self._t0 = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.batch_s += time.perf_counter() - self._t0
        self.batches += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epochs += 1


truth = Truth()
ckpt = keras.callbacks.ModelCheckpoint(os.path.join(data_dir, "model.weights.h5"), save_weights_only=True)
history = model.fit(ds, epochs=epochs, validation_data=val, verbose=0, callbacks=[truth, ckpt])
weights = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights()))
with open(result, "w") as f:
    json.dump(
        {
            "batches": truth.batches,
            "epochs": truth.epochs,
            "batch_s": truth.batch_s,
            "iterations": int(model.optimizer.iterations.numpy()),
            "losses": [repr(v) for v in history.history["loss"]],
            "val_losses": [repr(v) for v in history.history["val_loss"]],
            "weights": weights.hexdigest(),
        },
        f,
    )
