"""Batch formulations of the geometry maths, for accelerators: selection and interpolation matrices.

Every function takes a batch `(B, H, W, C)` and per-record parameters with a leading `B`, and
computes `out[b] = rows[b] @ image[b] @ cols[b].T` per channel, at the precision
`datarax.operators.precision` sets for a selection (crops, flips) or a weighted sum (resampling,
shifts, warps); see docs/operators.md, "Definitions".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from datarax.operators.image.functional import geometry
from datarax.operators.image.functional.geometry import PAD_MODES
from datarax.operators.precision import SELECTION, WEIGHTED_SUM, Contraction, precision_for


def pad_index(positions: jax.Array, size: int, mode: str) -> jax.Array:
    """The source index that position `p` of an axis of `size`, padded as `numpy.pad(mode=...)`,
    reads (`p` counted from the unpadded start, so `p < 0` is in the padding); -1 for a constant pad.

    Reflect and symmetric padding repeat with periods `2 (size - 1)` and `2 size`, as numpy's
    do for pads wider than the axis.
    """
    if mode not in PAD_MODES:
        raise ValueError(f"mode must be one of {PAD_MODES}, got {mode!r}")
    if mode == "constant":
        return jnp.where((positions >= 0) & (positions < size), positions, -1)
    if mode == "edge" or size == 1:
        return jnp.clip(positions, 0, size - 1)
    if mode == "reflect":
        period = 2 * (size - 1)
        folded = jnp.mod(positions, period)
        return jnp.where(folded < size, folded, period - folded)
    period = 2 * size
    folded = jnp.mod(positions, period)
    return jnp.where(folded < size, folded, period - 1 - folded)


def one_hot_rows(index: jax.Array, size: int, dtype) -> jax.Array:
    """`(..., size)` rows selecting `index` (an all-zero row where `index` is -1)."""
    return (index[..., None] == jnp.arange(size)).astype(dtype)


def tap_weights(positions: jax.Array, size: int, dtype) -> jax.Array:
    """`(..., size)` bilinear weights of float `positions` on the taps `0 .. size - 1`; taps outside
    the axis are left out (their weight is what a fill value gets).

    Written as `geometry.sample_bilinear` weighs its two taps (`floor(p)` gets `1 - frac`, the next
    `frac`), so the gradient at a whole-pixel position is the same one-sided slope.
    """
    low = jnp.floor(positions)
    frac = (positions - low)[..., None]
    taps = jnp.arange(size, dtype=positions.dtype)
    below = taps == low[..., None]
    above = taps == (low + 1)[..., None]
    return (jnp.where(below, 1 - frac, 0.0) + jnp.where(above, frac, 0.0)).astype(dtype)


# Elements of the `(W * C, W_out * C)` column matrix up to which `separable` keeps the channels
# interleaved (32 x 32 x 3: 9,216); past it (224 x 224 x 3: 516,096, 2 MB a record in float32,
# three times the products the column pass needs) it lays each row's channels side by side.
MAX_INTERLEAVED_COLUMNS = 1 << 17


def separable(images: jax.Array, rows: jax.Array, cols: jax.Array, kind: Contraction) -> jax.Array:
    """`rows[b] @ images[b] @ cols[b].T` for every channel, as two products of `kind`.

    `rows` is `(B, H_out, H)` or one `(H_out, H)` for the whole batch, `cols` likewise. Small
    images stay interleaved, `(B, H, W * C)`, and the column matrix is repeated on each channel's
    lanes; larger ones go through `separable_planar`.
    """
    batch, height, width, channels = images.shape
    out_h, out_w = rows.shape[-2], cols.shape[-2]
    if width * channels * out_w * channels > MAX_INTERLEAVED_COLUMNS:
        return separable_planar(images, rows, cols, kind)
    rows, cols = (jnp.broadcast_to(m, (batch, *m.shape[-2:])) for m in (rows, cols))
    precision = precision_for(kind, images.dtype)
    lanes = images.reshape(batch, height, width * channels)
    picked = jnp.einsum("bij,bjk->bik", rows.astype(images.dtype), lanes, precision=precision)
    # The column matrix for the interleaved channels: cols[b].T repeated on each channel's lanes
    # (a product by 1 or 0, exact, so written as one rather than as a contraction).
    eye = jnp.eye(channels, dtype=images.dtype)
    per_lane = jnp.swapaxes(cols.astype(images.dtype), 1, 2)[:, :, None, :, None] * eye[None, None, :, None, :]
    per_lane = per_lane.reshape(batch, width * channels, out_w * channels)
    out = jnp.einsum("bik,bkm->bim", picked, per_lane, precision=precision)
    return out.reshape(batch, out_h, out_w, channels)


def separable_planar(images: jax.Array, rows: jax.Array, cols: jax.Array, kind: Contraction) -> jax.Array:
    """`separable` with each image row's channels side by side, `(B, H, C * W)`: the row pass is
    one product on it, and the column pass one product on `(B, H_out * C, W)`, a free reshape of
    its result. Channels move apart before and back together after; no product is repeated."""
    batch, height, width, channels = images.shape
    out_h, out_w = rows.shape[-2], cols.shape[-2]
    precision = precision_for(kind, images.dtype)
    planar = jnp.swapaxes(images, 2, 3).reshape(batch, height, channels * width)
    rows, cols = rows.astype(images.dtype), cols.astype(images.dtype)
    tall = jnp.einsum("bih,bhk->bik" if rows.ndim == 3 else "ih,bhk->bik", rows, planar, precision=precision)
    tall = tall.reshape(batch, out_h * channels, width)
    out = jnp.einsum("bmw,bjw->bmj" if cols.ndim == 3 else "bmw,jw->bmj", tall, cols, precision=precision)
    return jnp.swapaxes(out.reshape(batch, out_h, channels, out_w), 2, 3)


def resamples_per_record(shape: tuple[int, ...], height: int, width: int, backend: str | None = None) -> bool:
    """Whether `resized_crop` and `resize` of `(B, H, W, C)` images run the per-record maths under
    `vmap` rather than `separable`'s batch products: on a TPU (`backend`, default JAX's), for
    images past the interleaved path. A 256 to 224 crop in float32 runs there at 148,591 records/s
    per record against 116,509 through `separable_planar` (`benchmarks/tpu/rrc_probe.py`,
    docs/tpu.md); a CPU runs the batch products faster (813 against 628 records/s on 2 cores)."""
    backend = jax.default_backend() if backend is None else backend
    _, _, in_w, channels = shape
    return backend == "tpu" and in_w * channels * width * channels > MAX_INTERLEAVED_COLUMNS


def resized_crop(images: jax.Array, boxes: jax.Array, height: int, width: int, antialias: bool = True) -> jax.Array:
    """`geometry.resized_crop` for every record (`boxes` `(B, 4)`: top, left, height, width)."""
    boxes = boxes.astype(geometry.position_dtype(images.dtype))
    if resamples_per_record(images.shape, height, width):
        return jax.vmap(lambda image, box: geometry.resized_crop(image, box, height, width, antialias))(images, boxes)
    in_h, in_w = images.shape[1:3]
    rows = jax.vmap(lambda box: geometry.resample_weights(height, in_h, height / box[2], box[0], antialias))(boxes)
    cols = jax.vmap(lambda box: geometry.resample_weights(width, in_w, width / box[3], box[1], antialias))(boxes)
    return separable(images, rows.astype(images.dtype), cols.astype(images.dtype), WEIGHTED_SUM)


def resize(images: jax.Array, height: int, width: int, antialias: bool = True) -> jax.Array:
    """`geometry.resize` for every record: one row and one column matrix for the whole batch."""
    if resamples_per_record(images.shape, height, width):
        return jax.vmap(lambda image: geometry.resize(image, height, width, antialias))(images)
    in_h, in_w = images.shape[1:3]
    box = jnp.asarray([0.0, 0.0, in_h, in_w], geometry.position_dtype(images.dtype))  # as `geometry.resize`
    rows = geometry.resample_weights(height, in_h, height / box[2], box[0], antialias)
    cols = geometry.resample_weights(width, in_w, width / box[3], box[1], antialias)
    return separable(images, rows.astype(images.dtype), cols.astype(images.dtype), WEIGHTED_SUM)


def crop(images: jax.Array, top: jax.Array, left: jax.Array, height: int, width: int, padding: int = 0,
         mode: str = "constant", fill: float = 0.0) -> jax.Array:
    """Pads every image by `padding` (as `geometry.pad`) and takes the `height` x `width` window at
    each record's (`top`, `left`) of the padded image; equals `geometry.crop(geometry.pad(...))`."""
    rows = pad_index(top[:, None] + jnp.arange(height) - padding, images.shape[1], mode)
    cols = pad_index(left[:, None] + jnp.arange(width) - padding, images.shape[2], mode)
    out = separable(images, one_hot_rows(rows, images.shape[1], images.dtype),
                    one_hot_rows(cols, images.shape[2], images.dtype), SELECTION)
    if mode != "constant" or padding == 0:
        return out
    inside = (rows >= 0)[:, :, None] & (cols >= 0)[:, None, :]
    return jnp.where(inside[..., None], out, jnp.asarray(fill, images.dtype))


