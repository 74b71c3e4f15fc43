"""PCEN against librosa.pcen, scalar and per-channel; the learnable operator.

Tolerance: 1e-4 of the output's peak in float32 (the smoother is a 32-frame recursion; librosa
runs it in float64 via scipy.signal.lfilter). librosa starts its smoother from the steady state of
a unit input (`initial=1.0` here); our default starts from the first frame, which equals
librosa with `zi = (1 - b) * S[:, :1]`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.audio import PCENConfig, PCENOperator
from datarax.operators.audio.functional import pcen

librosa = pytest.importorskip("librosa")

SR, HOP = 16000, 128
_pcen = jax.jit(pcen.pcen, static_argnames=("eps",))


def energies(seed=0, channels=40):
    x = np.random.default_rng(seed).standard_normal(4000).astype(np.float32)
    x *= np.linspace(0.1, 1.0, 4000, dtype=np.float32)
    mel = librosa.feature.melspectrogram(y=x, sr=SR, n_fft=512, hop_length=HOP, n_mels=channels)
    return (mel * 2 ** 16).astype(np.float32)


def test_smoothing_coefficient_is_librosas_b():
    s = pcen.smoothing_coefficient(0.4, SR, HOP)
    t = 0.4 * SR / HOP
    np.testing.assert_allclose(s, max(np.roots([t * t, 1.0, -1.0])), rtol=1e-12)
    energy = energies()
    expected = librosa.pcen(energy, sr=SR, hop_length=HOP, time_constant=0.4)
    np.testing.assert_allclose(_pcen(jnp.asarray(energy), s=s, initial=1.0), expected, atol=1e-4 * expected.max())


@pytest.mark.parametrize("gain,bias,power,b", [(0.98, 2.0, 0.5, 0.05), (0.8, 10.0, 0.25, 0.2), (0.5, 0.5, 1.0, 0.5)])
def test_matches_librosa_with_its_initial_state(gain, bias, power, b):
    energy = energies()
    expected = librosa.pcen(energy, gain=gain, bias=bias, power=power, b=b, eps=1e-6)
    got = _pcen(jnp.asarray(energy), gain, bias, power, b, initial=1.0)
    np.testing.assert_allclose(got, expected, atol=1e-4 * expected.max())


def test_first_frame_initial_state_matches_librosa_zi():
    energy, b = energies(), 0.05
    expected = librosa.pcen(energy, b=b, zi=(1 - b) * energy[:, :1].astype(np.float64))
    np.testing.assert_allclose(_pcen(jnp.asarray(energy), s=b), expected, atol=1e-4 * expected.max())


def test_per_channel_parameters_match_librosa_row_by_row():
    energy = energies(channels=4)
    params = dict(alpha=np.array([0.9, 0.95, 0.98, 0.6]), delta=np.array([1.0, 2.0, 5.0, 0.5]),
                  r=np.array([0.5, 0.3, 0.7, 0.25]), s=np.array([0.02, 0.05, 0.1, 0.3]))
    got = np.asarray(_pcen(jnp.asarray(energy), **{k: jnp.asarray(v, jnp.float32) for k, v in params.items()},
                           initial=1.0))
    for c in range(4):
        expected = librosa.pcen(energy[c:c + 1], gain=params["alpha"][c], bias=params["delta"][c],
                                power=params["r"][c], b=params["s"][c])
        np.testing.assert_allclose(got[c:c + 1], expected, atol=1e-4 * expected.max())


def test_learnable_operator_starts_at_the_configured_values():
    batch = np.stack([energies(0, 16), energies(1, 16)])
    op = PCENOperator(PCENConfig(n_channels=16, alpha=0.9, delta=3.0, r=0.4, s=0.06, learnable=True))
    params = nnx.state(op, nnx.Param)
    assert len(jax.tree.leaves(params)) == 4 and all(leaf.shape == (16,) for leaf in jax.tree.leaves(params))
    out = nnx.jit(lambda m, el, c: m(el, c))(op, Element({"mel": jnp.asarray(batch)}), BatchContext.for_batch(2))
    for i in range(2):
        expected = librosa.pcen(batch[i], gain=0.9, bias=3.0, power=0.4, b=0.06, zi=0.94 * batch[i][:, :1])
        np.testing.assert_allclose(out.data["pcen"][i], expected, atol=1e-4 * expected.max())
    np.testing.assert_array_equal(out.data["mel"], batch)


def test_learnable_subset_keeps_the_rest_fixed():
    op = PCENOperator(PCENConfig(n_channels=8, learnable=("alpha", "s")))
    assert sorted(op.current_parameters()) == ["alpha", "delta", "r", "s"]
    assert op.current_parameters()["delta"] == 2.0
    assert op.current_parameters()["alpha"].shape == (8,)


@pytest.mark.parametrize("call,error,match", [
    (lambda: PCENConfig(n_channels=0), ValueError, r"PCENConfig.n_channels must be an int >= 1, got 0"),
    (lambda: PCENConfig(n_channels=4, alpha=1.5), ValueError, r"PCENConfig.alpha must be in \[0.0, 1.0\], got 1.5"),
    (lambda: PCENConfig(n_channels=4, delta=0.0), ValueError, r"PCENConfig.delta must be in \(0.0, 20.0\], got 0.0"),
    (lambda: PCENConfig(n_channels=4, stochastic=True), ValueError,
     r"PCENConfig\(stochastic=True\): PCEN draws nothing"),
    (lambda: PCENOperator(PCENConfig(n_channels=4, r=1.0, learnable=True)), ValueError,
     r"learnable PCENConfig.r must lie strictly inside \(0.0, 1.0\), got 1.0"),
    (lambda: PCENOperator(PCENConfig(n_channels=4, learnable=("gain",))), ValueError,
     r"PCENConfig.learnable names \['gain'\], which are not learnable magnitudes"),
    (lambda: PCENOperator(PCENConfig(n_channels=4))(Element({"mel": jnp.ones((2, 5, 7))}), BatchContext.for_batch(2)),
     ValueError, r"built for n_channels=4, but field 'mel' has 5 channels .* set PCENConfig\(n_channels=5\)"),
    (lambda: pcen.smoothing_coefficient(0.0, SR, HOP), ValueError, r"time_constant must be > 0, got 0.0"),
    (lambda: pcen.pcen(jnp.ones((2, 3)), eps=0.0), ValueError, r"eps must be > 0, got 0.0"),
])
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
