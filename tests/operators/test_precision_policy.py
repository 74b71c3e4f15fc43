"""The precision policy (`datarax.operators.precision`) against float64, on a TPU's terms.

Every product the operators compute is checked on its own: against a float64 product of the same
operands its error stays within its kind's bound (a fraction of `sum_k |a_k * b_k|`), and at the
next cheaper precision it does not. The image operations are also checked whole against float64
numpy references (two passes of a weighted sum: within twice the bound of the largest input
magnitude). The sweep covers sizes, boxes, dtypes and value ranges.

A CPU computes float32 products in float32 whatever they declare, so there the TPU's passes are
emulated: each float32 operand is split into bfloat16 parts as XLA:TPU splits it (one part at
DEFAULT, two at HIGH, three at HIGHEST) and the products of the parts a precision takes are summed
in float32. On a TPU (the TPU test command, docs/tpu.md) the chip computes them. Either way the
policy is traced as on a TPU (`tuned`), and float64 references run on the host (`tests/on_cpu.py`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from on_cpu import float64_on_cpu

from datarax.operators import precision
from datarax.operators.audio.functional import mel
from datarax.operators.image.functional import batched, color, filters, geometry
from datarax.operators.lowering import rewritten, select_slice
from datarax.operators.precision import BFLOAT16_BOUND, COORDINATES, SELECTION, WEIGHTED_SUM, Contraction

P = jax.lax.Precision
# The bfloat16 parts (high, middle, low) each precision multiplies, as XLA:TPU's passes do.
PASSES = {P.DEFAULT: ((0, 0),), P.HIGH: ((0, 0), (0, 1), (1, 0)),
          P.HIGHEST: ((0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0))}
CHEAPER = {P.HIGHEST: P.HIGH, P.HIGH: P.DEFAULT}
ON_CHIP = jax.default_backend() == "tpu"


@pytest.fixture(autouse=True)
def tuned(monkeypatch):
    """The policy as a TPU takes it, whatever the backend."""
    monkeypatch.setattr(precision, "TUNED_BACKENDS", (jax.default_backend(),))


def bfloat16_parts(x: jax.Array, n: int) -> list[jax.Array]:
    """`x` as `n` bfloat16 values (in float32) whose sum approaches it, largest first."""
    parts, rest = [], x.astype(jnp.float32)
    for _ in range(n):
        part = rest.astype(jnp.bfloat16).astype(jnp.float32)
        parts.append(part)
        rest = rest - part
    return parts


def declared(eqn) -> P:
    given = eqn.params["precision"]
    given = given if isinstance(given, tuple) else (given, given)
    return max((p or P.DEFAULT for p in given), key=list(PASSES).index)


def product(eqn, lhs: jax.Array, rhs: jax.Array, at: P) -> jax.Array:
    """One `dot_general` at precision `at` as a TPU computes it: the chip itself, or its passes."""
    dims, out_dtype = eqn.params["dimension_numbers"], eqn.outvars[0].aval.dtype
    if ON_CHIP:
        return jax.lax.dot_general(lhs, rhs, dims, precision=at, preferred_element_type=out_dtype)
    a, b = bfloat16_parts(lhs, 3), bfloat16_parts(rhs, 3)
    passes = [jax.lax.dot_general(a[i], b[j], dims, preferred_element_type=jnp.float32) for i, j in PASSES[at]]
    return sum(passes[1:], passes[0]).astype(out_dtype)


@dataclasses.dataclass
class Products:
    """An operation's output and each product it computed: `(lhs, rhs, result, dimension_numbers)`."""

    out: np.ndarray
    products: list[tuple]
    precisions: list[P]

    def worst(self) -> float:
        """The largest error of a product against float64, as a fraction of its `sum_k |a_k * b_k|`."""
        worst = 0.0
        with float64_on_cpu():
            for lhs, rhs, got, dims in self.products:
                a, b = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
                want = np.asarray(jax.lax.dot_general(a, b, dims))
                scale = np.asarray(jax.lax.dot_general(np.abs(a), np.abs(b), dims))
                error = np.abs(np.asarray(got, np.float64) - want)
                worst = max(worst, float(np.max(np.where(scale > 0, error / np.where(scale > 0, scale, 1),
                                                         np.where(error > 0, np.inf, 0.0)), initial=0.0)))
        return worst


