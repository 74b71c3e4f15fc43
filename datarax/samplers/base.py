"""The sampler contract: positions in an epoch -> record indices."""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class Sampler(nnx.Module, abc.ABC):
    """Abstract base: a deterministic map from (epoch, positions) to record indices.

    A sampler holds no iteration state: the pipeline's iterator walks `datarax.batching.schedule`
    and asks for the indices of each batch's positions, so one sampler can feed several
    iterators and any position is reached by arithmetic.
    """

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of positions (items) in one epoch."""

    @abc.abstractmethod
    def indices(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        """Record indices (int64) for `positions` (each in [0, len(self))) of `epoch`."""

    def structure(self) -> str:
        """Identifies the sampler for iterator fingerprints (class and its settings)."""
        return type(self).__qualname__

    def device_structure(self) -> Any:
        """What `device_order` and `device_expand` read besides their arguments (plain data).

        Pipelines whose samplers are of one class with equal `device_structure()` share their
        compiled sampling programs (`datarax.pipeline.programs`), so it must name every setting
        that changes the code; a setting only `device_params` reads (a seed) belongs in the
        parameters, not here. The default is `(structure(), len(self))`.
        """
        return self.structure(), len(self)

    def device_params(self, epoch: int) -> Any | None:
        """Small arrays that let the sampler run inside compiled programs for `epoch`.

        None (the default) means the sampler runs on the host only; the pipeline then computes
        indices with `indices` and passes them to the step.
        """
        return None

    def device_order(self, positions: jax.Array, params: Any) -> jax.Array:
        """The item each of `positions` holds in the epoch's order (int32, same shape), in jax.numpy.

        The part of the sampler that may loop (a shuffle's cycle walk): the pipeline runs it for
        many batches at once in a separate program, so the per-batch program never waits on a
        data-dependent loop. The default is the identity (storage order).
        """
        return positions.astype(jnp.int32)

    def device_expand(self, items: jax.Array, params: Any) -> jax.Array:
        """Record indices (int32) of `items` from `device_order`: elementwise, without loops.

        The default is the item itself.
        """
        return items.astype(jnp.int32)

    def device_indices(self, positions: jax.Array, params: Any) -> jax.Array:
        """`indices` in jax.numpy (int32), given `device_params(epoch)`; equal to the host result."""
        if type(self).device_params is Sampler.device_params:
            raise TypeError(f"{type(self).__name__} computes indices on the host only (device_params is None)")
        return self.device_expand(self.device_order(positions, params), params)
