"""An exponential moving average of a model's parameters, updated inside the jitted train step.

After each optimizer update, every `nnx.Param` p of the model moves its average e by

    e <- decay * e + (1 - decay) * p

in the parameter's dtype (float32 under every precision policy: the master parameters are float32).
The average starts as a copy of the parameters when the `Trainer` is built and is saved with every
checkpoint as its own item (`ema/`), so a resumed run continues it exactly.
`Trainer.evaluate(ema=True)` evaluates the model with the averages in place of its parameters.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from datarax.core.checks import check_number


def param_values(module: nnx.Module) -> list[jax.Array]:
    """The values of `module`'s `nnx.Param`s in NNX's sorted path order."""
    return [v.get_value() for _, v in nnx.to_flat_state(nnx.state(module, nnx.Param))]


def param_paths(module: nnx.Module) -> list[tuple]:
    return [path for path, _ in nnx.to_flat_state(nnx.state(module, nnx.Param))]


class EMAValue(nnx.Variable):
    """One parameter's moving average (not a Param: no optimizer or gradient touches it)."""


def check_decay(decay: Any) -> float:
    """`ema_decay`, a number in (0, 1)."""
    decay = check_number(decay, "ema_decay", 0.0, 1.0, open_low=True)
    if decay == 1.0:
        raise ValueError("ema_decay must be < 1 (1.0 never moves the average), got 1.0; e.g. ema_decay=0.999")
    return decay


class ParamEMA(nnx.Module):
    """The moving averages of a module's parameters, in `param_values` order.

    Args:
        module: the model whose `nnx.Param`s are averaged (copied now as the starting value).
        decay: the weight of the old average, in (0, 1); e.g. 0.999 averages over about 1000 steps.

    Example:
        >>> from flax import nnx
        >>> model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
        >>> ema = ParamEMA(model, decay=0.9)
        >>> len(ema.averages) == len(param_values(model))
        True
    """

    def __init__(self, module: nnx.Module, decay: float):
        self.decay = check_decay(decay)
        # Copies: the train step donates the parameters' buffers, and a buffer may be donated once.
        self.averages = nnx.List([EMAValue(jnp.array(v, copy=True)) for v in param_values(module)])

    def update(self, module: nnx.Module) -> None:
        """Moves every average towards `module`'s current parameters (call inside the traced step)."""
        for average, value in zip(self.averages, param_values(module)):
            old = average.get_value()
            average.set_value((self.decay * old + (1.0 - self.decay) * value).astype(old.dtype))

    def values(self) -> list[jax.Array]:
        return [average.get_value() for average in self.averages]
