"""DDSP synthesiser functions and operators against numpy references."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.audio import synth
from datarax.operators.audio.functional import synth as synth_maths

SR, HOP, FRAMES = 8000, 16, 12


def numpy_harmonic(f0, amplitude, distribution, sr, hop):
    """Oscillator bank in float64: np.interp controls, running phase, Nyquist mask, renormalised weights."""
    n = len(f0) * hop
    pos = np.arange(n) / hop
    frames = np.arange(len(f0))
    def up(c):  # holds the last frame like the synth
        return np.interp(pos, frames, c)
    k = np.arange(1, distribution.shape[1] + 1)
    weights = np.where(f0[:, None] * k < sr / 2, distribution, 0.0)
    weights = weights / np.maximum(weights.sum(1, keepdims=True), 1e-7)
    phase = 2 * np.pi * np.cumsum(up(f0)) / sr
    amps = np.stack([up(amplitude * weights[:, j]) for j in range(len(k))], axis=1)
    return np.sum(amps * np.sin(phase[:, None] * k), axis=1)


def test_upsample_matches_numpy_interp():
    controls = np.random.default_rng(0).normal(size=(FRAMES, 3)).astype(np.float32)
    got = np.asarray(synth_maths.upsample(jnp.asarray(controls), HOP))
    pos = np.arange(FRAMES * HOP) / HOP
    want = np.stack([np.interp(pos, np.arange(FRAMES), controls[:, j]) for j in range(3)], axis=1)
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_harmonic_synth_matches_numpy_reference():
    rng = np.random.default_rng(1)
    f0 = np.linspace(200.0, 900.0, FRAMES)  # crosses Nyquist for the upper harmonics
    amplitude = rng.uniform(0.1, 1.0, FRAMES)
    distribution = rng.uniform(0.0, 1.0, (FRAMES, 6))
    got = synth_maths.harmonic_synth(jnp.asarray(f0, jnp.float32), jnp.asarray(amplitude, jnp.float32),
                               jnp.asarray(distribution, jnp.float32), sample_rate=SR, hop_length=HOP)
    np.testing.assert_allclose(np.asarray(got), numpy_harmonic(f0, amplitude, distribution, SR, HOP), atol=2e-4)


def test_harmonics_above_nyquist_are_silent():
    f0 = np.full(FRAMES, 3000.0, np.float32)  # harmonic 2 (6 kHz) is above the 4 kHz Nyquist
    audio = synth_maths.harmonic_synth(jnp.asarray(f0), jnp.ones(FRAMES), jnp.ones((FRAMES, 3)), sample_rate=SR,
                                 hop_length=HOP)
    t = np.arange(FRAMES * HOP) + 1
    np.testing.assert_allclose(np.asarray(audio), np.sin(2 * np.pi * 3000.0 * t / SR), atol=1e-4)


def test_filtered_noise_with_constant_filter_is_a_linear_convolution():
    rng = np.random.default_rng(2)
    magnitudes = np.tile(rng.uniform(0.0, 1.0, 9), (FRAMES, 1)).astype(np.float32)
    noise = rng.uniform(-1, 1, FRAMES * HOP).astype(np.float32)
    got = synth_maths.filtered_noise(jnp.asarray(noise), jnp.asarray(magnitudes), HOP)
    ir = np.fft.irfft(magnitudes[0])
    size = len(ir)
    ir = np.roll(ir, size // 2) * np.hanning(size + 1)[:size]
    want = np.convolve(noise, ir)[size // 2:size // 2 + len(noise)]
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_flat_filter_passes_noise_through():
    noise = np.random.default_rng(3).uniform(-1, 1, FRAMES * HOP).astype(np.float32)
    got = synth_maths.filtered_noise(jnp.asarray(noise), jnp.ones((FRAMES, 9)), HOP)
    np.testing.assert_allclose(np.asarray(got), noise, atol=1e-5)


@pytest.mark.parametrize("frame_length", [16, 23, 40])
def test_overlap_add_matches_a_python_loop(frame_length):
    frames = np.random.default_rng(4).normal(size=(5, frame_length)).astype(np.float32)
    want = np.zeros((5 - 1) * HOP + frame_length, np.float32)
    for t in range(5):
        want[t * HOP:t * HOP + frame_length] += frames[t]
    np.testing.assert_allclose(np.asarray(synth_maths.overlap_add(jnp.asarray(frames), HOP)), want, atol=1e-5)


def test_reverb_matches_numpy_convolution():
    rng = np.random.default_rng(5)
    audio, ir = rng.normal(size=200).astype(np.float32), rng.normal(size=37).astype(np.float32)
    want = audio + np.convolve(audio, ir)[:200]
    np.testing.assert_allclose(np.asarray(synth_maths.reverb(jnp.asarray(audio), jnp.asarray(ir))), want, atol=1e-4)


def test_operators_render_a_batch_like_the_functions():
    rng = np.random.default_rng(6)
    data = {"f0_hz": rng.uniform(100, 400, (2, FRAMES)).astype(np.float32),
            "amplitude": rng.uniform(0, 1, (2, FRAMES)).astype(np.float32),
            "harmonic_distribution": rng.uniform(0, 1, (2, FRAMES, 4)).astype(np.float32),
            "noise_magnitudes": rng.uniform(0, 1, (2, FRAMES, 5)).astype(np.float32)}
    ctx = BatchContext.for_batch(2)
    harmonic = synth.HarmonicSynthOperator(synth.HarmonicSynthConfig(sample_rate=SR, hop_length=HOP))
    noise = synth.FilteredNoiseOperator(synth.FilteredNoiseConfig(hop_length=HOP), rngs=nnx.Rngs(0))
    # jitted, as a pipeline runs them (op by op, each primitive would compile on its own)
    out = nnx.jit(lambda harmonic, noise, d: noise(harmonic(Element(d), ctx), ctx).data)(
        harmonic, noise, jax.tree.map(jnp.asarray, data))
    for i in range(2):
        np.testing.assert_allclose(np.asarray(out["harmonic"][i]), numpy_harmonic(
            data["f0_hz"][i], data["amplitude"][i], data["harmonic_distribution"][i], SR, HOP), atol=2e-4)
    assert out["noise"].shape == (2, FRAMES * HOP)
    assert not np.allclose(out["noise"][0], out["noise"][1])  # each record draws its own noise


def test_gradients_reach_controls_and_learnable_reverb():
    rev = synth.ReverbOperator(synth.ReverbConfig(sample_rate=SR, length_s=0.01, decay_s=0.005, learnable=True),
                               rngs=nnx.Rngs(0))

    def loss(rev, distribution):
        audio = synth_maths.harmonic_synth(jnp.full(FRAMES, 220.0), jnp.ones(FRAMES), distribution, sample_rate=SR,
                                     hop_length=HOP)
        return jnp.sum(rev(Element({"audio": audio[None]}), BatchContext.for_batch(1)).data["audio"] ** 2)

    grads = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(rev, jnp.ones((FRAMES, 3)) / 3)  # jitted, as a step runs it
    leaves = jax.tree.leaves(grads)
    assert all(np.isfinite(np.asarray(g)).all() for g in leaves)
    assert float(jnp.abs(grads[1]).sum()) > 0 and float(jnp.abs(grads[0].decay.raw[...])) > 0


@pytest.mark.parametrize("make, match", [
    (lambda: synth.HarmonicSynthConfig(stochastic=True), "draw nothing"),
    (lambda: synth.HarmonicSynthConfig(hop_length=0), "hop_length must be a positive int, got 0"),
    (lambda: synth.HarmonicSynthConfig(f0_field=""), "f0_field must be a non-empty field name"),
    (lambda: synth.FilteredNoiseConfig(stochastic=False), "no noise to filter"),
    (lambda: synth.ReverbConfig(decay_s=0.5, length_s=0.25), r"decay_s must be in \(0, length_s=0.25\], got 0.5"),
    (lambda: synth.ReverbConfig(wet=1.5), r"wet must be in \[0, 1\], got 1.5"),
    (lambda: synth.ReverbConfig(learnable=("size",)), "learnable must be True, False or a tuple"),
    (lambda: synth.ReverbOperator(synth.ReverbConfig(), rngs=None), "needs rngs=nnx.Rngs"),
])
def test_bad_configuration_is_named(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_missing_field_and_bad_shapes_are_named():
    op = synth.HarmonicSynthOperator(synth.HarmonicSynthConfig(sample_rate=SR, hop_length=HOP))
    with pytest.raises(KeyError, match="reads field 'f0_hz'"):
        op.apply_element(Element({"amplitude": jnp.ones(FRAMES)}), None)
    with pytest.raises(ValueError, match="harmonic_synth needs f0_hz"):
        synth_maths.harmonic_synth(jnp.ones(FRAMES), jnp.ones(FRAMES + 1), jnp.ones((FRAMES, 2)), sample_rate=SR,
                             hop_length=HOP)
    with pytest.raises(ValueError, match=f"noise must have n_frames \\* hop_length = {FRAMES * HOP} samples"):
        synth_maths.filtered_noise(jnp.ones(5), jnp.ones((FRAMES, 3)), HOP)


def test_decaying_ir_decays_at_the_given_rate():
    ir = synth_maths.decaying_noise_ir(jnp.ones(80), 0.002, 0.5, SR)
    np.testing.assert_allclose(np.asarray(ir), 0.5 * np.exp(-np.arange(80) / SR / 0.002), rtol=1e-5)
    assert math.isclose(float(ir[0]), 0.5)
