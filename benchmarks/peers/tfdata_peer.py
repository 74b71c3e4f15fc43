"""tf.data, the way the TensorFlow performance guide builds an input pipeline.

`Dataset.from_tensor_slices(arrays)`, a full-size `shuffle` reshuffled every iteration,
per-record `map` with `tf.image` ops and `num_parallel_calls=AUTOTUNE` (non-deterministic order
allowed, as the guide recommends for throughput), `batch`, `prefetch(AUTOTUNE)`, read through
`as_numpy_iterator()`. TensorFlow is imported only when this peer runs.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from benchmarks.peers.common import (
    CIFAR_MEAN,
    CIFAR_PAD,
    CIFAR_STD,
    JPEG_MEAN,
    JPEG_RATIO,
    JPEG_SCALE,
    JPEG_SIZE,
    JPEG_STD,
    Loader,
    PeerOptions,
    augment_chain_settings,
    require,
)

NAME = "tfdata"
INSTALL = "pip install tensorflow-cpu"
LABELS = {"jpeg_variant": "tfdata[antialias]"}  # the framework column of a variant's row
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


def _mapped(tf: Any, data: dict[str, np.ndarray], options: PeerOptions, augment: Any, ops: str) -> Loader:
    """shuffle -> parallel map(augment) -> batch -> prefetch, and its settings line.

    `options.workers`: None lets tf.data tune the parallelism, 0 maps sequentially, n uses n
    parallel calls.
    """
    parallel = tf.data.AUTOTUNE if options.workers is None else (options.workers or None)
    order = {"deterministic": False} if parallel is not None else {}
    dataset = (_shuffled(tf, data, options)
               .map(augment, num_parallel_calls=parallel, **order)
               .batch(options.batch_size)
               .prefetch(tf.data.AUTOTUNE))
    settings = (f"from_tensor_slices.shuffle(N).map({ops}, num_parallel_calls="
                f"{'AUTOTUNE' if options.workers is None else parallel}).batch.prefetch(AUTOTUNE)")
    return Loader(dataset.as_numpy_iterator, settings)


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

    return _mapped(tf, data, options, augment, "tf.image ops")


def tokens(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    tf = _tf()
    dataset = _shuffled(tf, data, options).batch(options.batch_size).prefetch(tf.data.AUTOTUNE)
    return Loader(dataset.as_numpy_iterator, "from_tensor_slices.shuffle(N).batch.prefetch(AUTOTUNE)")


def _rotate(tf: Any, image: Any, degrees: float) -> Any:
    """A bilinear rotation about the centre with zero fill (the op Keras' RandomRotation uses)."""
    side_h, side_w = image.shape[0], image.shape[1]
    angle = tf.random.uniform([], -degrees, degrees) * (math.pi / 180.0)
    cos, sin = tf.cos(angle), tf.sin(angle)
    cx, cy = (side_w - 1) / 2.0, (side_h - 1) / 2.0
    transform = tf.stack([cos, -sin, cx - (cos * cx - sin * cy), sin, cos, cy - (sin * cx + cos * cy), 0.0, 0.0])
    return tf.raw_ops.ImageProjectiveTransformV3(
        images=image[None], transforms=transform[None], output_shape=[side_h, side_w], fill_value=0.0,
        interpolation="BILINEAR", fill_mode="CONSTANT")[0]


def augment_chain(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    tf = _tf()
    tf.random.set_seed(options.seed)
    max_delta, degrees, sigma = augment_chain_settings()
    height, width, channels = data["image"].shape[1:]
    pad = height // 8

    def augment(element):
        image = tf.pad(element["image"], [[pad, pad], [pad, pad], [0, 0]], mode="REFLECT")
        image = tf.image.random_crop(image, [height, width, channels])
        image = tf.image.random_flip_left_right(image)
        image = tf.clip_by_value(image * tf.random.uniform([], 1 - max_delta, 1 + max_delta), 0.0, 1.0)
        image = tf.clip_by_value(tf.image.random_contrast(image, 1 - max_delta, 1 + max_delta), 0.0, 1.0)
        image = _rotate(tf, image, degrees)
        image = tf.clip_by_value(image + tf.random.normal(tf.shape(image), stddev=sigma), 0.0, 1.0)
        return {"image": image, "label": element["label"]}

    return _mapped(tf, data, options, augment, "tf.image ops + projective rotation")


def _jpeg(data: dict[str, np.ndarray], options: PeerOptions, antialias: bool) -> Loader:
    """The Inception/ResNet reference preprocessing: a sampled window decoded with
    decode_and_crop_jpeg, resized with `tf.image.resize` (antialias=False is tf's default)."""
    tf = _tf()
    tf.random.set_seed(options.seed)
    mean, std = tf.constant(JPEG_MEAN), tf.constant(JPEG_STD)
    whole = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4])

    def load(element):
        contents = tf.io.read_file(element["path"])
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.io.extract_jpeg_shape(contents), bounding_boxes=whole, min_object_covered=0.0,
            aspect_ratio_range=JPEG_RATIO, area_range=JPEG_SCALE, max_attempts=10, use_image_if_no_bounding_boxes=True)
        top, left, _ = tf.unstack(begin)
        height, width, _ = tf.unstack(size)
        image = tf.io.decode_and_crop_jpeg(contents, tf.stack([top, left, height, width]), channels=3)
        image = tf.image.resize(image, [JPEG_SIZE, JPEG_SIZE], method="bilinear", antialias=antialias)
        image = tf.image.random_flip_left_right(image)
        return {"image": (image / 255.0 - mean) / std, "label": element["label"]}

    def quality(path: str, box: tuple[int, int, int, int]) -> np.ndarray:
        image = tf.io.decode_and_crop_jpeg(tf.io.read_file(path), tf.constant(box, tf.int32), channels=3)
        image = tf.image.resize(image, [JPEG_SIZE, JPEG_SIZE], method="bilinear", antialias=antialias)
        return np.clip(np.round(image.numpy()), 0, 255).astype(np.uint8)

    resize = f"resize(bilinear, antialias={antialias})"
    loader = _mapped(tf, data, options, load, f"sample_distorted_bounding_box + decode_and_crop_jpeg + {resize}")
    loader.quality = quality
    return loader


def jpeg(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    """As tf.data users run it: `tf.image.resize` at its default, antialias=False."""
    return _jpeg(data, options, antialias=False)


def jpeg_variant(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    """The same with antialias=True (slower, no better here; see the PSNR column)."""
    return _jpeg(data, options, antialias=True)


WORKLOADS = {"cifar": cifar, "tokens": tokens, "augment_chain": augment_chain, "jpeg": jpeg,
             "jpeg_variant": jpeg_variant}
