"""Every learnable audio magnitude gets a finite, non-zero gradient that matches finite differences.

For each operator the loss is a fixed random projection of its output on a tiny generic batch,
`L = sum(w * op(x))`, differentiated with respect to the operator's `nnx.Param` logits. The check
runs in float64 (x64 enabled by the fixture and restored after): the gradient projected on a
random direction `v` must equal `(L(p + h v) - L(p - h v)) / 2h` to 1e-6 relative, and every
entry of every learnable logit (each channel, for PCEN) must have a non-zero gradient.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from on_cpu import float64_on_cpu

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.audio import (
    AddNoiseConfig,
    AddNoiseOperator,
    FrequencyMaskConfig,
    FrequencyMaskOperator,
    GainConfig,
    GainOperator,
    LogMelConfig,
    LogMelOperator,
    PCENConfig,
    PCENOperator,
    TimeMaskConfig,
    TimeMaskOperator,
    TimeShiftConfig,
    TimeShiftOperator,
)

STEP = 1e-5


@pytest.fixture
def x64():
    with float64_on_cpu():
        yield


def waveform(rng):
    return rng.standard_normal((3, 64))


def spectrogram(rng):
    return rng.standard_normal((3, 6, 16))


def energies(rng):
    return np.exp(rng.standard_normal((3, 3, 10)))


CASES = {
    "gain": (lambda: GainOperator(GainConfig(gain_db=-3.0, max_delta_db=6.0, learnable=True), rngs=nnx.Rngs(0)),
             waveform, "audio", ["gain_db", "max_delta_db"]),
    "noise": (lambda: AddNoiseOperator(AddNoiseConfig(snr_db=10.0, max_delta_db=5.0, learnable=True), rngs=nnx.Rngs(1)),
              waveform, "audio", ["snr_db", "max_delta_db"]),
    "shift_zero": (lambda: TimeShiftOperator(TimeShiftConfig(shift=0.05, max_delta=0.1, learnable=True),
                                             rngs=nnx.Rngs(2)), waveform, "audio", ["shift", "max_delta"]),
    "shift_wrap": (lambda: TimeShiftOperator(TimeShiftConfig(shift=-0.2, max_delta=0.3, mode="wrap", learnable=True),
                                             rngs=nnx.Rngs(3)), waveform, "audio", ["shift", "max_delta"]),
    "time_mask": (lambda: TimeMaskOperator(TimeMaskConfig(field="audio", max_width=5.0, num_masks=2, learnable=True),
                                           rngs=nnx.Rngs(4)), spectrogram, "audio", ["max_width"]),
    "frequency_mask": (lambda: FrequencyMaskOperator(FrequencyMaskConfig(field="audio", max_width=3.0, learnable=True),
                                                     rngs=nnx.Rngs(5)), spectrogram, "audio", ["max_width"]),
    "pcen": (lambda: PCENOperator(PCENConfig(n_channels=3, field="audio", learnable=True)),
             energies, "pcen", ["alpha", "delta", "r", "s"]),
}


def projected_loss(op, element, ctx, weights, field):
    graphdef, params, rest = nnx.split(op, nnx.Param, ...)

    def loss(p):
        return jnp.sum(nnx.merge(graphdef, p, rest)(element, ctx).data[field] * weights)

    return params, jax.jit(jax.value_and_grad(loss))


def leaf_for(tree, name):
    """The pytree path of the logit of magnitude `name`."""
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
             if any(getattr(k, "key", None) == name for k in path)]
    assert len(paths) == 1, paths
    return paths[0]


def along(tree, path, direction):
    """A tree of zeros except `direction` at `path`."""
    return jax.tree_util.tree_map_with_path(lambda p, x: direction if p == path else jnp.zeros_like(x), tree)


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_is_finite_nonzero_and_matches_finite_differences(case, x64):
    make, data, field, names = CASES[case]
    rng = np.random.default_rng(0)
    op = make()
    x = jnp.asarray(data(rng))
    assert x.dtype == jnp.float64
    ctx = BatchContext.for_batch(x.shape[0], epoch=1)
    weights = jnp.asarray(rng.standard_normal(x.shape))  # every case keeps the input's shape
    params, value_and_grad = projected_loss(op, Element({"audio": x}), ctx, weights, field)
    _, grads = value_and_grad(params)
    learnable = {getattr(path[-3], "key", None) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
    assert learnable == set(names)
    for name in names:
        path = leaf_for(grads, name)
        grad = dict(jax.tree_util.tree_flatten_with_path(grads)[0])[path]
        assert bool(jnp.all(jnp.isfinite(grad))), (name, grad)
        assert bool(jnp.all(grad != 0)), (name, grad)
        direction = jnp.asarray(rng.standard_normal(grad.shape))
        step = jax.tree.map(lambda a: STEP * a, along(params, path, direction))
        plus, _ = value_and_grad(jax.tree.map(jnp.add, params, step))
        minus, _ = value_and_grad(jax.tree.map(jnp.subtract, params, step))
        numeric = (plus - minus) / (2 * STEP)
        np.testing.assert_allclose(jnp.sum(grad * direction), numeric, rtol=1e-6, atol=1e-9, err_msg=name)


def test_gradient_reaches_a_gain_through_log_mel(x64):
    # A learnable augmentation before a feature extractor: the gradient crosses the STFT,
    # including zero-padded frames of silence, and stays finite.
    rng = np.random.default_rng(1)
    audio = np.zeros((2, 1024))
    audio[:, 300:] = rng.standard_normal((2, 724))
    gain = GainOperator(GainConfig(gain_db=-6.0, stochastic=False, learnable=True))
    log_mel = LogMelOperator(LogMelConfig(sample_rate=8000, n_fft=256, hop_length=64, n_mels=16, top_db=None))
    ctx = BatchContext.for_batch(2)
    graphdef, params, rest = nnx.split(gain, nnx.Param, ...)

    def loss(p):
        element = nnx.merge(graphdef, p, rest)(Element({"audio": jnp.asarray(audio)}), ctx)
        return jnp.mean(log_mel(element, ctx).data["log_mel"])

    value_and_grad = jax.jit(jax.value_and_grad(loss))
    _, grads = value_and_grad(params)
    grad = jax.tree.leaves(grads)[0]
    raw = jax.tree.leaves(params)[0]
    shifted = [jax.tree.map(lambda a, s=s: a + s, params) for s in (STEP, -STEP)]
    numeric = (value_and_grad(shifted[0])[0] - value_and_grad(shifted[1])[0]) / (2 * STEP)
    assert bool(jnp.isfinite(grad)) and float(grad) != 0 and raw.dtype == jnp.float64
    np.testing.assert_allclose(grad, numeric, rtol=1e-6)
