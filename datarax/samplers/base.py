"""The sampler contract: positions in an epoch -> record indices, plus a resumable batch iterator."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

import jax

import numpy as np
from flax import nnx

from datarax.batching import check_batch_size, num_batches

STATE_VERSION = 1

__all__ = ["STATE_VERSION", "Sampler", "SamplerIterator", "check_batch_size", "num_batches"]


class Sampler(nnx.Module, abc.ABC):
    """Abstract base: a deterministic map from (epoch, positions) to record indices.

    A sampler holds no iteration state itself; `iter_batches` returns an iterator that does, so
    one sampler can feed several iterators and any position is reached by arithmetic.
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

    def device_params(self, epoch: int) -> Any | None:
        """Small arrays that let `device_indices` run inside the compiled step for `epoch`.

        None (the default) means the sampler runs on the host only; the pipeline then computes
        indices with `indices` and passes them to the step.
        """
        return None

    def device_indices(self, positions: jax.Array, params: Any) -> jax.Array:
        """`indices` in jax.numpy (int32), given `device_params(epoch)`; equal to the host result."""
        raise TypeError(f"{type(self).__name__} computes indices on the host only (device_params is None)")

    def iter_batches(self, batch_size: int, *, drop_remainder: bool = False, num_epochs: int | None = 1,
                     start_epoch: int = 0) -> SamplerIterator:
        """Yields one int64 index array per batch, epoch after epoch (None: forever)."""
        return SamplerIterator(self, check_batch_size(batch_size), drop_remainder, num_epochs, start_epoch)


class SamplerIterator(Iterator[np.ndarray]):
    """Iterates a sampler batch by batch; `get_state`/`set_state` resume exactly."""

    def __init__(self, sampler: Sampler, batch_size: int, drop_remainder: bool, num_epochs: int | None,
                 start_epoch: int):
        self._sampler = sampler
        self._batch_size = batch_size
        self._drop = drop_remainder
        self._end_epoch = None if num_epochs is None else start_epoch + num_epochs
        self._epoch = start_epoch
        self._position = 0

    def __next__(self) -> np.ndarray:
        length = len(self._sampler)
        while True:
            if self._end_epoch is not None and self._epoch >= self._end_epoch:
                raise StopIteration
            stop = min(self._position + self._batch_size, length)
            if stop > self._position and not (self._drop and stop - self._position < self._batch_size):
                break
            self._epoch, self._position = self._epoch + 1, 0
            if length == 0:
                raise StopIteration
        positions = np.arange(self._position, stop, dtype=np.int64)
        self._position = stop
        return self._sampler.indices(positions, self._epoch)

    def get_state(self) -> dict:
        return {"version": STATE_VERSION, "epoch": self._epoch, "position": self._position}

    def set_state(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"sampler state must be a dict with version {STATE_VERSION}, got {state!r}")
        epoch, position = state.get("epoch"), state.get("position")
        if not (isinstance(epoch, int) and isinstance(position, int) and epoch >= 0
                and 0 <= position <= len(self._sampler)):
            raise ValueError(
                f"sampler state has epoch={epoch!r}, position={position!r}; position must be in "
                f"[0, {len(self._sampler)}] and epoch >= 0"
            )
        self._epoch, self._position = epoch, position
