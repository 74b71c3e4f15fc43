"""The image half of the learned-preprocessing recipe: a learnable camera-correction stage.

Task: tell which of six scikit-image photographs a 16x16 patch comes from (train patches from
the left 60% of each photograph, test patches from the right 40%). Every patch is corrupted the
way a bad camera would: under-exposed, with a colour cast, a gamma that crushes the shadows,
flare that lifts the blacks (low contrast) and sensor noise, then quantised to 8 bits.

Front ends compared, each followed by the same fixed per-channel normalisation and classifier:

* fixed: nothing else (the classifier sees the corrupted patches, normalised);
* learned: `CameraCorrection` (a learnable denoising blur, a 3x3 colour-correction matrix with
  an offset, and a per-channel gamma curve) trained jointly with the classifier;
* oracle: the exact inverse of the known corruption (each patch's own exposure, the cast, the
  flare/contrast and the gamma undone; only noise and quantisation remain), fixed normalisation:
  the best a camera-correction front end could do;
* clean (reference, default configuration only): the uncorrupted patches, fixed normalisation.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from datarax import Pipeline
from datarax.core.element import Element
from datarax.core.operator import OperatorConfig, PerRecordOperator
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.operators.image import GaussianBlurConfig, GaussianBlurOperator, NormalizeConfig, NormalizeOperator
from datarax.operators.learnable import bounded
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import joint_optimizer
from recipes import common
from recipes.data import load_sample_images
from recipes.models import CLASSIFICATION_METRICS, ConvNet, as_float_image, classification_loss

PATCH = 16
CAST = np.array([1.0, 0.72, 0.48], np.float32)
GAMMA = 1.8
FLARE = 0.1
CONTRAST = 0.55
NOISE_STD = 0.03
LOG_GAMMA_BOUND = 1.5


def corrupt(patches: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The bad camera: exposure (random per patch), cast, gamma, flare/low contrast, noise, 8 bits.

    Returns the corrupted uint8 patches and each patch's exposure.
    """
    exposure = 0.45 * np.exp(rng.uniform(-0.3, 0.3, (len(patches), 1, 1, 1)))
    x = exposure * CAST * patches ** GAMMA
    x = CONTRAST * x + FLARE
    x = x + NOISE_STD * rng.standard_normal(x.shape)
    return np.clip(np.round(255 * x), 0, 255).astype(np.uint8), exposure.reshape(-1).astype(np.float32)


def uncorrupt(image: jax.Array, exposure: jax.Array) -> jax.Array:
    """The exact inverse of `corrupt` before its noise and quantisation (float image in [0, 1])."""
    x = (image - FLARE) / CONTRAST / (exposure * CAST)
    return jnp.clip(x, 0.0, 1.0) ** (1.0 / GAMMA)


def oracle(element):
    return element.update_data({"image": uncorrupt(element.data["image"], element.data["exposure"])})


def make_patches(per_class_train: int, per_class_test: int, seed: int) -> dict[str, dict[str, np.ndarray]]:
    """Train/test patches (clean and corrupted, uint8) and labels from the six photographs."""
    rng = np.random.default_rng(seed)
    splits = {"train": [], "test": []}
    for label, image in enumerate(load_sample_images()):
        height, width, _ = image.shape
        cut = int(0.6 * width)
        for split, count, (lo, hi) in (("train", per_class_train, (0, cut - PATCH)),
                                       ("test", per_class_test, (cut, width - PATCH))):
            ys = rng.integers(0, height - PATCH, count)
            xs = rng.integers(lo, hi, count)
            patches = np.stack([image[y:y + PATCH, x:x + PATCH] for y, x in zip(ys, xs)])
            splits[split].append((patches, np.full(count, label, np.int32)))
    out = {}
    for split, parts in splits.items():
        clean = np.concatenate([p for p, _ in parts])
        corrupted, exposure = corrupt(clean, rng)
        out[split] = {"clean": np.round(255 * clean).astype(np.uint8), "corrupted": corrupted,
                      "exposure": exposure, "label": np.concatenate([labels for _, labels in parts])}
    return out


class CameraCorrection(PerRecordOperator):
    """A learnable colour-correction matrix, offset and per-channel gamma (tone curve).

    `out = clip(M @ rgb + b, eps, 1) ** exp(log_gamma)`, with `M` starting at the identity, `b`
    at zero and `log_gamma` bounded to (-1.5, 1.5) through a sigmoid (starting at 0, gamma 1).
    """

    def __init__(self):
        self._init_rng(OperatorConfig(), None)
        self.matrix = nnx.Param(jnp.eye(3))
        self.offset = nnx.Param(jnp.zeros(3))
        self.raw_log_gamma = nnx.Param(jnp.zeros(3))

    def gamma(self) -> jax.Array:
        return jnp.exp(bounded(self.raw_log_gamma[...], -LOG_GAMMA_BOUND, LOG_GAMMA_BOUND))

    def apply_element(self, element: Element, key: jax.Array | None) -> Element:
        image = element.data["image"]
        corrected = jnp.einsum("ij,hwj->hwi", self.matrix[...], image) + self.offset[...]
        return element.update_data({"image": jnp.clip(corrected, 1e-3, 1.0) ** self.gamma()})

    def structure(self) -> str:
        return "CameraCorrection()"


