"""The precision policy: how exactly each kind of contraction (matrix product) in the operators runs.

On a TPU a float32 product runs as bfloat16 passes on the matrix unit: `DEFAULT` is one pass
(each operand rounded to bfloat16's 8 significant bits), `HIGH` three (each operand split into a
bfloat16 high and low part, 16 bits, and `hi*hi + hi*lo + lo*hi` summed in float32), `HIGHEST`
six (a three-way split: float32's 24 bits). Passes cost matrix-unit time, so each kind of
contraction declares the cheapest precision whose error against a float64 product of the same operands stays
within its bound, stated as a fraction of `sum_k |a_k * b_k|` for each output element (for
weights that are >= 0 and sum to 1, as resampling and blur taps are, at most the largest input
magnitude):

    kind          contractions                                                 float32  bound
    SELECTION     crops, pads, flips, a user's slices (one-hot rows)           HIGHEST  0 (exact)
    WEIGHTED_SUM  resize, resized crop, shifts, warps, blur, luma, mel, DCT    HIGH     1e-4
    COORDINATES   the affine warp's matrix                                     HIGHEST  1e-6

Why: a selection must give its values back exactly, and `HIGH` keeps only 16 of float32's 24
bits. `HIGH` is within 3 * 2**-16 (4.6e-5) of every product, `DEFAULT` only within 2**-7, so
weighted sums take `HIGH`. An error in a coordinate moves every sample of a warp (by up to the
image's size times it), and the matrix is four products a record: it keeps `HIGHEST`.

A selection is exact at fewer passes when its values have fewer significant bits: `DEFAULT` for
bfloat16 and integers of up to 8 bits, `HIGH` for integers of up to 16 bits. Weighted sums of
bfloat16 operands run at `DEFAULT`, which holds them exactly: the only error is the bfloat16
rounding of the result, within `BFLOAT16_BOUND`. Backends other than a TPU keep `HIGHEST`: a CPU
computes float32 products in float32 whatever is declared, and a GPU's `HIGH` (TensorFloat-32,
11 bits) is unmeasured here.

tests/operators/test_precision_policy.py checks each bound against float64 (on a CPU by emulating the
passes, on a TPU with the chip's own products) and that the next cheaper precision breaks it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Precision = jax.lax.Precision

# Backends whose float32 products follow this policy; the others run every product at HIGHEST.
TUNED_BACKENDS = ("tpu",)

# A bfloat16 result is rounded to 8 significant bits (within 2**-8 of itself) after a float32 sum:
# within one bfloat16 unit in the last place.
BFLOAT16_BOUND = 2.0**-7


@dataclasses.dataclass(frozen=True)
class Contraction:
    """One kind of contraction.

    Attributes:
        name: what it is called in docs and test ids.
        precision: what its float32 products declare on a tuned backend.
        bound: the largest error against a float64 product of the same operands, as a fraction
            of `sum_k |a_k * b_k|` for each output element; 0 for exact.
    """

    name: str
    precision: Precision
    bound: float


SELECTION = Contraction("selection", Precision.HIGHEST, 0.0)
WEIGHTED_SUM = Contraction("weighted sum", Precision.HIGH, 1e-4)
COORDINATES = Contraction("coordinates", Precision.HIGHEST, 1e-6)
KINDS = (SELECTION, WEIGHTED_SUM, COORDINATES)


def significant_bits(dtype) -> int:
    """How many significant bits the values of `dtype` have (float: mantissa and the implicit bit)."""
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return jnp.iinfo(dtype).bits - int(jnp.issubdtype(dtype, jnp.signedinteger))
    return jnp.finfo(dtype).nmant + 1


def precision_for(kind: Contraction, dtype) -> Precision:
    """The precision a contraction of `kind` declares for values of `dtype` on the current backend.

    `dtype` is that of the values being combined: for a selection of integers computed in float32,
    the integers' dtype.
    """
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bfloat16 or (kind.bound == 0 and significant_bits(dtype) <= 8):
        return Precision.DEFAULT  # one pass holds the values exactly
    if jax.default_backend() not in TUNED_BACKENDS or dtype == jnp.float64:
        return Precision.HIGHEST
    if kind.bound == 0 and jnp.issubdtype(dtype, jnp.integer) and significant_bits(dtype) <= 16:
        return Precision.HIGH  # two bfloat16 parts hold a 16-bit integer exactly
    return kind.precision
