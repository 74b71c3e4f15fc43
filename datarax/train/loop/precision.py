"""The trainer's precision policy: compute in a low dtype, keep f32 master parameters.

`Trainer(precision=...)` takes one of `PRECISIONS`:

* "f32" (default): everything in float32, as the model was built.
* "bf16": inside the differentiated loss the trainable parameters and the batch's floating fields
  are cast to bfloat16, so gradients arrive in float32 on the float32 master parameters and the
  optimizer updates in float32; bfloat16 has float32's range, so no loss scaling is needed.
* "f16": the same with float16 plus dynamic loss scaling (`LossScale`): a step whose gradients are
  not all finite is skipped and halves the scale; `GROWTH_INTERVAL` finite steps in a row double
  it. The scale is training state, saved in every checkpoint.

State a forward pass writes (batch statistics) keeps its dtype (`restore_dtypes`), so the step
compiles once; the model's outputs come back as float32 (`float32_outputs`, as Keras does), so the
loss's reductions are not rounded to the low dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.core.checks import check_choice

PRECISIONS = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
INITIAL_SCALE = 2.0**15
GROWTH_INTERVAL = 2000  # finite steps in a row before the scale doubles
MIN_SCALE = 1.0


def check_precision(precision: Any, name: str = "precision") -> str:
    return check_choice(precision, name, tuple(PRECISIONS))


def compute_dtype(precision: str) -> np.dtype:
    """The dtype the loss computes in under `precision`.

    Example:
        >>> compute_dtype("bf16")
        dtype(bfloat16)
    """
    return np.dtype(PRECISIONS[check_precision(precision)])


def _is_float(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def cast_floats(tree: Any, dtype: Any) -> Any:
    """`tree` with its floating arrays cast to `dtype` (integers, bools and PRNG keys untouched)."""
    if np.dtype(dtype) == np.float32:
        return tree
    return jax.tree.map(lambda x: x.astype(dtype) if _is_float(x) else x, tree)


def upcast(tree: Any) -> Any:
    """`tree` with its bfloat16 and float16 arrays cast to float32 (other leaves untouched)."""
    low = (np.dtype(jnp.bfloat16), np.dtype(jnp.float16))
    return jax.tree.map(lambda x: x.astype(jnp.float32) if hasattr(x, "dtype") and x.dtype in low else x, tree)


_FLOAT32_OUTPUT_CLASSES: dict[type, type] = {}


def _float32_output_class(cls: type) -> type:
    """A subclass of `cls` (same name, nothing else changed) whose `__call__` upcasts its outputs."""
    sub = _FLOAT32_OUTPUT_CLASSES.get(cls)
    if sub is None:
        def __call__(self, *args, **kwargs):
            return upcast(cls.__call__(self, *args, **kwargs))

        sub = type(cls)(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                                "__qualname__": cls.__qualname__})
        _FLOAT32_OUTPUT_CLASSES[cls] = sub
    return sub


@contextlib.contextmanager
def float32_outputs(model: Any, dtype: Any) -> Iterator[None]:
    """Inside the block, calling `model` returns its floating outputs in float32 when the compute
    `dtype` is bfloat16 or float16 (nothing changes under float32). The model's class is swapped
    for a subclass for the duration, and back after, so `isinstance` checks in a loss still hold."""
    cls = type(model)
    if np.dtype(dtype) == np.float32 or not callable(getattr(cls, "__call__", None)):
        yield
        return
    object.__setattr__(model, "__class__", _float32_output_class(cls))
    try:
        yield
    finally:
        object.__setattr__(model, "__class__", cls)


def restore_dtypes(new: Any, old: Any) -> Any:
    """`new` with each floating leaf cast back to the dtype of the same leaf of `old`."""
    return jax.tree.map(lambda n, o: n.astype(o.dtype) if _is_float(o) else n, new, old)


def all_finite(tree: Any) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if _is_float(x)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


class LossScaleValue(nnx.Variable):
    """A dynamic loss scale's state (not a parameter: the optimizer never sees it)."""


class LossScale(nnx.Module):
    """Dynamic loss scaling for float16 training: the scale and the finite steps since it last changed.

    Example:
        >>> ls = LossScale()
        >>> scale, good = next_scale(ls.scale[...], ls.good_steps[...], jnp.asarray(False))
        >>> float(scale), int(good)
        (16384.0, 0)
    """

    def __init__(self, initial: float = INITIAL_SCALE):
        self.scale = LossScaleValue(jnp.asarray(initial, jnp.float32))
        self.good_steps = LossScaleValue(jnp.asarray(0, jnp.int32))


def next_scale(scale: jax.Array, good_steps: jax.Array, finite: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(scale, good_steps) after a step: halve (not below `MIN_SCALE`) on a non-finite step, double
    after `GROWTH_INTERVAL` finite steps in a row."""
    good = jnp.where(finite, good_steps + 1, 0)
    grow = good >= GROWTH_INTERVAL
    scale = jnp.where(finite, jnp.where(grow, scale * 2, scale), jnp.maximum(scale / 2, MIN_SCALE))
    return scale.astype(jnp.float32), jnp.where(grow, 0, good).astype(jnp.int32)


def keep_if(ok: jax.Array, new: list, old: list, always: list[bool]) -> list:
    """`new` where `ok`, else `old`, value by value; positions marked in `always` (the loss scale and
    the guard's counters), PRNG keys (which a step never changes) and values that are not arrays
    (optax's `MaskedNode` placeholders) are taken from `new`."""

    def pick(n, o, take_new):
        if take_new or not hasattr(n, "dtype") or jax.dtypes.issubdtype(n.dtype, jax.dtypes.prng_key):
            return n
        return jnp.where(ok, n, o)

    return [pick(n, o, a) for n, o, a in zip(new, old, always)]
