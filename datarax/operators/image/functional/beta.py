"""Beta(alpha, alpha) mixing weights that compile fast and are differentiable in alpha.

Gamma(alpha + 1) by Marsaglia-Tsang with `PROPOSALS` proposals at once, boosted by
`u ** (1 / alpha)`, with the implicit reparameterisation gradient; see docs/operators.md,
"Definitions".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PROPOSALS = 8


@jax.custom_jvp
def gamma_from_proposals(shape: jax.Array, normals: jax.Array, uniforms: jax.Array) -> jax.Array:
    """Marsaglia-Tsang Gamma(shape) draw (shape >= 1) from proposal normals and uniforms (last axis)."""
    d = jnp.asarray(shape)[..., None] - 1.0 / 3.0
    c = 1.0 / jnp.sqrt(9.0 * d)
    v = (1.0 + c * normals) ** 3
    tiny = jnp.finfo(v.dtype).tiny
    safe_v = jnp.maximum(v, tiny)
    accept = (v > 0) & (jnp.log(uniforms) < 0.5 * normals**2 + d - d * v + d * jnp.log(safe_v))
    first = jnp.argmax(accept, axis=-1)[..., None]
    return (d * jnp.take_along_axis(safe_v, first, axis=-1))[..., 0]


@gamma_from_proposals.defjvp
def _gamma_from_proposals_jvp(primals, tangents):
    shape, normals, uniforms = primals
    draw = gamma_from_proposals(shape, normals, uniforms)
    shape_dot = tangents[0]
    grad = jax.lax.random_gamma_grad(jnp.broadcast_to(shape, draw.shape).astype(draw.dtype), draw)
    return draw, grad * shape_dot


UNIFORMS_PER_GAMMA = 2 * PROPOSALS + 1


def log_gamma(unit: jax.Array, alpha: jax.Array | float) -> dict[str, jax.Array]:
    """Draws `log g` with `g ~ Gamma(alpha)` from uniforms `unit` of shape (..., UNIFORMS_PER_GAMMA).

    Returns a dict with `log_gamma` (the draw), `gamma_plus_one` (the Gamma(alpha + 1) draw) and
    `log_boost` (`log u`), each of shape `unit.shape[:-1]`. The caller draws the uniforms in one
    block (normals come from them by Box-Muller) because every random-number call site costs
    compile time.
    """
    tiny = jnp.finfo(unit.dtype).tiny
    unit = jnp.maximum(unit, tiny)
    radius = jnp.sqrt(-2.0 * jnp.log(unit[..., :PROPOSALS // 2]))
    angle = 2.0 * jnp.pi * unit[..., PROPOSALS // 2:PROPOSALS]
    normals = jnp.concatenate([radius * jnp.cos(angle), radius * jnp.sin(angle)], axis=-1)
    alpha = jnp.asarray(alpha, unit.dtype)
    draw = gamma_from_proposals(jnp.broadcast_to(alpha + 1.0, unit.shape[:-1]), normals,
                                unit[..., PROPOSALS:2 * PROPOSALS])
    log_boost = jnp.log(unit[..., -1])
    return {"log_gamma": jnp.log(draw) + log_boost / alpha, "gamma_plus_one": draw, "log_boost": log_boost}


UNIFORMS_PER_BETA = 2 * UNIFORMS_PER_GAMMA


def symmetric_beta(unit: jax.Array, alpha: jax.Array | float) -> dict[str, jax.Array]:
    """`lam ~ Beta(alpha, alpha)` as `g1 / (g1 + g2)` of two Gamma(alpha) draws, in log space.

    `unit` holds `UNIFORMS_PER_BETA` uniforms in [0, 1). Returns a dict with `lam` and the gamma
    parts behind it (each of shape (2,), see `log_gamma`).
    """
    parts = log_gamma(unit.reshape(2, UNIFORMS_PER_GAMMA), alpha)
    lam = jax.nn.sigmoid(parts["log_gamma"][0] - parts["log_gamma"][1])
    return {"lam": lam, "gamma_plus_one": parts["gamma_plus_one"], "log_boost": parts["log_boost"]}
