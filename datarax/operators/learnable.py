"""Bounded magnitudes: operator parameters that are fixed numbers or learnable within a range.

A learnable magnitude is an `nnx.Param` `raw` read through one of three parameterisations
(`PARAMETERISATIONS`), initialised to the configured value, so training cannot push it out of
its range:

* `"sigmoid"` (the default): `low + (high - low) * sigmoid(raw)`, strictly inside `(low, high)`.
  It cannot start at a bound: the sigmoid's gradient vanishes there.
* `"tanh"`: `high * tanh(raw)`, a *signed* value in `(-high, high)` whose size is the magnitude.
  Only for a spread (the half-width of a draw symmetric about its centre, `low == 0`): a draw
  `U(-m, m)` is the same for `m` and `-m`, so the sign does not matter, and the gradient at 0 is
  `high`, not flat, so a width can start at exactly 0 and grow (as the rotation width of an
  invariance learned by marginal likelihood does). `Magnitude.value()` gives the size.
  Its top is flat: a step of `raw` moves the width 1 - (m / high)^2 as far as at 0, a tenth at
  95% of `high`, and nothing pulls a width back that overshot towards the bound.
* `"triangle"`: `high * tri(raw)`, the signed triangle wave of period 4 (`tri(r) = r` on
  `[-1, 1]`, reflected at the bounds: `tri(1 + r) = 1 - r`). The same spreads as `"tanh"`, the
  same gradient `high` at 0, but `high` everywhere: a step of `raw` moves the width as far
  anywhere in the range, and a step past the bound comes back inside. Adam (whose steps have
  about the size of its rate in `raw`) then moves a width started near the bound as fast as one
  started at 0 (docs/invariance.md).

A fixed magnitude is a plain Python float. Random magnitudes are reparameterised (a unit draw
scaled by the magnitude), so gradients reach them.

Example:
    >>> strength = Magnitude(0.2, high=1.0, learnable=True, name="max_delta")
    >>> delta = signed_uniform(jax.random.key(0), strength())  # in [-0.2, 0.2], differentiable
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.checks import is_number

Learnable = bool | tuple[str, ...]
PARAMETERISATIONS = ("sigmoid", "tanh", "triangle")
SIGNED = ("tanh", "triangle")  # a signed value whose size is the magnitude: spreads only


def bounded(raw: jax.Array, low: float, high: float) -> jax.Array:
    """Maps an unbounded logit into `(low, high)`: `low + (high - low) * sigmoid(raw)`."""
    return low + (high - low) * jax.nn.sigmoid(raw)


def inverse_bounded(value: float, low: float, high: float, *, name: str = "magnitude") -> float:
    """The logit `raw` with `bounded(raw, low, high) == value`; `value` must lie strictly inside."""
    if not low < value < high:
        raise ValueError(
            f"learnable {name} must lie strictly inside ({low}, {high}), got {value!r}; the sigmoid "
            f"bound cannot start at its edge (its gradient vanishes there): pick a value inside the "
            f"range or make {name} fixed (learnable=False or leave it out of the learnable tuple)"
        )
    fraction = (value - low) / (high - low)
    return math.log(fraction) - math.log1p(-fraction)


def triangle(raw: jax.Array) -> jax.Array:
    """The signed triangle wave of period 4: `raw` on `[-1, 1]`, reflected at -1 and 1 (slope +-1 everywhere)."""
    t = jnp.mod(raw + 1.0, 4.0) - 1.0  # in [-1, 3): rising on [-1, 1), falling on [1, 3)
    return jnp.where(t < 1.0, t, 2.0 - t)


def check_parameterisation(parameterisation: object, owner: str) -> str:
    """Validates a config's `parameterisation` field (one of `PARAMETERISATIONS`)."""
    if parameterisation not in PARAMETERISATIONS:
        raise ValueError(f"{owner}.parameterisation must be one of {PARAMETERISATIONS}, got {parameterisation!r}")
    return parameterisation


