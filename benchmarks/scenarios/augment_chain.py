"""`augment_chain`: a 6-operator image chain on 32x32 and 128x128 float images, shuffled.

Chain: random crop (reflect-pad size/8) -> horizontal flip -> brightness (0.2) -> contrast (0.2)
-> rotation (15 degrees, bilinear) -> Gaussian noise (0.05), built from the
`datarax.operators.image` operator classes.

Floor: one hand-written jitted function doing the device-resident gather and the same maths
(the pure functions of `datarax.operators.image`, one key split per record instead of one key
per stage), fed a precomputed permutation per epoch, last batch padded.

Limit (`benchmarks.limits`): the fastest hand-written program found for the floor's exact
output: the floor's code, or its crop and flip as selection matrices on lane-dense data, at one
or 32 batches per program.

Peers (`python -m benchmarks augment_chain --vs torch,tfdata,grain`, each run in its own
process by `benchmarks.peers`): the torch peer's dataset is `TorchChain` below, the same six
transforms per element with torch tensor ops (`grid_sample` for the rotation), as a torchvision
pipeline would do them; torchvision itself is not used because no build of it matches the pinned
torch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import limits
from benchmarks.registry import BenchOptions
from benchmarks.timing import keyed_gather_floor, pipeline_vs_floor
from datarax import Pipeline
from datarax.core.fusion import separately
from datarax.core.noise import standard_normal
from datarax.operators.image import (
    BrightnessConfig,
    BrightnessOperator,
    ContrastConfig,
    ContrastOperator,
    GaussianNoiseConfig,
    GaussianNoiseOperator,
    HorizontalFlipConfig,
    HorizontalFlipOperator,
    RandomCropConfig,
    RandomCropOperator,
    RotationConfig,
    RotationOperator,
)
from datarax.operators.image.functional import color, filters, geometry
from datarax.sources import MemorySource, MemorySourceConfig

# (image side, records, batch size): ~12 MB and ~200 MB of float32 images.
SIZES = ((32, 8192, 256), (128, 1024, 64))
MAX_DELTA, DEGREES, SIGMA = 0.2, 15.0, 0.05


def make_data(n: int, side: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"image": rng.random((n, side, side, 3), dtype=np.float32),
            "label": rng.integers(0, 10, (n,), dtype=np.int32)}


def build_pipeline(data: dict, side: int, batch: int, seed: int = 0) -> Pipeline:
    stages = [RandomCropOperator(RandomCropConfig(size=side, padding=side // 8, pad_mode="reflect"),
                                 rngs=nnx.Rngs(seed)),
              HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(seed + 1)),
              BrightnessOperator(BrightnessConfig(max_delta=MAX_DELTA), rngs=nnx.Rngs(seed + 2)),
              ContrastOperator(ContrastConfig(max_delta=MAX_DELTA), rngs=nnx.Rngs(seed + 3)),
              RotationOperator(RotationConfig(degrees=DEGREES), rngs=nnx.Rngs(seed + 4)),
              GaussianNoiseOperator(GaussianNoiseConfig(sigma=SIGMA), rngs=nnx.Rngs(seed + 5))]
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data=data)
    return Pipeline(source=source, stages=stages, batch_size=batch)


def _before_rotation(image: jax.Array, key: jax.Array):
    side, pad = image.shape[0], image.shape[0] // 8
    k_crop, k_noise, k_rest = jax.random.split(key, 3)
    offsets = jax.random.randint(k_crop, (2,), 0, 2 * pad + 1)
    unit = jax.random.uniform(k_rest, (4,))
    image = geometry.crop(geometry.pad(image, pad, "reflect"), offsets[0], offsets[1], side, side)
    image = jnp.where(unit[0] < 0.5, geometry.hflip(image), image)
    image = color.adjust_brightness(image, 1.0 + MAX_DELTA * (2 * unit[1] - 1))
    image = color.adjust_contrast(image, 1.0 + MAX_DELTA * (2 * unit[2] - 1))
    return image, DEGREES * (2 * unit[3] - 1), k_noise


def _noise(image: jax.Array, key: jax.Array) -> jax.Array:
    return filters.gaussian_noise(image, standard_normal(key, image.shape), SIGMA)


def hand_written_chain(images: jax.Array, keys: jax.Array, token: jax.Array, *, with_noise: bool = True,
                       separate: bool = True) -> jax.Array:
    """The whole chain for a batch, written by hand. With `separate` the rotation is computed on
    its own on CPU, as the `RotationOperator` does (`datarax.core.fusion.separately`)."""
    images, angles, noise_keys = jax.vmap(_before_rotation)(images, keys)
    def rotate(x, a):
        return jax.vmap(geometry.rotate)(x, a)
    rotated = separately(rotate, token, images, angles) if separate else rotate(images, angles)
    return jax.vmap(_noise)(rotated, noise_keys) if with_noise else rotated


def fused_chain_batch(images: jax.Array, keys: jax.Array, epoch: jax.Array) -> jax.Array:
    """The floor's batch function: `hand_written_chain` with the same warp separation as the operators."""
    return hand_written_chain(images, keys, epoch >= 0)


