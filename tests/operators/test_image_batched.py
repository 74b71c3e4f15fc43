"""The batch formulations a TPU runs (`functional/batched.py`) against numpy and the per-record maths.

Index maps are swept against `numpy.pad` for every mode, axis size and pad width (wider than the
axis included); crops and flips must equal the per-record maths exactly (one-hot products) in
float32 and bfloat16; shifts, warps, resized crops and resizes (in both of `separable`'s layouts)
agree to float rounding, and so do the gradients through them. A
pipeline run with the batch formulations gives the per-record batches, and its program holds no
gather beyond the source's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators import ToFloatConfig, ToFloatOperator
from datarax.operators.image import (
    AffineConfig,
    AffineOperator,
    CutoutConfig,
    CutoutOperator,
    HorizontalFlipConfig,
    HorizontalFlipOperator,
    NormalizeConfig,
    NormalizeOperator,
    RandomCropConfig,
    RandomCropOperator,
    RandomResizedCropConfig,
    RandomResizedCropOperator,
    ResizeConfig,
    ResizeOperator,
    RotationConfig,
    RotationOperator,
    TranslateConfig,
    TranslateOperator,
    VerticalFlipConfig,
    VerticalFlipOperator,
)
from datarax.operators.image.functional import batched, geometry
from datarax.operators.precision import WEIGHTED_SUM
from datarax.sources import MemorySource, MemorySourceConfig

MODES = ("constant", "edge", "reflect", "symmetric")
ON_CPU = jax.default_backend() == "cpu"
# Resampling agrees to float rounding on a CPU; on a TPU its products are weighted sums at the
# precision policy's bound (datarax.operators.precision), two passes of it on images in [0, 1],
# and gradients through them as far.
ATOL = 2e-6 if ON_CPU else 2e-6 + 2 * WEIGHTED_SUM.bound
GRAD_TOL = 1e-4 if ON_CPU else 1e-3


def coordinate_atol(shape) -> float:
    """ATOL where two formulations compute a sample's coordinates (up to the image's size) apart.

    A coordinate rounded differently by up to two float32 spacings at that size moves a bilinear
    sample by as much times the image's steepest step, 1 for noise in [0, 1]: 1.5e-5 at 64 pixels.
    (XLA's optimisation level alone moves the 64x64 crop's samples by 5e-6, tests/xla_flags.py.)
    """
    return ATOL + 2 * float(np.spacing(np.float32(max(shape[:2]))))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", [1, 2, 3, 6])
@pytest.mark.parametrize("pad", [0, 1, 5, 13])
def test_pad_index_is_numpy_pad_of_the_positions(mode, size, pad):
    kwargs = {"constant_values": -1} if mode == "constant" else {}
    want = np.pad(np.arange(size), pad, mode=mode, **kwargs)
    got = np.asarray(batched.pad_index(jnp.arange(-pad, size + pad), size, mode))
    np.testing.assert_array_equal(got, want)


def per_record_crop(x, top, left, height, width, padding, mode, fill):
    return jax.vmap(lambda im, t, lf: geometry.crop(geometry.pad(im, padding, mode, fill), t, lf, height, width))(
        x, top, left)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape, out, padding", [((7, 9, 3), (7, 9), 2), ((8, 5, 1), (6, 3), 0),
                                                 ((6, 6, 2), (9, 4), 4)])
def test_crop_equals_the_per_record_pad_and_slice_exactly(dtype, mode, shape, out, padding):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.random((5, *shape)), dtype)
    room = (shape[0] + 2 * padding - out[0], shape[1] + 2 * padding - out[1])
    top = jnp.asarray(rng.integers(0, room[0] + 1, 5), jnp.int32)
    left = jnp.asarray(rng.integers(0, room[1] + 1, 5), jnp.int32)
    want = per_record_crop(x, top, left, *out, padding, mode, 0.25)
    got = jax.jit(batched.crop, static_argnums=(3, 4, 5, 6, 7))(x, top, left, *out, padding, mode, 0.25)
    assert got.dtype == dtype
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("axis", [1, 2])
def test_flip_equals_reversal_exactly(axis):
    x = jnp.asarray(np.random.default_rng(1).random((6, 5, 7, 3)), jnp.float32)
    flags = jnp.asarray([True, False, True, True, False, False])
    got = np.asarray(batched.flip(x, flags, axis))
    want = np.where(np.asarray(flags)[:, None, None, None], np.flip(np.asarray(x), axis), np.asarray(x))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fill", [0.0, 0.75])
def test_translate_agrees_with_the_per_record_warp(fill):
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.random((6, 9, 11, 2)), jnp.float32)
    dx = jnp.asarray([0.0, 2.0, -3.25, 10.5, -0.6, 4.999], jnp.float32)
    dy = jnp.asarray([0.0, -1.0, 2.5, 0.2, -8.75, 3.0], jnp.float32)
    # Each side jitted, as a pipeline runs it (op by op, each primitive would compile on its own:
    # 173 compiles for this test, a few seconds of them on a TPU).
    def per_record(d):
        return jax.vmap(lambda im, a, b: geometry.translate(im, a, b, fill))(x, d, dy)

    def many(d):
        return batched.translate(x, d, dy, fill)

    np.testing.assert_allclose(np.asarray(jax.jit(many)(dx)), np.asarray(jax.jit(per_record)(dx)), atol=ATOL)
    grad = jax.jit(jax.grad(lambda d, f: jnp.sum(f(d) ** 2), argnums=0), static_argnums=1)
    tol = 1e-5 if ON_CPU else GRAD_TOL
    np.testing.assert_allclose(np.asarray(grad(dx, many)), np.asarray(grad(dx, per_record)), rtol=tol, atol=tol)


def stages():
    return [ToFloatOperator(ToFloatConfig(field="image")),
            RandomCropOperator(RandomCropConfig(size=12, padding=3, pad_mode="reflect"), rngs=nnx.Rngs(0)),
            HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(1)),
            VerticalFlipOperator(VerticalFlipConfig(p=0.3), rngs=nnx.Rngs(2)),
            RandomCropOperator(RandomCropConfig(size=(10, 8), padding=1, fill=0.5), rngs=nnx.Rngs(3)),
            CutoutOperator(CutoutConfig(size=0.3), rngs=nnx.Rngs(4)),
            NormalizeOperator(NormalizeConfig(mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3)))]


def build(extra=()):
    data = {"image": np.random.default_rng(3).integers(0, 256, (45, 12, 12, 3), dtype=np.uint8),
            "label": np.arange(45, dtype=np.int32)}
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=1), data=data)
    return Pipeline(source, [*stages(), *extra], batch_size=16)


def gathers(pipeline: Pipeline) -> list[str]:
    compiled = pipeline.compiled
    batch, ids = pipeline.input_spec()
    meta = jax.ShapeDtypeStruct((3,), jnp.int32)
    text = jax.jit(compiled.run).lower(compiled.values(), batch, ids, meta).as_text()
    return [line for line in text.splitlines() if "gather" in line or "dynamic_slice" in line]


def test_a_pipeline_gives_the_same_batches_in_both_formulations(use_formulation):
    use_formulation("per_record")
    want = [jax.device_get(b) for b in build().epochs(2)]
    assert gathers(build())  # the per-record crops slice per record
    use_formulation("batched")
    pipeline = build()
    assert gathers(pipeline) == []
    got = [jax.device_get(b) for b in pipeline.epochs(2)]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g["label"], w["label"])
        np.testing.assert_allclose(g["image"], w["image"], rtol=0, atol=1e-6)  # Normalize's rounding order


def test_gradients_through_a_learnable_shift_agree(use_formulation):
    use_formulation("per_record")
    x = jnp.asarray(np.random.default_rng(4).random((8, 10, 10, 3)), jnp.float32)

    def grads():
        op = TranslateOperator(TranslateConfig(translate=0.2, learnable=True), rngs=nnx.Rngs(7))

        def loss(op):
            return jnp.sum(op(Element({"image": x}), BatchContext.for_batch(8)).data["image"] ** 2)

        return jax.tree.leaves(nnx.jit(nnx.grad(loss))(op))  # jitted, as a training step runs it

    want = grads()
    use_formulation("batched")
    for g, w in zip(grads(), want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=GRAD_TOL)


# Every shape with a fill the output can show, and the zero fill once (the fill is a constant of the
# same program, not another code path: each pair compiles four programs of its own).
@pytest.mark.parametrize("shape, fill", [((8, 8, 1), 0.75), ((9, 11, 2), 0.0), ((9, 11, 2), 0.75),
                                         ((32, 32, 3), 0.75)])
def test_warp_agrees_with_the_per_record_warp(shape, fill):
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.random((6, *shape)), jnp.float32)
    center = geometry.image_center(x[0])
    angle = jnp.asarray([0.0, 90.0, -33.3, 12.0, 179.0, -7.5], jnp.float32)
    scale = jnp.asarray([1.0, 0.9, 1.3, 1.05, 0.5, 1.0], jnp.float32)

    def inverse(a, s):
        return geometry.affine_matrix(a, center, scale=s, shear=6.0, translate=(0.7, -2.2))

    def per_record(a):
        return jax.vmap(lambda im, a, s: geometry.warp_affine(im, inverse(a, s), fill))(x, a, scale)

    def many(a):
        return batched.warp_affine(x, jax.vmap(inverse)(a, scale), fill)

    assert batched.warps_in_batch(shape)
    np.testing.assert_allclose(np.asarray(jax.jit(many)(angle)), np.asarray(jax.jit(per_record)(angle)), atol=ATOL)
    grad = jax.jit(jax.grad(lambda a, f: jnp.sum(f(a) ** 2), argnums=0), static_argnums=1)  # each side jitted
    np.testing.assert_allclose(np.asarray(grad(angle, many)), np.asarray(grad(angle, per_record)), rtol=GRAD_TOL,
                               atol=GRAD_TOL)


def test_images_too_large_for_the_warp_products_keep_the_gather():
    assert not batched.warps_in_batch((64, 64, 3))
    x = jnp.asarray(np.random.default_rng(6).random((2, 64, 64, 3)), jnp.float32)
    op = RotationOperator(RotationConfig(degrees=20.0), rngs=nnx.Rngs(0))
    params = {"angle": jnp.asarray([5.0, -12.0], jnp.float32)}
    np.testing.assert_array_equal(np.asarray(op.apply_many(x, params)), np.asarray(jax.vmap(op.apply)(x, params)))


# `separable`'s two layouts, forced: channels interleaved on the lanes, or side by side; and the
# per-record products under `vmap` that a TPU runs for large images.
LAYOUTS = {"interleaved": 1 << 62, "planar": 0, "per-record": 0}


def test_large_images_resample_per_record_on_a_tpu_only():
    assert batched.resamples_per_record((128, 256, 256, 3), 224, 224, backend="tpu")
    assert not batched.resamples_per_record((128, 256, 256, 3), 224, 224, backend="cpu")
    assert not batched.resamples_per_record((128, 40, 40, 3), 32, 32, backend="tpu")  # interleaved stays


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape, size", [((9, 12, 2), (6, 7)), ((40, 32, 3), (24, 48)), ((64, 64, 3), (56, 56))])
def test_resized_crop_and_resize_agree_with_the_per_record_maths(shape, size, layout, monkeypatch):
    monkeypatch.setattr(batched, "MAX_INTERLEAVED_COLUMNS", LAYOUTS[layout])
    chosen = batched.resamples_per_record
    monkeypatch.setattr(batched, "resamples_per_record",
                        lambda *args: chosen(*args, backend="tpu" if layout == "per-record" else "cpu"))
    x = jnp.asarray(np.random.default_rng(10).random((6, *shape)), jnp.float32)
    op = RandomResizedCropOperator(RandomResizedCropConfig(size=size), rngs=nnx.Rngs(3))
    boxes = op.draw_batch(BatchContext.for_batch(6), shape)["box"]
    boxes = boxes.at[0].set(jnp.asarray([0.0, 0.0, shape[0], shape[1]]))  # the whole image too

    def per_record(b):
        return jax.vmap(lambda im, box: geometry.resized_crop(im, box, *size))(x, b)

    def many(b):
        return batched.resized_crop(x, b, *size)

    np.testing.assert_allclose(np.asarray(jax.jit(many)(boxes)), np.asarray(jax.jit(per_record)(boxes)),
                               atol=coordinate_atol(shape))
    grad = jax.jit(jax.grad(lambda b, f: jnp.sum(f(b) ** 2), argnums=0), static_argnums=1)  # each side jitted
    np.testing.assert_allclose(np.asarray(grad(boxes, many)), np.asarray(grad(boxes, per_record)), rtol=GRAD_TOL,
                               atol=GRAD_TOL)
    resized = jax.jit(lambda x: batched.resize(x, *size))(x)
    np.testing.assert_allclose(np.asarray(resized), np.asarray(jax.vmap(lambda im: geometry.resize(im, *size))(x)),
                               atol=coordinate_atol(shape))  # jax 0.10.0 puts 64x64's 4.3e-6 apart


@pytest.mark.parametrize("make", [
    lambda: RandomResizedCropOperator(RandomResizedCropConfig(size=(7, 9), learnable=True), rngs=nnx.Rngs(8)),
    lambda: ResizeOperator(ResizeConfig(size=(5, 16))),
    lambda: RotationOperator(RotationConfig(degrees=25.0), rngs=nnx.Rngs(8)),
    lambda: AffineOperator(AffineConfig(degrees=12.0, translate=0.1, scale=0.1, shear=8.0, fill=0.25),
                           rngs=nnx.Rngs(8)),
    lambda: AffineOperator(AffineConfig(degrees=10.0, translate=0.1, scale=0.2, shear=5.0, learnable=True),
                           rngs=nnx.Rngs(8)),
])
def test_resampling_operators_agree_in_both_formulations_and_their_gradients_too(make, use_formulation):
    use_formulation("per_record")
    x = jnp.asarray(np.random.default_rng(9).random((8, 12, 10, 3)), jnp.float32)

    def run():
        op = make()

        def loss(op):
            return jnp.sum(op(Element({"image": x}), BatchContext.for_batch(8)).data["image"] ** 2)

        # jitted, as a pipeline and a training step run them (op by op, each primitive compiles alone)
        out = nnx.jit(lambda op: op(Element({"image": x}), BatchContext.for_batch(8)).data["image"])(op)
        return out, jax.tree.leaves(nnx.jit(nnx.grad(loss))(op))

    want, want_grads = run()
    use_formulation("batched")
    got, got_grads = run()
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=ATOL)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=GRAD_TOL, atol=GRAD_TOL)
