"""Bounded magnitudes: operator parameters that are fixed numbers or learnable within a range.

A learnable magnitude is an `nnx.Param` logit `raw` read as `low + (high - low) * sigmoid(raw)`,
initialised to the configured value, so training cannot push it out of `(low, high)`. A fixed
magnitude is a plain Python float. Random magnitudes are reparameterised (a unit draw scaled by
the magnitude), so gradients reach them.

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


class Magnitude(nnx.Module):
    """One operator magnitude in `[low, high]`, either fixed or learnable.

    Args:
        value: the configured (starting) value.
        high: the upper bound of the range.
        low: the lower bound of the range.
        learnable: hold the value as an `nnx.Param` logit (see the module docstring).
        name: the configuration field this magnitude comes from (used in error messages).

    Calling the module returns the current value: a traced scalar when learnable, the Python
    float otherwise.
    """

    def __init__(self, value: float, *, high: float, low: float = 0.0, learnable: bool = False,
                 name: str = "magnitude"):
        if not is_number(value):
            raise TypeError(f"{name} must be a finite number, got {value!r}")
        if not low <= value <= high:
            raise ValueError(f"{name} must lie in [{low}, {high}], got {value!r}; pick a value in that range")
        self.low = float(low)
        self.high = float(high)
        self.name = name
        self.learnable = bool(learnable)
        if self.learnable:
            # dtype=float is the canonical float: float32, or float64 when x64 is enabled.
            self.raw = nnx.Param(jnp.asarray(inverse_bounded(value, low, high, name=name), dtype=float))
        else:
            self.fixed = float(value)

    def __call__(self) -> jax.Array | float:
        if self.learnable:
            return bounded(self.raw[...], self.low, self.high)
        return self.fixed


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
    from `config.learnable`) says which of them are learnable. Operator classes call this once
    in their constructor.
    """
    if chosen is None:
        chosen = learnable_names(config.learnable, list(bounds), owner=owner)
    return nnx.Dict({
        name: Magnitude(getattr(config, name), low=low, high=high, learnable=name in chosen,
                        name=f"{owner}.{name}")
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