class TorchChain:
    """A map-style dataset applying the chain per element with torch tensor ops (CHW floats)."""

    def __init__(self, data: dict):
        self.images, self.labels = data["image"], data["label"]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        import torch
        import torch.nn.functional as F

        image = torch.from_numpy(self.images[index]).permute(2, 0, 1)
        side, pad = image.shape[-1], image.shape[-1] // 8
        padded = F.pad(image[None], (pad, pad, pad, pad), mode="reflect")[0]
        top, left = torch.randint(0, 2 * pad + 1, (2,)).tolist()
        image = padded[:, top:top + side, left:left + side]
        unit = torch.rand(4)
        if unit[0] < 0.5:
            image = torch.flip(image, dims=(2,))
        image = (image * (1 + MAX_DELTA * (2 * unit[1] - 1))).clamp(0, 1)
        gray = (image * torch.tensor([0.299, 0.587, 0.114])[:, None, None]).sum(0).mean()
        image = (gray + (1 + MAX_DELTA * (2 * unit[2] - 1)) * (image - gray)).clamp(0, 1)
        theta = torch.deg2rad(DEGREES * (2 * unit[3] - 1))
        cos, sin = torch.cos(theta), torch.sin(theta)
        matrix = torch.stack([torch.stack([cos, -sin, torch.zeros(())]), torch.stack([sin, cos, torch.zeros(())])])
        grid = F.affine_grid(matrix[None], [1, 3, side, side], align_corners=False)
        image = F.grid_sample(image[None], grid, mode="bilinear", padding_mode="zeros", align_corners=False)[0]
        image = (image + SIGMA * torch.randn_like(image)).clamp(0, 1)
        return image, int(self.labels[index])


def _selection_before_rotation(images: jax.Array, keys: jax.Array):
    """`_before_rotation` for a batch, its crop and flip as selection matrices on the lane-dense view."""
    pad = images.shape[1] // 8

    def one(key):
        k_crop, k_noise, k_rest = jax.random.split(key, 3)
        return jax.random.randint(k_crop, (2,), 0, 2 * pad + 1), jax.random.uniform(k_rest, (4,)), k_noise

    offsets, unit, noise_keys = jax.vmap(one)(keys)
    images = limits.selection_crop_flip(images, offsets[:, 0], offsets[:, 1], unit[:, 0] < 0.5, pad)
    images = jax.vmap(color.adjust_brightness)(images, 1.0 + MAX_DELTA * (2 * unit[:, 1] - 1))
    images = jax.vmap(color.adjust_contrast)(images, 1.0 + MAX_DELTA * (2 * unit[:, 2] - 1))
    return images, DEGREES * (2 * unit[:, 3] - 1), noise_keys


def limit_candidates(data: dict, seed: int = 0) -> dict:
    """`name -> (per_batch(arrays, idx, epoch), arrays)` computing the floor's exact output."""
    keys = limits.keyed(seed)
    shape = data["image"].shape[1:]
    labels = jax.device_put(data["label"])

    def per_record(arrays, idx, epoch):
        images = fused_chain_batch(jnp.take(arrays["image"], idx, axis=0), keys(idx, epoch), epoch)
        return {"image": images, "label": jnp.take(arrays["label"], idx)}

    def selection(arrays, idx, epoch):
        images = jnp.take(arrays["image"], idx, axis=0).reshape(-1, *shape)
        images, angles, noise_keys = _selection_before_rotation(images, keys(idx, epoch))
        def rotate(x, a):
            return jax.vmap(geometry.rotate)(x, a)
        rotated = separately(rotate, epoch >= 0, images, angles)
        return {"image": jax.vmap(_noise)(rotated, noise_keys), "label": jnp.take(arrays["label"], idx)}

    return {"per-record code": (per_record, {"image": jax.device_put(data["image"]), "label": labels}),
            "selection matrices on lane-dense data": (selection, {"image": jax.device_put(
                data["image"].reshape(len(data["image"]), -1)), "label": labels})}


def check_against_floor(data: dict, batch: int, seed: int = 0):
    idx = np.random.default_rng(seed).permutation(len(data["label"]))[:batch].astype(np.int32)
    keys = limits.keyed(seed)(jnp.asarray(idx), 0)
    want = np.asarray(jax.jit(fused_chain_batch)(jnp.asarray(data["image"][idx]), keys, jnp.int32(0)))

    def check(per_batch, arrays):
        got = np.asarray(jax.jit(per_batch)(arrays, idx, np.int32(0))["image"])
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5,
                                   err_msg="a limit candidate's output is not the floor's")

    return check


def run(options: BenchOptions) -> list[dict]:
    rows = []
    for side, records, batch in SIZES:
        data = make_data(options.records(records), side)
        n = len(data["label"])
        floor = keyed_gather_floor(None, n, batch, batch_fn=fused_chain_batch)
        main = pipeline_vs_floor(f"augment_chain_{side}", lambda: build_pipeline(data, side, batch), data, floor,
                                 options.repeats, batch_size=batch)
        limit = limits.limit_row(main["scenario"], limit_candidates(data), check_against_floor(data, batch), n, batch,
                                 options.repeats)
        limit.update(ratio_to_datarax=round(limit["el_s"] / main["datarax_el_s"], 3),
                     ratio_to_floor=round(limit["el_s"] / main["floor_el_s"], 3))
        main["settings"] = f"{main['datarax_el_s'] / limit['el_s']:.3f}x the limit row"
        rows += [main, limit]
    return rows
