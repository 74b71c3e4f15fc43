"""MixUp and CutMix: pairing, numpy mixing references, Beta statistics, gradient in alpha.

The finite-difference reference for the gradient follows the documented reparameterisation of
the weight's gamma draws (`datarax.operators.image.functional.beta`): each Gamma(alpha + 1) draw keeps its
CDF value q = P(alpha + 1, g) fixed and the boost uniform u is fixed, so the perturbed draws are
log g(alpha') = log P^-1(alpha' + 1, q) + log(u) / alpha', computed with SciPy's regularised
incomplete gamma functions in float64.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
import scipy.stats
from flax import nnx
from on_cpu import float64_on_cpu

from datarax.core.element import Element
from datarax.core.operator import BatchContext
from datarax.operators.image import CutMixConfig, CutMixOperator, MixUpConfig, MixUpOperator
from datarax.operators.image.functional.beta import UNIFORMS_PER_BETA, symmetric_beta
from datarax.operators.image.functional.mix import partners
from datarax.operators.image.mix import draw_parameters
from datarax.operators.learnable import bounded

NUM_CLASSES = 5


def batch(seed=0, size=6, shape=(6, 8, 2)):
    rng = np.random.default_rng(seed)
    return rng.random((size, *shape)).astype(np.float32), rng.integers(0, NUM_CLASSES, size).astype(np.int32)


@nnx.jit
def _apply(op, images, labels, ctx):
    drawn = draw_parameters(op, ctx, images.shape[1:])
    out = op.apply_drawn(Element({"image": images, "label": labels}), drawn)
    return out.data["image"], out.data["label"], drawn


def run(op, images, labels, ctx):
    out, mixed, drawn = _apply(op, jnp.asarray(images), jnp.asarray(labels), ctx)
    return np.asarray(out), np.asarray(mixed), {k: np.asarray(v, np.float64) for k, v in drawn.items()}


def test_partners_pair_valid_rows_without_self_pairs_and_ignore_padding():
    scores = jnp.asarray([0.7, 0.1, 0.5, 0.9, 0.3, 0.2])
    mask = jnp.asarray([True, True, True, True, False, False])
    partner = np.asarray(partners(scores, mask))
    # Valid rows in score order: 1 (0.1), 2 (0.5), 0 (0.7), 3 (0.9); each takes the next, cyclically.
    np.testing.assert_array_equal(partner, [3, 2, 0, 1, 4, 5])


def test_pairing_depends_on_the_records_not_their_order():
    op = MixUpOperator(MixUpConfig(num_classes=NUM_CLASSES), rngs=nnx.Rngs(0))
    ids = np.array([11, 4, 7, 30, 2, 9], np.int32)
    order = np.array([3, 0, 5, 1, 4, 2])
    pairing = jax.jit(lambda ctx: draw_parameters(op, ctx, (2, 2, 1))["partner"])
    first = np.asarray(pairing(BatchContext.for_batch(6, epoch=1, record_ids=ids)))
    second = np.asarray(pairing(BatchContext.for_batch(6, epoch=1, record_ids=ids[order])))
    assert {int(ids[i]): int(ids[p]) for i, p in enumerate(first)} == \
        {int(ids[order][i]): int(ids[order][p]) for i, p in enumerate(second)}
    other_epoch = np.asarray(pairing(BatchContext.for_batch(6, epoch=2, record_ids=ids)))
    assert not np.array_equal(other_epoch, first)


def test_mixup_matches_numpy_keeps_padding_and_draws_beta_weights():
    size, valid = 1024, 1000
    images, labels = batch(1, size, (3, 4, 1))
    soft = np.eye(NUM_CLASSES, dtype=np.float32)[labels]
    op = MixUpOperator(MixUpConfig(alpha=0.4, num_classes=NUM_CLASSES), rngs=nnx.Rngs(1))
    ctx = BatchContext(jnp.arange(size, dtype=jnp.int32), jnp.asarray(0, jnp.int32), jnp.arange(size) < valid)
    out, mixed, drawn = run(op, images, soft, ctx)
    partner, lam = drawn["partner"].astype(int), drawn["lam"]
    assert sorted(partner[:valid]) == list(range(valid)) and np.all(partner[:valid] != np.arange(valid))
    lam_image = lam[:valid, None, None, None]
    np.testing.assert_allclose(out[:valid], lam_image * images[:valid] + (1 - lam_image) * images[partner[:valid]],
                               atol=1e-6)
    np.testing.assert_allclose(mixed[:valid], lam[:valid, None] * soft[:valid]
                               + (1 - lam[:valid, None]) * soft[partner[:valid]], atol=1e-6)
    np.testing.assert_array_equal(out[valid:], images[valid:])
    np.testing.assert_array_equal(mixed[valid:], soft[valid:])
    # Beta(a, a) has mean 1/2 and variance 1 / (4 (2a + 1)); bounds are about 3.5 standard errors.
    assert abs(lam.mean() - 0.5) < 0.04
    assert abs(lam.var() - 1 / (4 * (2 * 0.4 + 1))) < 0.02


def test_symmetric_beta_matches_scipy_distribution():
    with float64_on_cpu():
        draw = jax.jit(jax.vmap(lambda u, a: symmetric_beta(u, a)["lam"], in_axes=(0, None)))
        for seed, alpha in enumerate((0.2, 1.0, 3.0)):
            unit = jax.random.uniform(jax.random.key(seed), (20000, UNIFORMS_PER_BETA), jnp.float64)
            assert scipy.stats.kstest(np.asarray(draw(unit, alpha)), scipy.stats.beta(alpha, alpha).cdf).pvalue > 1e-3


def coverage(shape, center, size):
    """Per-pixel area of a box, by explicit interval overlaps."""
    rows = [max(0.0, min(i + 1, center[0] + size[0] / 2) - max(i, center[0] - size[0] / 2)) for i in range(shape[0])]
    cols = [max(0.0, min(j + 1, center[1] + size[1] / 2) - max(j, center[1] - size[1] / 2)) for j in range(shape[1])]
    return np.outer(rows, cols)


def cutmix_reference(images, onehot, partner, lam, centers):
    """CutMix of a batch in numpy: images and area-weighted one-hot labels."""
    out, mixed = np.empty_like(images), np.empty_like(onehot)
    shape = images.shape[1:3]
    for i in range(len(images)):
        side = np.sqrt(1 - lam[i])
        mask = coverage(shape, centers[i], (side * shape[0], side * shape[1]))[..., None]
        out[i] = images[i] * (1 - mask) + images[partner[i]] * mask
        own = 1 - mask.mean()
        mixed[i] = own * onehot[i] + (1 - own) * onehot[partner[i]]
    return out, mixed


def test_cutmix_matches_numpy_box_and_area_weighted_labels():
    images, labels = batch(2)
    op = CutMixOperator(CutMixConfig(alpha=1.0, num_classes=NUM_CLASSES), rngs=nnx.Rngs(2))
    out, mixed, drawn = run(op, images, labels, BatchContext.for_batch(6))
    assert np.all((drawn["center"] >= 0) & (drawn["center"] <= [6, 8]))
    ref_out, ref_mixed = cutmix_reference(images.astype(np.float64), np.eye(NUM_CLASSES)[labels],
                                          drawn["partner"].astype(int), drawn["lam"], drawn["center"])
    np.testing.assert_allclose(out, ref_out, atol=1e-5)
    np.testing.assert_allclose(mixed, ref_mixed, atol=1e-5)


@pytest.mark.parametrize("op_class,config_class", [(MixUpOperator, MixUpConfig), (CutMixOperator, CutMixConfig)])
def test_alpha_gradient_matches_finite_differences_of_the_reparameterised_draws(op_class, config_class):
    with float64_on_cpu():
        rng = np.random.default_rng(4)
        images = rng.random((2, 4, 5, 1))
        labels = np.array([0, 1], np.int32)
        weights, label_weights = rng.normal(size=(2, 4, 5, 1)), np.array([0.3, -0.7])
        op = op_class(config_class(alpha=1.5, num_classes=2, learnable=True), rngs=nnx.Rngs(5))
        ctx = BatchContext.for_batch(2)

        @nnx.jit
        def loss_grad_draws(module):
            def loss(module, drawn):
                out = module.apply_drawn(Element({"image": jnp.asarray(images), "label": jnp.asarray(labels)}), drawn)
                return jnp.sum(out.data["image"] * weights) + jnp.sum(out.data["label"] * label_weights)

            # Drawing inside the differentiated function keeps alpha's path through the draws.
            def loss_and_draws(module):
                drawn = draw_parameters(module, ctx, images.shape[1:])
                return loss(module, drawn), drawn

            (value, drawn), grads = nnx.value_and_grad(loss_and_draws, has_aux=True)(module)
            return value, grads["magnitudes"]["alpha"]["raw"][...], drawn

        value, grad, drawn = loss_grad_draws(op)
        grad = float(grad)
        assert np.isfinite(grad) and grad != 0

        # The CDF values of the gamma draws at the starting alpha: the reparameterisation holds them fixed.
        drawn = {k: np.asarray(v) for k, v in drawn.items()}
        alpha0 = float(op.magnitudes["alpha"]())
        cdf = scipy.special.gammainc(alpha0 + 1, drawn["gamma_plus_one"])
        partner, onehot = drawn["partner"].astype(int), np.eye(2)[labels]

        def loss_reference(raw_value):
            alpha = float(bounded(raw_value, *op_class.bounds["alpha"]))
            log_g = np.log(scipy.special.gammaincinv(alpha + 1, cdf)) + drawn["log_boost"] / alpha
            lam = 1 / (1 + np.exp(log_g[:, 1] - log_g[:, 0]))
            if op_class is MixUpOperator:
                lam_image = lam[:, None, None, None]
                out = lam_image * images + (1 - lam_image) * images[partner]
                mixed = lam[:, None] * onehot + (1 - lam[:, None]) * onehot[partner]
            else:
                out, mixed = cutmix_reference(images, onehot, partner, lam, drawn["center"])
            return np.sum(out * weights) + np.sum(mixed * label_weights)

        raw, h = float(op.magnitudes["alpha"].raw[...]), 1e-5
        np.testing.assert_allclose(loss_reference(raw), float(value), rtol=1e-9)
        fd = (loss_reference(raw + h) - loss_reference(raw - h)) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-9)


ERRORS = [
    (lambda: MixUpConfig(), ValueError, r"MixUpConfig.num_classes must be an int >= 2 .*got 0; e.g. num_classes=10"),
    (lambda: CutMixConfig(num_classes=3, alpha=0.0), ValueError,
     r"CutMixConfig.alpha must be in \(0.001, 4.0\], got 0.0"),
    (lambda: MixUpConfig(num_classes=3, label_field=""), ValueError, r"MixUpConfig.label_field must be a non-empty"),
    (lambda: MixUpConfig(num_classes=3, stochastic=False), ValueError, r"stochastic=False\) has nothing to do"),
    (lambda: MixUpOperator(CutMixConfig(num_classes=3), rngs=nnx.Rngs(0)), TypeError,
     r"MixUpOperator config must be a MixUpConfig"),
]


@pytest.mark.parametrize("make,error,match", ERRORS)
def test_config_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("data,error,match", [
    ({"image": np.zeros((2, 4, 4, 1), np.float32)}, KeyError,
     r"reads field 'label', but the batch has fields \['image'\]"),
    ({"image": np.zeros((2, 4, 4, 1), np.float32), "label": np.zeros((2, 3), np.float32)}, ValueError,
     r"labels in field 'label' as int class ids \(B,\) or one-hot rows \(B, 5\)"),
    ({"image": np.zeros((2, 4, 4, 1), np.uint8), "label": np.zeros((2,), np.int32)}, ValueError,
     r"expects a batch of float HWC images in field 'image'"),
])
def test_batch_errors(data, error, match):
    op = MixUpOperator(MixUpConfig(num_classes=NUM_CLASSES), rngs=nnx.Rngs(0))
    with pytest.raises(error, match=match):
        op(Element({k: jnp.asarray(v) for k, v in data.items()}), BatchContext.for_batch(2))


ALPHA_IMAGES = np.random.default_rng(0).random((4, 4, 5, 1)).astype(np.float32)
ALPHA_LABELS = np.array([0, 1, 1, 0], np.int32)


def alpha_loss(module):
    out = module(Element({"image": jnp.asarray(ALPHA_IMAGES), "label": jnp.asarray(ALPHA_LABELS)}),
                 BatchContext.for_batch(4))
    return jnp.sum(out.data["image"]) + jnp.sum(out.data["label"] * jnp.arange(2.0))


# jitted, as a training step runs it; one function for every raw value, so each operator's program
# compiles once (the raw logit is a value in the module's state, not part of the program).
ALPHA_VALUE_AND_GRAD = nnx.jit(nnx.value_and_grad(alpha_loss))


@pytest.mark.parametrize("op_class,config_class", [(MixUpOperator, MixUpConfig), (CutMixOperator, CutMixConfig)])
@pytest.mark.parametrize("raw", [-60.0, -20.0, 0.0, 20.0])
def test_learnable_alpha_stays_where_forward_and_backward_are_finite(op_class, config_class, raw):
    """A learnable alpha driven to either end of its range (raw logit -60 gave alpha ~ 1e-26 and
    NaN gradients when the range started at 0) keeps finite outputs and gradients."""
    op = op_class(config_class(alpha=1.0, num_classes=2, learnable=True), rngs=nnx.Rngs(5))
    op.magnitudes["alpha"].raw[...] = jnp.float32(raw)
    value, grads = ALPHA_VALUE_AND_GRAD(op)
    assert np.isfinite(float(value))
    assert np.isfinite(np.asarray(grads["magnitudes"]["alpha"]["raw"][...])).all()