def as_on_tpu(fn: Callable, *args, at: P | None = None) -> Products:
    """`fn(*args)` with every product as a TPU computes it, at its declared precision or `at`."""
    dims, precisions = [], []

    def traced(*args):
        seen = []

        def rule(eqn, invals):
            if eqn.primitive is not jax.lax.dot_general_p:
                return None
            precisions.append(at or declared(eqn))
            dims.append(eqn.params["dimension_numbers"])
            seen.append((*invals, product(eqn, *invals, precisions[-1])))
            return [seen[-1][-1]]

        return rewritten(fn, rule)(*args), seen

    out, seen = jax.jit(traced)(*args)  # a fresh function: traced anew, so `dims` is filled each call
    assert seen, "the operation computed no product"
    return Products(np.asarray(out, np.float64), [(*s, d) for s, d in zip(seen, dims)], precisions)


def np_weights(out_size: int, in_size: int, scale: float, start: float, antialias: bool = True) -> np.ndarray:
    """`geometry.resample_weights` in float64 numpy: PIL's bilinear filter over `[start, start + out/scale]`."""
    centers = start + (np.arange(out_size) + 0.5) / scale - 0.5
    width = max(1.0 / scale, 1.0) if antialias else 1.0
    weights = np.maximum(0.0, 1.0 - np.abs(np.arange(in_size)[None, :] - centers[:, None]) / width)
    total = weights.sum(1, keepdims=True)
    return weights / np.where(total > 0, total, 1.0)


def np_resized_crop(x, boxes, size):
    return np.stack([np.einsum("ah,hwc,bw->abc", np_weights(size[0], im.shape[0], size[0] / h, top),
                               im, np_weights(size[1], im.shape[1], size[1] / w, left), optimize=True)
                     for im, (top, left, h, w) in zip(x, boxes)])


def np_taps(positions: np.ndarray, size: int) -> np.ndarray:
    """Bilinear weights of `positions` on the taps `0 .. size - 1` (taps outside the axis left out)."""
    low = np.floor(positions)
    frac = (positions - low)[..., None]
    taps = np.arange(size)
    return np.where(taps == low[..., None], 1 - frac, 0.0) + np.where(taps == low[..., None] + 1, frac, 0.0)


def np_shift(x, dx, dy, fill):
    out = []
    for im, sx, sy in zip(x, dx, dy):
        rows = np_taps(np.arange(im.shape[0]) - sy, im.shape[0])
        cols = np_taps(np.arange(im.shape[1]) - sx, im.shape[1])
        kept = rows.sum(1)[:, None] * cols.sum(1)[None, :]
        out.append(np.einsum("ah,hwc,bw->abc", rows, im, cols, optimize=True) + (fill * (1 - kept))[..., None])
    return np.stack(out)


def np_blur(x, sigma, radius):
    offsets = np.arange(-radius, radius + 1)
    kernel = np.exp(-0.5 * (offsets / sigma) ** 2)
    kernel /= kernel.sum()
    padded = np.pad(x, ((0, 0), (radius, radius), (radius, radius), (0, 0)), mode="symmetric")
    size_h, size_w = x.shape[1:3]
    tall = sum(k * padded[:, i:i + size_h] for i, k in enumerate(kernel))
    return sum(k * tall[:, :, i:i + size_w] for i, k in enumerate(kernel))


def np_crop(x, top, left, size, pad):
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect")
    return np.stack([p[t:t + size[0], lf:lf + size[1]] for p, t, lf in zip(padded, top, left)])


# Value ranges of float inputs: images in [0, 1], levels in [0, 255], normalised images.
RANGES = {"unit": (0.0, 1.0), "levels": (0.0, 255.0), "normalised": (-2.1, 2.6)}