def flip(images: jax.Array, flags: jax.Array, axis: int) -> jax.Array:
    """Mirrors the records whose `flags` are set along `axis` (1: top-bottom, 2: left-right), with
    one reversal matrix shared by the batch."""
    batch, height, width, channels = images.shape
    precision = precision_for(SELECTION, images.dtype)
    if axis == 1:
        reverse = jnp.eye(height, dtype=images.dtype)[::-1]
        flipped = jnp.einsum("ij,bjk->bik", reverse, images.reshape(batch, height, width * channels),
                             precision=precision)
    else:
        reverse = jnp.kron(jnp.eye(width, dtype=images.dtype)[::-1], jnp.eye(channels, dtype=images.dtype))
        flipped = jnp.einsum("bik,km->bim", images.reshape(batch, height, width * channels), reverse,
                             precision=precision)
    return jnp.where(flags[:, None, None, None], flipped.reshape(images.shape), images)


def translate(images: jax.Array, dx: jax.Array, dy: jax.Array, fill: float = 0.0) -> jax.Array:
    """Shifts content right by `dx` and down by `dy` pixels (fractions interpolate bilinearly;
    outside taps read `fill`), as `geometry.translate` does per record.

    A shift is separable: output pixel (i, j) samples the source at (i - dy, j - dx), and its taps
    lie inside the image exactly when their row and their column do, so the weight left to `fill`
    is `1 - (row weight inside) * (column weight inside)`.
    """
    height, width = images.shape[1:3]
    dtype = jnp.result_type(images.dtype, dx.dtype, float)
    rows = tap_weights(jnp.arange(height, dtype=dtype)[None] - dy[:, None].astype(dtype), height, images.dtype)
    cols = tap_weights(jnp.arange(width, dtype=dtype)[None] - dx[:, None].astype(dtype), width, images.dtype)
    out = separable(images, rows, cols, WEIGHTED_SUM)
    kept = rows.sum(-1)[:, :, None] * cols.sum(-1)[:, None, :]
    return out + (jnp.asarray(fill, images.dtype) * (1 - kept))[..., None]


