"""The Laplace marginal likelihood of a network, with a kernel log-determinant on data subsets.

At parameters theta (a MAP under the prior N(0, D^-1), D = diag(delta), one precision per
parameter tensor, or one for all), the generalised Gauss-Newton (GGN) Laplace approximation of
the log evidence of N records is

    log p(D) ~= sum_n log p(y_n | f_n) - 1/2 theta' D theta - 1/2 log det(I_P + D^-1 sum_n J_n' L_n J_n)

(the `1/2 log det D` of the prior's normaliser cancels the one of `log det(D + GGN)`), with
`f_n` the outputs, `J_n = df_n/dtheta` (C x P) and `L_n` the likelihood's Hessian in the outputs
(`diag(p) - p p'` for a softmax, `tau I` for a Gaussian of noise precision tau). Writing
`L_n = M_n M_n'`, the determinant over P parameters equals one over the outputs (Sylvester):
`det(I_P + D^-1 G'G) = det(I_NC + G D^-1 G')`, `G` the rows `M_n' J_n`, and `G D^-1 G'` is the
network's (likelihood-weighted) neural tangent kernel under the prior. Here it is taken on subsets of m records:
the kernel's block-diagonal part, whose log-determinant is an upper bound of the whole one
(Fischer's inequality), so the estimate is a lower bound of the Laplace evidence, exact when one
subset holds all the data (Immer et al. 2023, "Stochastic Marginal Likelihood Gradients using
Neural Tangent Kernels"). A random sample of H records scaled by N / H gives an unbiased
estimate of that bound and of its gradient in the hyperparameters (the augmentation magnitudes,
through `f` and `J`, and delta), with no horizon and no regulariser to tune.

Cost: per record C reverse-mode passes of the model for its Jacobian (each over its S copies for
an invariant model), one `(mC x P) (P x mC)` contraction per subset and a Cholesky of `mC x mC`;
the hyperparameter gradient differentiates through them (about three times that again). The
*single-output* estimator (`single_outputs`, Immer et al. 2023's cheapest) cuts the C passes to
one: it keeps the Hessian's diagonal `p_c (1 - p_c)` (outputs treated as independent, which drops
the kernel's cross-output blocks) and estimates the sum over the C outputs' log-determinants by C
times that of one output drawn per subset, unbiased over the draws; a subset's kernel is then
`m x m`, so m can be C times larger at the cost of one full block. The contractions are float32
at `precision=HIGHEST` (a TPU's default float32 matmul keeps about three digits, too few for a
log-determinant).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

LIKELIHOODS = ("categorical", "gaussian")
HIGHEST = jax.lax.Precision.HIGHEST


def log_likelihood(outputs: jax.Array, targets: jax.Array, likelihood: str, noise_precision: float = 1.0
                   ) -> jax.Array:
    """`log p(y_n | f_n)` per record: a softmax over `outputs` (C logits) and integer `targets`, or a
    Gaussian of precision `noise_precision` around `outputs` (targets shaped like them)."""
    if likelihood == "categorical":
        logp = jax.nn.log_softmax(outputs, axis=-1)
        return jnp.take_along_axis(logp, targets.astype(jnp.int32)[:, None], axis=-1)[:, 0]
    residual = (targets.reshape(outputs.shape) - outputs).reshape(outputs.shape[0], -1)
    dims = residual.shape[1]
    return (-0.5 * noise_precision * jnp.sum(jnp.square(residual), axis=1)
            + 0.5 * dims * jnp.log(noise_precision / (2 * jnp.pi)))


def hessian_sqrt(outputs: jax.Array, likelihood: str, noise_precision: float = 1.0) -> jax.Array:
    """`M_n` (n, C, C) with `M_n M_n'` the negative log-likelihood's Hessian in the outputs.

    Softmax: `M = diag(sqrt(p)) - p sqrt(p)'` (then `M M' = diag(p) - p p'`, using `sum(p) = 1`);
    Gaussian: `sqrt(tau) I`. `sqrt(p)` is `exp(log_softmax / 2)`, whose gradient stays finite where
    a confident prediction makes p underflow (the square root's gradient at 0 is infinite).
    """
    n, c = outputs.shape[0], outputs.shape[-1]
    if likelihood == "categorical":
        log_p = jax.nn.log_softmax(outputs, axis=-1)
        p, root = jnp.exp(log_p), jnp.exp(0.5 * log_p)
        return jax.vmap(jnp.diag)(root) - p[:, :, None] * root[:, None, :]
    return jnp.broadcast_to(jnp.sqrt(noise_precision) * jnp.eye(c, dtype=outputs.dtype), (n, c, c))


def diagonal_hessian_sqrt(outputs: jax.Array, classes: jax.Array, likelihood: str, noise_precision: float = 1.0
                          ) -> jax.Array:
    """`(n, 1, 1)`: the square root of the Hessian's diagonal entry at output `classes[n] % C`:
    `sqrt(p_c (1 - p_c))` for a softmax (from log-probabilities, finite in its gradient however
    confident the prediction), `sqrt(tau)` for a Gaussian."""
    if likelihood == "categorical":
        c = outputs.shape[-1]
        chosen = jax.nn.one_hot(classes % c, c, dtype=bool)
        log_p = jnp.sum(jnp.where(chosen, jax.nn.log_softmax(outputs, axis=-1), 0.0), axis=-1)
        log_rest = (jax.nn.logsumexp(jnp.where(chosen, -jnp.inf, outputs), axis=-1)
                    - jax.nn.logsumexp(outputs, axis=-1))
        return jnp.exp(0.5 * (log_p + log_rest))[:, None, None]
    return jnp.full((outputs.shape[0], 1, 1), jnp.sqrt(noise_precision), outputs.dtype)


def per_leaf(prior_precision: jax.Array, count: int) -> jax.Array:
    """`(count,)` precisions, one per parameter tensor, from one (`()`) or one per tensor (`(count,)`)."""
    prior_precision = jnp.asarray(prior_precision)
    if prior_precision.ndim == 0:
        return jnp.broadcast_to(prior_precision, (count,))
    if prior_precision.shape != (count,):
        raise ValueError(f"prior_precision must be one number or one per parameter tensor ({count}), got shape "
                         f"{prior_precision.shape}")
    return prior_precision


def subset_kernels(jacobians: Any, roots: jax.Array, subset_size: int) -> jax.Array:
    """`(L, b, mK, mK)`: each parameter tensor's share `G_b G_b'` of the kernel of each subset b of
    `subset_size` consecutive records (K rows per record: `roots.shape[1]`).

    Args:
        jacobians: a pytree like the parameters, L leaves `(n, K, *leaf_shape)`.
        roots: `(n, C, K)`: `G_n = M_n' J_n`, so `M_n` of `hessian_sqrt` (K = C) or of
            `diagonal_hessian_sqrt` (K = 1).
        subset_size: m, which must divide n.
    """
    leaves = jax.tree.leaves(jacobians)
    n, k = roots.shape[0], roots.shape[2]
    if n % subset_size:
        raise ValueError(f"subset_size={subset_size} must divide the {n} records of a hyper-step")
    out = []
    for leaf in leaves:
        g = jnp.einsum("nkc,nkp->ncp", roots, leaf.reshape(n, roots.shape[1], -1), precision=HIGHEST)
        g = g.reshape(n // subset_size, subset_size * k, -1)
        out.append(jnp.einsum("bip,bjp->bij", g, g, precision=HIGHEST))
    return jnp.stack(out)


def kernel_log_det(kernels: jax.Array, prior_precision: jax.Array) -> jax.Array:
    """`sum_b log det(I + sum_l K_lb / delta_l)` of `subset_kernels`' output."""
    deltas = per_leaf(prior_precision, kernels.shape[0])
    total = jnp.tensordot(1.0 / deltas, kernels, axes=1, precision=HIGHEST)
    chol = jnp.linalg.cholesky(jnp.eye(total.shape[-1], dtype=total.dtype) + total)
    return 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)))


