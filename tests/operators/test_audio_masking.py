"""SpecAugment masks against numpy slice assignment; fractional edges against exact coverage.

There is no library reference for SpecAugment's random draws, so the maths is checked where it
is exact: with integer starts and widths the masks equal numpy's `x[..., a:a + w] = value`
(exactly), and the fractional weights equal the covered length of each bin computed in Python.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.audio import FrequencyMaskConfig, FrequencyMaskOperator, TimeMaskConfig, TimeMaskOperator
from datarax.operators.audio.functional import masking

_apply = jax.jit(masking.apply_masks, static_argnums=(3,))


def spectrogram(shape=(12, 20), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("starts,widths,axis,value", [
    ([3], [4], -1, 0.0), ([0, 10], [2, 5], -1, -1.5), ([5, 7], [4, 4], -1, 0.0),
    ([2], [3], -2, 0.0), ([0], [12], -2, 2.0), ([11], [1], 0, 0.0),
])
def test_integer_masks_equal_slice_assignment(starts, widths, axis, value):
    x = spectrogram()
    expected = x.copy()
    for a, w in zip(starts, widths):
        np.moveaxis(expected, axis, 0)[a:a + w] = value
    got = _apply(jnp.asarray(x), jnp.asarray(starts, jnp.float32), jnp.asarray(widths, jnp.float32), axis, value)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("start,width", [(2.3, 3.4), (0.0, 0.5), (7.75, 10.0), (4.5, 0.25)])
def test_fractional_mask_weights_are_covered_fractions(start, width):
    expected = [max(0.0, min(start + width, i + 1) - max(start, i)) for i in range(12)]
    np.testing.assert_allclose(masking.coverage(12, start, width), np.clip(expected, 0, 1), atol=1e-6)


def test_time_and_frequency_masks_stay_inside_and_vary_by_record():
    x = np.stack([spectrogram(seed=i) + 10.0 for i in range(6)])
    ctx = BatchContext.for_batch(6)
    time_op = TimeMaskOperator(TimeMaskConfig(field="spec", max_width=6.0, num_masks=2), rngs=nnx.Rngs(0))
    freq_op = FrequencyMaskOperator(FrequencyMaskConfig(field="spec", max_width=4.0, mask_value="mean"),
                                    rngs=nnx.Rngs(1))
    timed, freqd = jax.jit(lambda s: (time_op(Element({"spec": s}), ctx).data["spec"],
                                      freq_op(Element({"spec": s}), ctx).data["spec"]))(jnp.asarray(x))
    # Masked output is x * keep + value * (1 - keep), with keep in [0, 1] constant along the other
    # axis: whole columns for time masks (value 0), whole rows for frequency masks (the mean).
    mean = x.mean(axis=(1, 2), keepdims=True)
    time_keep = np.asarray(timed)[:, :1, :] / x[:, :1, :]
    centred = x - mean
    freq_keep = ((np.asarray(freqd) - mean) * centred).sum(-1, keepdims=True) / (centred ** 2).sum(-1, keepdims=True)
    np.testing.assert_allclose(timed, x * time_keep, atol=1e-5)
    np.testing.assert_allclose(freqd, x * freq_keep + mean * (1 - freq_keep), atol=1e-5)
    for keep in (time_keep, freq_keep):
        assert keep.min() >= -1e-5 and keep.max() <= 1 + 1e-5
    assert np.all((1 - time_keep).sum(axis=(1, 2)) <= 2 * 6.0 + 1e-4)
    assert np.all((1 - freq_keep).sum(axis=(1, 2)) <= 4.0 + 1e-4)
    assert len({tuple(np.round(k[0], 3)) for k in time_keep}) == 6
    assert (1 - freq_keep).sum(axis=(1, 2)).max() > 0


@pytest.mark.parametrize("call,error,match", [
    (lambda: TimeMaskConfig(stochastic=False), ValueError, r"TimeMaskConfig\(stochastic=False\) has nothing to do"),
    (lambda: TimeMaskConfig(max_width=150.0), ValueError, r"TimeMaskConfig.max_width must be in \[0.0, 100.0\], got "
                                                          r"150.0"),
    (lambda: FrequencyMaskConfig(num_masks=0), ValueError, r"FrequencyMaskConfig.num_masks must be an int >= 1, got 0"),
    (lambda: FrequencyMaskConfig(mask_value="min"), ValueError,
     r"FrequencyMaskConfig.mask_value must be a finite number or 'mean' \(the record's mean\), got 'min'"),
    (lambda: jax.jit(TimeMaskOperator(TimeMaskConfig(), rngs=nnx.Rngs(0)))(Element({"log_mel": jnp.ones((2, 7))}),
                                                                           BatchContext.for_batch(2)),
     ValueError, r"expects field 'log_mel' to hold one spectrogram \(..., freq, time\) per record, .*LogMelOperator"),
])
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