def to_float(element):
    return element.update_data({"image": as_float_image(element.data["image"], 255.0)})


def stages(front_end: str, mean: np.ndarray, std: np.ndarray) -> list:
    normalize = NormalizeOperator(NormalizeConfig(mean=tuple(mean), std=tuple(std)))
    convert = ElementOperator(ElementOperatorConfig(), fn=to_float)
    if front_end == "oracle":
        return [convert, ElementOperator(ElementOperatorConfig(), fn=oracle), normalize]
    if front_end != "learned":
        return [convert, normalize]
    denoise = GaussianBlurOperator(GaussianBlurConfig(sigma=0.3, stochastic=False, kernel_size=5, learnable=True))
    return [convert, denoise, CameraCorrection(), normalize]


def learned_values(front_end: list) -> dict:
    blur, camera = front_end[1], front_end[2]
    return {"denoise_sigma": float(blur.magnitude("sigma")), "matrix": np.asarray(camera.matrix[...]).tolist(),
            "offset": np.asarray(camera.offset[...]).tolist(), "gamma": np.asarray(camera.gamma()).tolist()}


def run(workdir: Path, data: dict, front_end: str, cfg: dict, seed: int) -> dict:
    """Trains the classifier behind one front end; returns its test accuracy and learned values."""
    field = "clean" if front_end == "clean" else "corrupted"
    train_images = data["train"][field]
    seen = train_images / 255.0
    if front_end == "oracle":  # normalised by the statistics of what the classifier sees
        seen = np.asarray(uncorrupt(seen, data["train"]["exposure"][:, None, None, None]))
    mean = seen.mean(axis=(0, 1, 2))
    std = seen.std(axis=(0, 1, 2))
    train_stages = stages(front_end, mean, std)
    train = MemorySource(MemorySourceConfig(shuffle=True, seed=seed),
                         data={"image": train_images, "label": data["train"]["label"],
                               "exposure": data["train"]["exposure"]})
    test = MemorySource(MemorySourceConfig(), data={"image": data["test"][field], "label": data["test"]["label"],
                                                    "exposure": data["test"]["exposure"]})
    pipeline = Pipeline(train, train_stages, batch_size=cfg["batch_size"], drop_remainder=True)
    # The eval pipeline shares the trained front-end modules, so it sees their learned values.
    evaluation = Pipeline(test, train_stages, batch_size=300)
    model = ConvNet(3, 6, widths=(16, 32, 32), image_size=(PATCH, PATCH), hidden=64, seed=seed)
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"], max(1, cfg["steps"] // 20), cfg["steps"])
    learned = front_end == "learned"
    tx = optax.adam(schedule)
    if learned:
        tx = joint_optimizer(tx, optax.adam(cfg["front_end_learning_rate"]))
    _, outcome = common.train_run(workdir / "runs" / f"seed{seed}" / f"image-{front_end}", model, tx, pipeline,
                                  classification_loss, steps=cfg["steps"], eval_pipeline=evaluation,
                                  metrics=CLASSIFICATION_METRICS, joint=learned,
                                  label=f"[seed {seed} image {front_end}] ",
                                  log_every=max(1, cfg["steps"] // 4))
    record = {"front_end": front_end, "test_accuracy": outcome.eval_metrics["accuracy"], "run": outcome.as_dict()}
    if learned:
        record["learned"] = learned_values(train_stages)
    print(f"[seed {seed} image {front_end}] test accuracy {record['test_accuracy']:.4f}", flush=True)
    return record


def example_rows(data: dict, records: list[dict], count: int = 6) -> dict[str, np.ndarray]:
    """Clean, corrupted and (with the learned values) corrected versions of a few test patches."""
    idx = np.linspace(0, len(data["test"]["label"]) - 1, count).astype(int)
    rows = {"clean": data["test"]["clean"][idx] / 255.0, "corrupted": data["test"]["corrupted"][idx] / 255.0}
    learned = next((r["learned"] for r in records if "learned" in r), None)
    if learned is not None:
        x = np.einsum("ij,nhwj->nhwi", np.asarray(learned["matrix"]), rows["corrupted"]) + np.asarray(learned["offset"])
        rows["learned correction"] = np.clip(x, 1e-3, 1.0) ** np.asarray(learned["gamma"])
    return rows