def per_record_jacobians(apply: Callable[[Any, Any], jax.Array], params: Any, records: Any) -> tuple[jax.Array, Any]:
    """`(outputs (n, C), jacobians)` of `apply(params, one_record_batch) -> (1, C)` for each record.

    Each record's outputs depend on that record alone, so its Jacobian is C reverse passes over it
    (`jax.jacrev`, vmapped over the records).
    """
    def one(record):
        single = jax.tree.map(lambda x: x[None], record)
        out = apply(params, single)[0]
        return out, jax.jacrev(lambda p: apply(p, single)[0])(params)

    return jax.vmap(one)(records)


def single_output_jacobians(apply: Callable[[Any, Any], jax.Array], params: Any, records: Any,
                            classes: jax.Array) -> tuple[jax.Array, Any]:
    """`(outputs (n, C), jacobians)` with each record's Jacobian row of output `classes[n] % C` only (one
    reverse pass per record): leaves `(n, 1, *leaf_shape)`."""
    def one(record, c):
        single = jax.tree.map(lambda x: x[None], record)
        out, pullback = jax.vjp(lambda p: apply(p, single)[0].reshape(-1), params)
        (row,) = pullback(jax.nn.one_hot(c % out.shape[-1], out.shape[-1], dtype=out.dtype))
        return out, jax.tree.map(lambda g: g[None], row)

    return jax.vmap(one)(records, classes)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LaplaceTerms:
    """What the Laplace evidence of a sample needs besides the prior precision (`laplace_terms`).

    Attributes:
        log_lik: `sum_n log p(y_n | f_n)` over the sample.
        kernels: `(L, b, mK, mK)`, `subset_kernels` of the sample.
        squares: `(L,)`, `||theta_l||^2` per parameter tensor.
        scale: N over the sample's records times, for the single-output kernel, C (the outputs one
            stands for), as the log-determinant is scaled.
        records: N / n, as the log-likelihood is scaled.
    """

    log_lik: jax.Array
    kernels: jax.Array
    squares: jax.Array
    scale: jax.Array
    records: jax.Array