def floats(rng, shape, dtype, value_range):
    low, high = RANGES[value_range]
    return jnp.asarray(low + (high - low) * rng.random(shape), dtype)


@dataclasses.dataclass(frozen=True)
class Case:
    """An operation, the kind of its products, its inputs and (for images) a float64 numpy reference.

    `make(rng, dtype, value_range)` gives `(args, reference_args)`; `reference(*reference_args)` is
    the whole operation in float64, `passes` the weighted sums chained in it. `small` marks
    contractions over a few terms (2 or 3, and the blur's 9 taps), which XLA:TPU computes off the
    matrix unit, where the declared precision changes nothing (on the v5e the blur came out within
    2e-7 at DEFAULT).
    """

    name: str
    kind: Contraction
    fn: Callable
    make: Callable
    reference: Callable | None = None
    passes: int = 1
    small: bool = False


def crop_case(rng, dtype, value_range):
    x = floats(rng, (3, 12, 10, 3), dtype, value_range)
    top, left = rng.integers(0, 10, 3), rng.integers(0, 9, 3)
    return (x, jnp.asarray(top), jnp.asarray(left)), (np.asarray(x, np.float64), top, left)


def flip_case(rng, dtype, value_range):
    x = floats(rng, (4, 6, 7, 3), dtype, value_range)
    flags = np.array([True, False, True, True])
    return (x, jnp.asarray(flags)), (np.asarray(x, np.float64), flags)


def slice_case(rng, dtype, value_range):
    if jnp.issubdtype(dtype, jnp.integer):
        info = np.iinfo(dtype)
        x = jnp.asarray(rng.integers(info.min, int(info.max) + 1, (4, 20, 18, 3)), dtype)
    else:
        x = floats(rng, (4, 20, 18, 3), dtype, value_range)
    starts = jnp.asarray(rng.integers(0, 6, (4, 2)), jnp.int32)
    return (x, starts), (np.asarray(x, np.float64), np.asarray(starts))


def resized_crop_case(shape, size):
    def make(rng, dtype, value_range):
        height, width = shape[:2]
        area = rng.uniform(0.08, 1.0, 3) * height * width
        ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3), 3))
        box_h, box_w = np.minimum(np.sqrt(area / ratio), height), np.minimum(np.sqrt(area * ratio), width)
        boxes = np.stack([rng.random(3) * (height - box_h), rng.random(3) * (width - box_w), box_h, box_w], 1)
        boxes = np.concatenate([boxes, [[0.0, 0.0, height, width]]]).astype(np.float32)  # and the whole image
        x = floats(rng, (4, *shape), dtype, value_range)
        return (x, jnp.asarray(boxes)), (np.asarray(x, np.float64), boxes.astype(np.float64))
    return make


def images_case(shape):
    def make(rng, dtype, value_range):
        x = floats(rng, shape, dtype, value_range)
        return (x,), (np.asarray(x, np.float64),)
    return make


def shift_case(rng, dtype, value_range):
    x = floats(rng, (4, 11, 13, 3), dtype, value_range)
    dx, dy = rng.uniform(-6, 6, 4).astype(np.float32), rng.uniform(-5, 5, 4).astype(np.float32)
    return (x, jnp.asarray(dx), jnp.asarray(dy)), (np.asarray(x, np.float64), dx, dy)


def warp_case(rng, dtype, value_range):
    x = floats(rng, (3, 16, 16, 3), dtype, value_range)
    inverse = jax.vmap(lambda a: geometry.affine_matrix(a, (7.5, 7.5), scale=1.1))(jnp.asarray([-20.0, 5.0, 33.0]))
    return (x, inverse), None


def waveform_case(rng, dtype, value_range):
    low, high = RANGES[value_range]
    return (jnp.asarray(rng.standard_normal((2, 4000)) * (high - low) / 4, dtype),), None


def affine_case(rng, dtype, value_range):
    angles, shears = rng.uniform(-180, 180, 6), rng.uniform(-40, 40, 6)
    shifts = rng.uniform(-100, 100, (6, 2))
    return tuple(jnp.asarray(v, jnp.float32) for v in (angles, shears, shifts)), None