class Magnitude(nnx.Module):
    """One operator magnitude in `[low, high]`, either fixed or learnable.

    Args:
        value: the configured (starting) value.
        high: the upper bound of the range.
        low: the lower bound of the range.
        learnable: hold the value as an `nnx.Param` (see the module docstring).
        name: the configuration field this magnitude comes from (used in error messages).
        parameterisation: how a learnable value is read from its `raw` parameter, `"sigmoid"`,
            `"tanh"` or `"triangle"` (the last two a spread only: `low` must be 0; see the module
            docstring).

    Calling the module returns the current value the operator uses: a traced scalar when
    learnable (signed under `"tanh"` and `"triangle"`), the Python float otherwise.
    """

    def __init__(self, value: float, *, high: float, low: float = 0.0, learnable: bool = False,
                 name: str = "magnitude", parameterisation: str = "sigmoid"):
        if not is_number(value):
            raise TypeError(f"{name} must be a finite number, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"{name} must lie in [{low}, {high}], got {value!r}; pick a value in that range")
        check_parameterisation(parameterisation, name)
        self.low = float(low)
        self.high = float(high)
        self.name = name
        self.learnable = bool(learnable)
        self.parameterisation = parameterisation if self.learnable else "sigmoid"
        if self.learnable and self.parameterisation in SIGNED:
            if low != 0:
                raise ValueError(f"{name}: parameterisation {parameterisation!r} is for a spread whose range starts "
                                 f"at 0, got [{low}, {high}]; use the default 'sigmoid'")
            if parameterisation == "tanh" and not value < high:
                raise ValueError(f"learnable {name} must lie in [0, {high}) under the 'tanh' parameterisation "
                                 f"(tanh reaches {high} only at infinity), got {value!r}; pick a value below it or "
                                 "use parameterisation='triangle', which reaches it")
            start = math.atanh(value / high) if parameterisation == "tanh" else value / high
            self.raw = nnx.Param(jnp.asarray(start, dtype=float))
        elif self.learnable:
            # dtype=float is the canonical float: float32, or float64 when x64 is enabled.
            self.raw = nnx.Param(jnp.asarray(inverse_bounded(value, low, high, name=name), dtype=float))
        else:
            self.fixed = float(value)

    def __call__(self) -> jax.Array | float:
        if not self.learnable:
            return self.fixed
        if self.parameterisation == "tanh":
            return self.high * jnp.tanh(self.raw[...])
        if self.parameterisation == "triangle":
            return self.high * triangle(self.raw[...])
        return bounded(self.raw[...], self.low, self.high)

    def value(self) -> jax.Array | float:
        """The magnitude in `[low, high]`: what calling it returns, as a size under the signed parameterisations
        (`|high * tanh(raw)|`, `|high * triangle(raw)|`)."""
        out = self()
        return jnp.abs(out) if self.parameterisation in SIGNED else out


class ChannelMagnitude(nnx.Module):
    """A per-channel magnitude in `[low, high]`: one fixed float, or a learnable `(n,)` logit vector.

    When learnable every channel starts at `value` and is read as `bounded(raw, low, high)`.
    """

    def __init__(self, value: float, n: int, *, low: float, high: float, learnable: bool, name: str):
        self.learnable = learnable
        if learnable:
            self.low, self.high = low, high
            self.raw = nnx.Param(jnp.full((n,), inverse_bounded(value, low, high, name=name), dtype=float))
        else:
            self.fixed = float(value)

    def __call__(self) -> jax.Array | float:
        return bounded(self.raw[...], self.low, self.high) if self.learnable else self.fixed


def learnable_names(learnable: Learnable, available: Sequence[str], *, owner: str) -> frozenset[str]:
    """Resolves a config's `learnable` field to the set of magnitude names to make learnable.

    `learnable` is True (all of `available`), False (none), or a tuple naming some of them.
    """
    if isinstance(learnable, bool):
        return frozenset(available) if learnable else frozenset()
    if not isinstance(learnable, tuple) or not all(isinstance(n, str) for n in learnable):
        raise TypeError(f"{owner}.learnable must be True, False or a tuple of field names, got {learnable!r}")
    unknown = sorted(set(learnable) - set(available))
    if unknown:
        raise ValueError(f"{owner}.learnable names {unknown}, which are not learnable magnitudes of this operator; "
                         f"choose from {list(available)}")
    return frozenset(learnable)


def check_learnable_field(learnable: object, owner: str) -> Learnable:
    """Validates (and normalises lists to tuples) a config's `learnable` field in `__post_init__`."""
    if isinstance(learnable, list):
        learnable = tuple(learnable)
    if not isinstance(learnable, (bool, tuple)) or (
            isinstance(learnable, tuple) and not all(isinstance(n, str) for n in learnable)):
        raise TypeError(f"{owner}.learnable must be True, False or a tuple of field names, got {learnable!r}")
    return learnable


def magnitudes(config: object, bounds: dict[str, tuple[float, float]], *, owner: str,
               chosen: frozenset[str] | None = None) -> nnx.Dict:
    """Builds one `Magnitude` per entry of `bounds` from the same-named fields of `config`.

    `bounds` maps a config field name to its `(low, high)` range; `chosen` (by default resolved
    from `config.learnable`) says which of them are learnable, read through
    `config.parameterisation` when the config has one. Operator classes call this once in their
    constructor.
    """
    if chosen is None:
        chosen = learnable_names(config.learnable, list(bounds), owner=owner)
    parameterisation = getattr(config, "parameterisation", "sigmoid")
    return nnx.Dict({
        name: Magnitude(getattr(config, name), low=low, high=high, learnable=name in chosen,
                        name=f"{owner}.{name}", parameterisation=parameterisation)
        for name, (low, high) in bounds.items()
    })


def uniform(key: jax.Array, low: jax.Array | float, high: jax.Array | float,
            shape: tuple[int, ...] = ()) -> jax.Array:
    """A uniform draw in `[low, high)`, reparameterised: differentiable in `low` and `high`."""
    u = jax.random.uniform(key, shape, dtype=jnp.result_type(float))
    return low + (high - low) * u


def signed_uniform(key: jax.Array, magnitude: jax.Array | float, shape: tuple[int, ...] = ()) -> jax.Array:
    """A uniform draw in `[-magnitude, magnitude)`, differentiable in `magnitude`."""
    return uniform(key, -1.0, 1.0, shape) * magnitude