def laplace_terms(apply: Callable[[Any, Any], jax.Array], params: Any, records: Any, targets: jax.Array, *,
                  num_records: int, subset_size: int, likelihood: str = "categorical", noise_precision: float = 1.0,
                  single_outputs: jax.Array | None = None) -> LaplaceTerms:
    """The data-dependent terms of the Laplace evidence of `num_records` records, from a sample of them.

    Args:
        apply: `apply(params, batch) -> outputs (n, C)`, each record's outputs from that record alone.
        params: theta, the parameters the Laplace approximation is taken at.
        records: a batch pytree of the n sampled records, as `apply` takes it.
        targets: `(n,)` class indices, or the Gaussian's targets shaped like the outputs.
        num_records: N, the training records the sample stands for.
        subset_size: m, the records per kernel block (it divides n).
        likelihood: "categorical" (softmax) or "gaussian".
        noise_precision: tau of the Gaussian likelihood.
        single_outputs: None for the full kernel; else `(n // subset_size,)` non-negative ints, one per
            subset, whose value modulo C is the output of the single-output estimator (see the module
            docstring), so a caller can draw them without knowing C.

    Differentiable in whatever `apply` closes over (the augmentation magnitudes).
    """
    if likelihood not in LIKELIHOODS:
        raise ValueError(f"likelihood must be one of {LIKELIHOODS}, got {likelihood!r}")
    n = jax.tree.leaves(records)[0].shape[0]
    if single_outputs is None:
        outputs, jacobians = per_record_jacobians(apply, params, records)
        roots = hessian_sqrt(outputs.reshape(n, -1), likelihood, noise_precision)
        factor = 1
    else:
        if n % subset_size or single_outputs.shape != (n // subset_size,):
            raise ValueError(f"single_outputs must hold one output per subset of {subset_size} records "
                             f"({n // subset_size}), got shape {single_outputs.shape}")
        classes = jnp.repeat(jnp.asarray(single_outputs, jnp.int32), subset_size)
        outputs, jacobians = single_output_jacobians(apply, params, records, classes)
        roots = diagonal_hessian_sqrt(outputs.reshape(n, -1), classes, likelihood, noise_precision)
        factor = outputs.reshape(n, -1).shape[1]  # C outputs, one of them drawn
    log_lik = jnp.sum(log_likelihood(outputs.reshape(n, -1), targets, likelihood, noise_precision))
    squares = jnp.stack([jnp.sum(jnp.square(p)) for p in jax.tree.leaves(params)])
    scale = jnp.asarray(num_records / n, jnp.float32)
    return LaplaceTerms(log_lik, subset_kernels(jacobians, roots, subset_size), squares, factor * scale, scale)


def log_marginal_likelihood(terms: LaplaceTerms, prior_precision: jax.Array) -> dict[str, jax.Array]:
    """The Laplace log evidence of N records from `laplace_terms` (see the module docstring).

    Args:
        terms: the sample's terms.
        prior_precision: delta, one number or one per parameter tensor (in `jax.tree.leaves(params)` order).

    Returns:
        `{"log_marglik": the estimate, "log_lik": the data-fit term, "log_det": the Occam term's
        log-determinant, "log_prior": -1/2 theta' D theta}`, each on the scale of N records.
    """
    deltas = per_leaf(prior_precision, terms.squares.shape[0])
    log_lik = terms.records * terms.log_lik
    log_det = terms.scale * kernel_log_det(terms.kernels, deltas)
    log_prior = -0.5 * jnp.sum(deltas * terms.squares)
    return {"log_marglik": log_lik + log_prior - 0.5 * log_det, "log_lik": log_lik, "log_det": log_det,
            "log_prior": log_prior}