RRC_SIZE = (224, 224)
SMALL_SIZE = (6, 7)
CASES = [
    Case("crop", SELECTION, lambda x, t, lf: batched.crop(x, t, lf, 9, 8, padding=3, mode="reflect"), crop_case,
         lambda x, t, lf: np_crop(x, t, lf, (9, 8), 3)),
    Case("flip", SELECTION, lambda x, f: batched.flip(x, f, axis=2), flip_case,
         lambda x, f: np.where(f[:, None, None, None], x[:, :, ::-1], x)),
    Case("user slice", SELECTION, jax.vmap(lambda x, s: select_slice(x, [s[0], s[1], 0], (14, 12, 3))), slice_case,
         lambda x, s: np.stack([im[a:a + 14, b:b + 12] for im, (a, b) in zip(x, s)])),
    Case("resized crop 256 to 224", WEIGHTED_SUM, jax.vmap(lambda x, b: geometry.resized_crop(x, b, *RRC_SIZE)),
         resized_crop_case((256, 256, 3), RRC_SIZE), lambda x, b: np_resized_crop(x, b, RRC_SIZE), passes=2),
    Case("resized crop 256 to 224, batched", WEIGHTED_SUM, lambda x, b: batched.resized_crop(x, b, *RRC_SIZE),
         resized_crop_case((256, 256, 3), RRC_SIZE), lambda x, b: np_resized_crop(x, b, RRC_SIZE), passes=2),
    Case("resized crop 9x12 to 6x7, batched", WEIGHTED_SUM, lambda x, b: batched.resized_crop(x, b, *SMALL_SIZE),
         resized_crop_case((9, 12, 2), SMALL_SIZE), lambda x, b: np_resized_crop(x, b, SMALL_SIZE), passes=2),
    Case("resize 40x56 to 24x20", WEIGHTED_SUM, jax.vmap(lambda x: geometry.resize(x, 24, 20)),
         images_case((3, 40, 56, 3)), lambda x: np_resized_crop(x, [(0, 0, 40, 56)] * len(x), (24, 20)), passes=2),
    Case("resize 40x56 to 64x200, batched", WEIGHTED_SUM, lambda x: batched.resize(x, 64, 200),
         images_case((3, 40, 56, 3)), lambda x: np_resized_crop(x, [(0, 0, 40, 56)] * len(x), (64, 200)), passes=2),
    Case("shift", WEIGHTED_SUM, lambda x, dx, dy: batched.translate(x, dx, dy, 0.25), shift_case,
         lambda x, dx, dy: np_shift(x, dx, dy, 0.25), passes=2),
    Case("warp", WEIGHTED_SUM, lambda x, inverse: batched.warp_affine(x, inverse, 0.5), warp_case),
    Case("blur", WEIGHTED_SUM, jax.vmap(lambda x: filters.gaussian_blur(x, 1.7, 4)), images_case((3, 15, 17, 3)),
         lambda x: np_blur(x, 1.7, 4), passes=2, small=True),
    Case("luma", WEIGHTED_SUM, color.rgb_to_grayscale, images_case((3, 8, 9, 3)),
         lambda x: (x @ np.asarray(color.LUMA_WEIGHTS))[..., None], small=True),
    Case("mel filterbank", WEIGHTED_SUM, lambda w: mel.mel_spectrogram(w, 16000, 256, 64, 40), waveform_case),
    Case("mfcc", WEIGHTED_SUM, lambda w: mel.mfcc(w, 16000, 13, 256, 64, 40), waveform_case),
    Case("affine matrix", COORDINATES, jax.vmap(lambda a, s, t: geometry.affine_matrix(
        a, (127.5, 95.5), scale=1.2, shear=s, translate=(t[0], t[1]))), affine_case, small=True),
]
# float32 in each value range, bfloat16 images in [0, 1]; integers for the user slice.
SWEEP = [(jnp.float32, "unit"), (jnp.float32, "levels"), (jnp.float32, "normalised"), (jnp.bfloat16, "unit")]
PARAMS = [pytest.param(case, dtype, value_range, id=f"{case.name}-{jnp.dtype(dtype).name}-{value_range}")
          for case in CASES for dtype, value_range in SWEEP
          if not (case.kind is COORDINATES and (dtype, value_range) != (jnp.float32, "unit"))
          and not (case.make is waveform_case and dtype == jnp.bfloat16)]  # audio is float32
