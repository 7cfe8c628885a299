"""Write TFRecord shards, then read them with TFRecordDataset in a Keras fit: python tfrecord_read.py DIR"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras
import numpy as np
import tensorflow as tf

out = sys.argv[1]
if not os.path.exists(os.path.join(out, "shard-0.tfrecord")):
    rng = np.random.default_rng(0)
    for s in range(3):
        with tf.io.TFRecordWriter(os.path.join(out, f"shard-{s}.tfrecord")) as w:
            for _ in range(200):
                x = rng.normal(size=16).astype("float32")
                ex = tf.train.Example(
                    features=tf.train.Features(
                        feature={
                            "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x.sum() > 0)])),
                        }
                    )
                )
                w.write(ex.SerializeToString())
    print("written")
    sys.exit(0)
spec = {"x": tf.io.FixedLenFeature([16], tf.float32), "y": tf.io.FixedLenFeature([1], tf.int64)}
files = sorted(os.path.join(out, f) for f in os.listdir(out) if f.endswith(".tfrecord"))
ds = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec))
ds = ds.map(lambda d: (d["x"], d["y"])).batch(50)
model = keras.Sequential(
    [keras.Input((16,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
)
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(ds, epochs=1, verbose=0)
print("read")