# Elements of a record's `(H * W, W * C)` intermediate up to which `warp_affine` is the batch
# formulation (32 x 32 x 3 images: 98,304; 256 of them hold 100 MB); larger images keep the gather.
MAX_WARP_ELEMENTS = 1 << 17


def warps_in_batch(shape: tuple[int, ...]) -> bool:
    """Whether `warp_affine`'s batch formulation takes images of `shape` `(H, W, C)`."""
    height, width, channels = shape
    return height * width * width * channels <= MAX_WARP_ELEMENTS


def warp_affine(images: jax.Array, inverse: jax.Array, fill: float = 0.0) -> jax.Array:
    """`geometry.warp_affine` for every record (`inverse` `(B, 2, 3)`), as products.

    Bilinear weights factor into a row weight and a column weight, so each output pixel p reads
    `sum_h rows[p, h] * (image[h] . cols[p])`: one batched product `(P, H) @ (H, W * C)` on the
    matrix unit, then a dot with the pixel's column weights. Source positions are computed as
    `geometry.warp_affine` computes them (the same taps); outside taps read `fill`, as there.
    """
    batch, height, width, channels = images.shape
    ys, xs = jnp.meshgrid(jnp.arange(height, dtype=inverse.dtype), jnp.arange(width, dtype=inverse.dtype),
                          indexing="ij")
    ys, xs = ys.reshape(-1), xs.reshape(-1)
    src_x = inverse[:, 0, 0, None] * xs + inverse[:, 0, 1, None] * ys + inverse[:, 0, 2, None]
    src_y = inverse[:, 1, 0, None] * xs + inverse[:, 1, 1, None] * ys + inverse[:, 1, 2, None]
    rows = tap_weights(src_y, height, images.dtype)  # (B, P, H)
    cols = tap_weights(src_x, width, images.dtype)  # (B, P, W)
    precision = precision_for(WEIGHTED_SUM, images.dtype)
    picked = jnp.einsum("bph,bhk->bpk", rows, images.reshape(batch, height, width * channels), precision=precision)
    out = jnp.einsum("bpwc,bpw->bpc", picked.reshape(batch, height * width, width, channels), cols,
                     precision=precision)
    kept = rows.sum(-1) * cols.sum(-1)
    out = out + (jnp.asarray(fill, images.dtype) * (1 - kept))[..., None]
    return out.reshape(batch, height, width, channels)