PARAMS += [pytest.param(CASES[2], dtype, "unit", id=f"user slice-{jnp.dtype(dtype).name}")
           for dtype in (jnp.uint8, jnp.int16)]


def bound_for(case: Case, dtype) -> float:
    return BFLOAT16_BOUND if jnp.dtype(dtype) == jnp.bfloat16 and case.kind.bound else case.kind.bound


@pytest.mark.parametrize("case, dtype, value_range", PARAMS)
def test_each_product_meets_its_bound_and_the_cheaper_precision_does_not(case, dtype, value_range):
    args, reference_args = case.make(np.random.default_rng(7), dtype, value_range)
    run = as_on_tpu(case.fn, *args)
    assert run.worst() <= bound_for(case, dtype), f"{case.name}: {run.worst():.3g} at {set(run.precisions)}"
    if reference_args is not None:
        want = case.reference(*reference_args)
        largest = np.max(np.abs(reference_args[0]))
        error = np.max(np.abs(run.out - want)) / largest
        if case.kind.bound == 0 or jnp.issubdtype(dtype, jnp.integer):
            assert error == 0, f"{case.name}: a selection is off by {error:.3g}"
        elif jnp.dtype(dtype) == jnp.bfloat16:
            # Each pass rounds its weights and its result to bfloat16 (within 2**-8 each).
            assert error <= case.passes * 2 * 2.0**-8, f"{case.name}: {error:.3g} of the largest input"
        else:
            assert error <= case.passes * case.kind.bound, f"{case.name}: {error:.3g} of the largest input"
    chosen = set(run.precisions)
    assert len(chosen) == 1, f"{case.name} declares several precisions: {chosen}"
    cheaper = CHEAPER.get(chosen.pop())
    if cheaper is None or (ON_CHIP and case.small):
        return  # DEFAULT is the cheapest there is
    cheap = as_on_tpu(case.fn, *args, at=cheaper)
    assert cheap.worst() > bound_for(case, dtype), f"{case.name} meets its bound at {cheaper} too"
    if reference_args is not None and case.kind.bound:
        error = np.max(np.abs(cheap.out - case.reference(*reference_args))) / np.max(np.abs(reference_args[0]))
        assert error > case.passes * case.kind.bound, f"{case.name} meets its bound at {cheaper} too"


@pytest.mark.parametrize("dtype, expected", [
    (jnp.float32, (P.HIGHEST, P.HIGH, P.HIGHEST)), (jnp.bfloat16, (P.DEFAULT, P.DEFAULT, P.DEFAULT)),
    (jnp.uint8, (P.DEFAULT, None, None)), (jnp.int8, (P.DEFAULT, None, None)), (jnp.int16, (P.HIGH, None, None)),
    (jnp.uint16, (P.HIGH, None, None)), (jnp.float64, (P.HIGHEST, P.HIGHEST, P.HIGHEST)),
])
def test_the_precision_each_kind_declares_on_a_tpu(dtype, expected):
    for kind, want in zip((SELECTION, WEIGHTED_SUM, COORDINATES), expected):
        if want is not None:
            assert precision.precision_for(kind, dtype) == want, (kind.name, dtype)


def test_other_backends_keep_highest_except_where_one_pass_is_exact(monkeypatch):
    monkeypatch.setattr(precision, "TUNED_BACKENDS", ())
    assert precision.precision_for(WEIGHTED_SUM, jnp.float32) == P.HIGHEST
    assert precision.precision_for(SELECTION, jnp.int16) == P.HIGHEST
    assert precision.precision_for(SELECTION, jnp.uint8) == P.DEFAULT
    assert precision.precision_for(WEIGHTED_SUM, jnp.bfloat16) == P.DEFAULT
