"""tf.data, the way the TensorFlow performance guide builds an input pipeline.

`Dataset.from_tensor_slices(arrays)`, a full-size `shuffle` reshuffled every iteration,
per-record `map` with `tf.image` ops and `num_parallel_calls=AUTOTUNE` (non-deterministic order
allowed, as the guide recommends for throughput), `batch`, `prefetch(AUTOTUNE)`, read through
`as_numpy_iterator()`. TensorFlow is imported only when this peer runs.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from datarax.bench.peers.common import CIFAR_MEAN, CIFAR_PAD, CIFAR_STD, Loader, PeerOptions, require

NAME = "tfdata"
INSTALL = "pip install tensorflow-cpu"
MODULE = "tensorflow"


def _tf() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    tf = require(MODULE, NAME, INSTALL)
    tf.config.set_visible_devices([], "GPU")  # JAX owns any accelerator; tf.data runs on the host
    return tf


def _shuffled(tf: Any, data: dict[str, np.ndarray], options: PeerOptions) -> Any:
    n = len(next(iter(data.values())))
    dataset = tf.data.Dataset.from_tensor_slices(data)
    return dataset.shuffle(n, seed=options.seed, reshuffle_each_iteration=True)


def cifar(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    tf = _tf()
    tf.random.set_seed(options.seed)
    mean, std = tf.constant(CIFAR_MEAN), tf.constant(CIFAR_STD)
    height, width, channels = data["image"].shape[1:]

    def augment(element):
        image = tf.cast(element["image"], tf.float32) / 255.0
        image = tf.pad(image, [[CIFAR_PAD, CIFAR_PAD], [CIFAR_PAD, CIFAR_PAD], [0, 0]], mode="REFLECT")
        image = tf.image.random_crop(image, [height, width, channels])
        image = tf.image.random_flip_left_right(image)
        return {"image": (image - mean) / std, "label": element["label"]}

    # workers: None lets tf.data tune the parallelism, 0 maps sequentially, n uses n parallel calls.
    parallel = tf.data.AUTOTUNE if options.workers is None else (options.workers or None)
    order = {"deterministic": False} if parallel is not None else {}
    dataset = (_shuffled(tf, data, options)
               .map(augment, num_parallel_calls=parallel, **order)
               .batch(options.batch_size)
               .prefetch(tf.data.AUTOTUNE))
    settings = (f"from_tensor_slices.shuffle(N).map(tf.image ops, num_parallel_calls="
                f"{'AUTOTUNE' if options.workers is None else parallel}).batch.prefetch(AUTOTUNE)")
    return Loader(dataset.as_numpy_iterator, settings)


def tokens(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    tf = _tf()
    dataset = _shuffled(tf, data, options).batch(options.batch_size).prefetch(tf.data.AUTOTUNE)
    return Loader(dataset.as_numpy_iterator, "from_tensor_slices.shuffle(N).batch.prefetch(AUTOTUNE)")


WORKLOADS = {"cifar": cifar, "tokens": tokens}
