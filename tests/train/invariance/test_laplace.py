"""The Laplace log evidence against references: a dense GGN Laplace evidence, finite differences, and
Bayesian linear regression's closed form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize
from flax import nnx
from jax.flatten_util import ravel_pytree
from on_cpu import float64_on_cpu

from datarax import Pipeline
from datarax.operators.audio import GainOperator
from datarax.operators.image import BrightnessOperator, RotationOperator, TranslateOperator
from datarax.sources import MemorySource
from datarax.train.invariance import InvariantModel, MarginalLikelihood, MarginalLikelihoodConfig
from datarax.train.invariance.laplace import (
    diagonal_hessian_sqrt,
    hessian_sqrt,
    laplace_terms,
    log_likelihood,
    log_marginal_likelihood,
)
from datarax.train.invariance.marglik import learned_magnitudes
from datarax.train.invariance.model import PriorPrecision, model_params

CLASSES = 3
ON_CPU = jax.default_backend() == "cpu"
# A TPU's float32 exp and log are off by up to about 1e-4 (relative; 6e-5 seen), a CPU's to float32's last bits.
EVIDENCE_RTOL = 2e-5 if ON_CPU else 1e-4
HESSIAN_ATOL = 1e-6 if ON_CPU else 3e-5  # on values near 0.2: 1.4e-5 seen


class MLP(nnx.Module):
    def __init__(self, inputs: int, hidden: int = 6, outputs: int = CLASSES, seed: int = 0, dtype=jnp.float32):
        self.hidden = nnx.Linear(inputs, hidden, rngs=nnx.Rngs(seed), param_dtype=dtype)
        self.out = nnx.Linear(hidden, outputs, rngs=nnx.Rngs(seed + 1), param_dtype=dtype)

    def __call__(self, x):
        return self.out(jnp.tanh(self.hidden(x.reshape(x.shape[0], -1))))


def image_set(n: int = 12, size: int = 4, seed: int = 0, dtype=np.float32) -> dict:
    rng = np.random.default_rng(seed)
    return {"image": rng.random((n, size, size, 1)).astype(dtype),
            "label": rng.integers(0, CLASSES, n).astype(np.int32)}


def invariant(stage, data: dict, field: str = "image", copies: int = 3, seed: int = 0, prior="layerwise",
              deltas=(0.5, 2.0, 1.5, 3.0)):
    pipeline = Pipeline(MemorySource(data=data), [stage] if stage is not None else [], batch_size=4)
    inputs = int(np.prod(data[field].shape[1:]))
    model = InvariantModel(MLP(inputs, seed=seed, dtype=data[field].dtype), pipeline, copies=copies, field=field,
                           prior=prior)
    if prior == "layerwise":  # distinct precisions per tensor, so their order matters to the test
        model.log_prior_precision[...] = jnp.log(jnp.asarray(deltas, jnp.float32))
    return model, pipeline


def raw_batch(data: dict, epoch: int = 0) -> dict:
    n = len(data["label"])
    return {**{k: jnp.asarray(v) for k, v in data.items()}, "record_ids": jnp.arange(n, dtype=jnp.int32),
            "epoch": jnp.full((n,), epoch, jnp.int32)}


def estimate(model: InvariantModel, batch: dict, subset_size: int, num_records: int | None = None,
             targets: str = "label", **kwargs):
    """`(value(hyper), hyper)`: the estimate as a function of the magnitudes and the log prior precision."""
    graphdef, theta, hyper, rest = nnx.split(model, model_params, nnx.Any(learned_magnitudes, PriorPrecision), ...)

    def value(hyper):
        def apply(theta, records):
            return nnx.merge(graphdef, theta, hyper, rest).outputs(records, through_augmentation=True)

        prior = nnx.merge(graphdef, theta, hyper, rest).prior_precision
        with jax.default_matmul_precision("float32"):  # as the hyper-step declares it (a TPU's default is lower)
            terms = laplace_terms(apply, theta, batch, batch[targets], num_records=num_records or len(batch[targets]),
                                  subset_size=subset_size, **kwargs)
        return log_marginal_likelihood(terms, prior)["log_marglik"]

    return jax.jit(value), hyper


def dense_evidence(model: InvariantModel, batch: dict) -> float:
    """The GGN Laplace evidence with the P x P matrix, in float64 on the host (the outputs and their
    Jacobian in float32 on the CPU, whatever the default backend)."""
    graphdef, theta, rest = nnx.split(model, model_params, ...)
    flat, unravel = ravel_pytree(theta)

    def outputs(vector):
        return nnx.merge(graphdef, unravel(vector), rest).outputs(batch)

    with jax.default_device(jax.devices("cpu")[0]):
        f = np.asarray(jax.jit(outputs)(flat), np.float64)
        jac = np.asarray(jax.jit(jax.jacobian(outputs))(flat), np.float64)  # (N, C, P)
    p = np.exp(f - f.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ggn = sum(jac[n].T @ (np.diag(p[n]) - np.outer(p[n], p[n])) @ jac[n] for n in range(len(f)))
    sizes = [x.size for x in jax.tree.leaves(theta)]
    delta = np.repeat(np.broadcast_to(np.asarray(model.prior_precision, np.float64), (len(sizes),)), sizes)
    theta64 = np.asarray(flat, np.float64)
    labels = np.asarray(batch["label"])
    log_lik = np.sum(np.log(p[np.arange(len(f)), labels]))
    _, log_det = np.linalg.slogdet(np.eye(len(theta64)) + ggn / delta[:, None])
    return log_lik - 0.5 * np.sum(delta * theta64**2) - 0.5 * log_det


@pytest.mark.parametrize("stage", [None, RotationOperator(degrees=40.0, learnable=True, rngs=nnx.Rngs(1))],
                         ids=["plain", "invariant"])
def test_equals_the_dense_ggn_laplace_evidence_and_is_a_lower_bound_on_subsets(stage):
    data = image_set()
    model, _ = invariant(stage, data)
    batch = raw_batch(data)
    dense = dense_evidence(model, batch)
    whole, hyper = estimate(model, batch, subset_size=12)
    np.testing.assert_allclose(float(whole(hyper)), dense, rtol=EVIDENCE_RTOL)
    for m in (1, 4, 6):  # the kernel's block-diagonal part: a lower bound (Fischer's inequality)
        value, hyper = estimate(model, batch, subset_size=m)
        assert float(value(hyper)) < dense


def test_the_single_output_estimate_averages_to_the_independent_outputs_evidence():
    """Over the draw of its one output, the single-output estimate is the Laplace evidence with the
    Hessian's diagonal and no cross-output kernel: sum_c log det(I_P + D^-1 sum_n p_nc (1 - p_nc) J_nc' J_nc)."""
    data = image_set()
    model, _ = invariant(RotationOperator(degrees=40.0, learnable=True, rngs=nnx.Rngs(1)), data)
    batch = raw_batch(data)
    graphdef, theta, rest = nnx.split(model, model_params, ...)
    flat, unravel = ravel_pytree(theta)

    def outputs(vector):
        return nnx.merge(graphdef, unravel(vector), rest).outputs(batch)

    with jax.default_device(jax.devices("cpu")[0]):  # the reference's float32 on the CPU, as in dense_evidence
        f = np.asarray(jax.jit(outputs)(flat), np.float64)
        jac = np.asarray(jax.jit(jax.jacobian(outputs))(flat), np.float64)
    p = np.exp(f - f.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    sizes = [x.size for x in jax.tree.leaves(theta)]
    delta = np.repeat(np.asarray(model.prior_precision, np.float64), sizes)
    log_det = sum(np.linalg.slogdet(np.eye(len(flat)) + sum(
        p[n, c] * (1 - p[n, c]) * np.outer(jac[n, c], jac[n, c]) for n in range(len(f))) / delta[:, None])[1]
        for c in range(CLASSES))
    labels = np.asarray(batch["label"])
    log_prior = -0.5 * np.sum(delta * np.asarray(flat, np.float64) ** 2)
    expected = np.sum(np.log(p[np.arange(len(f)), labels])) + log_prior - 0.5 * log_det
    graphdef, theta, hyper, rest = nnx.split(model, model_params, nnx.Any(learned_magnitudes, PriorPrecision), ...)

    @jax.jit
    def draw(c):  # the estimate with output c drawn (values are taken modulo C)
        def apply(theta, records):
            return nnx.merge(graphdef, theta, hyper, rest).outputs(records, through_augmentation=True)

        with jax.default_matmul_precision("float32"):  # as the hyper-step declares it
            terms = laplace_terms(apply, theta, batch, batch["label"], num_records=12, subset_size=12,
                                  single_outputs=c[None])
        return log_marginal_likelihood(terms, model.prior_precision)["log_marglik"]

    draws = [float(draw(jnp.int32(c + CLASSES))) for c in range(CLASSES)]
    np.testing.assert_allclose(np.mean(draws), expected, rtol=2e-5)


def test_the_likelihood_hessian_roots_and_log_likelihoods_match_their_definitions():
    f = jnp.asarray(np.random.default_rng(0).normal(size=(5, 4)), jnp.float32)
    p = np.asarray(jax.nn.softmax(f))
    roots = np.asarray(hessian_sqrt(f, "categorical"))
    hessians = np.asarray(jax.jit(jax.vmap(jax.hessian(lambda z: -jax.nn.log_softmax(z)[1])))(f))
    for n in range(5):
        np.testing.assert_allclose(roots[n] @ roots[n].T, np.diag(p[n]) - np.outer(p[n], p[n]), atol=HESSIAN_ATOL)
        np.testing.assert_allclose(hessians[n], roots[n] @ roots[n].T, atol=HESSIAN_ATOL)
    np.testing.assert_allclose(np.asarray(hessian_sqrt(f, "gaussian", 4.0))[2], 2.0 * np.eye(4))
    classes = jnp.asarray([0, 1, 2, 3, 5])  # taken modulo C = 4
    diagonal = np.asarray(diagonal_hessian_sqrt(f, classes, "categorical"))[:, 0, 0] ** 2
    picked = p[np.arange(5), np.asarray(classes) % 4]
    np.testing.assert_allclose(diagonal, picked * (1 - picked), rtol=1e-5 if ON_CPU else 3e-4)
    confident = jnp.asarray([[40.0, -40.0]])  # p underflows: the roots' gradients stay finite
    for fn in (lambda z: hessian_sqrt(z, "categorical").sum(), lambda z: diagonal_hessian_sqrt(
            z, jnp.asarray([1]), "categorical").sum()):
        assert np.all(np.isfinite(np.asarray(jax.jit(jax.grad(fn))(confident))))
    y = np.asarray([0, 3, 1, 1, 2])
    np.testing.assert_allclose(np.asarray(log_likelihood(f, jnp.asarray(y), "categorical")),
                               np.log(p[np.arange(5), y]), rtol=1e-5 if ON_CPU else 1e-4)
    target = np.zeros((5, 4), np.float32)
    expected = -2.0 * np.sum(np.asarray(f) ** 2, 1) + 2 * np.log(4.0 / (2 * np.pi))
    np.testing.assert_allclose(np.asarray(log_likelihood(f, jnp.asarray(target), "gaussian", 4.0)), expected,
                               rtol=1e-5 if ON_CPU else 1e-4)


def audio_set(n: int = 12, seed: int = 0, dtype=np.float32) -> dict:
    rng = np.random.default_rng(seed)
    return {"audio": (0.3 * rng.normal(size=(n, 16))).astype(dtype),
            "label": rng.integers(0, CLASSES, n).astype(np.int32)}


# Bilinear warps are piecewise smooth in their angle or shift (a kink where a sample crosses a pixel), so a
# central difference over them agrees less closely than over the smooth colour and gain maps.
GRADIENT_CASES = [
    ("rotation", lambda: RotationOperator(degrees=25.0, learnable=True, parameterisation="tanh", rngs=nnx.Rngs(3)),
     "image", 1e-2),
    ("translate", lambda: TranslateOperator(translate=0.2, learnable=True, rngs=nnx.Rngs(3)), "image", 1e-2),
    ("brightness", lambda: BrightnessOperator(max_delta=0.3, learnable=True, rngs=nnx.Rngs(3)), "image", 1e-5),
    ("gain", lambda: GainOperator(gain_db=0.0, max_delta_db=6.0, learnable=("max_delta_db",),
                                  parameterisation="tanh", field="audio", rngs=nnx.Rngs(3)), "audio", 1e-5),
]


@pytest.mark.parametrize("name,make,field,rtol", GRADIENT_CASES, ids=[c[0] for c in GRADIENT_CASES])
def test_the_width_gradient_matches_a_central_difference(name, make, field, rtol):
    with float64_on_cpu():  # a TPU has no float64 arithmetic of its own
        data = audio_set(dtype=np.float64) if field == "audio" else image_set(dtype=np.float64)
        model, _ = invariant(make(), data, field=field)
        batch = raw_batch(data)
        value, hyper = estimate(model, batch, subset_size=4, num_records=100)
        grads = jax.jit(jax.grad(value))(hyper)
        leaves, treedef = jax.tree.flatten(hyper)
        raw = [i for i, x in enumerate(leaves) if x.ndim == 0]  # the magnitude; the other leaf is the prior
        assert len(raw) == 1
        (i,) = raw
        eps = 1e-5

        def at(shift):
            moved = list(leaves)
            moved[i] = leaves[i] + shift
            return float(value(jax.tree.unflatten(treedef, moved)))

        central = (at(eps) - at(-eps)) / (2 * eps)
        analytic = float(jax.tree.leaves(grads)[i])
        assert abs(central) > 1e-3  # the width matters here
        np.testing.assert_allclose(analytic, central, rtol=rtol)


def test_the_prior_precision_is_recovered_on_bayesian_linear_regression():
    rng = np.random.default_rng(0)
    n, d, noise_precision = 40, 5, 4.0
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(d, 1)) * 0.7
    y = (x @ w + rng.normal(size=(n, 1)) / np.sqrt(noise_precision)).astype(np.float32)
    data = {"x": x, "y": y}
    pipeline = Pipeline(MemorySource(data=data), [], batch_size=8)
    linear = nnx.Linear(d, 1, rngs=nnx.Rngs(0))
    model = InvariantModel(linear, pipeline, copies=1, field="x", prior="scalar", prior_precision=1.0)
    marglik = MarginalLikelihood(model, pipeline, MarginalLikelihoodConfig(
        records=n, subset_size=n, likelihood="gaussian", noise_precision=noise_precision, targets="y",
        learning_rate=0.1))
    features = np.concatenate([x, np.ones((n, 1))], 1).astype(np.float64)

    def map_weights(delta):  # the MAP of the Gaussian likelihood under N(0, 1/delta)
        a = noise_precision * features.T @ features + delta * np.eye(d + 1)
        return np.linalg.solve(a, noise_precision * features.T @ y.astype(np.float64))

    def evidence(log_delta):  # the exact log evidence of Bayesian linear regression
        delta = np.exp(log_delta)
        cov = np.eye(n) / noise_precision + features @ features.T / delta
        _, log_det = np.linalg.slogdet(2 * np.pi * cov)
        return -0.5 * (log_det + y[:, 0] @ np.linalg.solve(cov, y[:, 0]))

    best = scipy.optimize.minimize_scalar(lambda v: -evidence(v), bounds=(-8, 8), method="bounded").x
    for _ in range(60):  # the weights at their MAP for the current precision, then one hyper-step (11 Adam steps)
        theta = map_weights(float(model.prior_precision))
        linear.kernel[...] = jnp.asarray(theta[:d], jnp.float32)
        linear.bias[...] = jnp.asarray(theta[d], jnp.float32)
        marglik.hyper_step(epoch=0)
    np.testing.assert_allclose(float(model.log_prior_precision[...]), best, atol=0.02)
    assert marglik._step._cache_size() == 1  # one program for all 60 (the first call's state placed as later ones)
    # At the optimum the estimate is the exact evidence (the Laplace approximation is exact here).
    theta = map_weights(float(model.prior_precision))
    linear.kernel[...] = jnp.asarray(theta[:d], jnp.float32)
    linear.bias[...] = jnp.asarray(theta[d], jnp.float32)
    out = marglik.hyper_step(epoch=0)
    np.testing.assert_allclose(out["log_marglik"] * n, evidence(best), rtol=1e-4)
