"""Samplers that look beyond one epoch or one record: epoch-spanning streams and sliding windows."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from datarax.core.checks import MAX_INT32, check_positive_int, check_seed
from datarax.samplers.base import Sampler
from datarax.samplers.feistel import FeistelPermutation, feistel_device, round_keys
from datarax.samplers.simple import check_num_records


class EpochAwareSampler(Sampler):
    """One continuous stream over `num_epochs` epochs (None: endless), reshuffled per epoch.

    Unlike per-epoch iteration, batches straddle epoch edges (as `repeat().batch()` in tf.data),
    so there is never a short batch until the very end. `epoch_of(positions)` tells which epoch
    each stream position belongs to.
    """

    def __init__(self, num_records: int, *, seed: int = 0, shuffle: bool = True, num_epochs: int | None = None):
        self.num_records = check_num_records(num_records)
        self.seed = check_seed(seed)
        self.shuffle = bool(shuffle)
        self.num_epochs = check_positive_int(num_epochs, "num_epochs", allow_none=True)

    def __len__(self) -> int:
        if self.num_epochs is None:
            raise TypeError("an endless EpochAwareSampler (num_epochs=None) has no length, so a pipeline cannot "
                            "use it; pass num_epochs=N, or map stream positions with indices(positions)")
        return self.num_records * self.num_epochs

    def epoch_of(self, positions: np.ndarray) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64) // self.num_records

    def indices(self, positions: np.ndarray, epoch: int = 0) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        epochs, offsets = np.divmod(positions, self.num_records)
        if not self.shuffle:
            return offsets
        out = np.empty_like(offsets)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = FeistelPermutation(self.num_records, self.seed, int(e))(offsets[sel])
        return out

    def structure(self) -> str:
        return f"EpochAwareSampler(seed={self.seed}, shuffle={self.shuffle}, num_epochs={self.num_epochs})"


class SlidingWindowSampler(Sampler):
    """Windows of `window` consecutive records, starting every `stride` records.

    Item i of an epoch is the index array [i*stride, i*stride + window); a batch is therefore
    int64[B, window] and gathers elements with a window axis after the batch axis.
    """

    def __init__(self, num_records: int, window: int, stride: int = 1, *, shuffle: bool = False, seed: int = 0):
        self.num_records = check_num_records(num_records)
        window = check_positive_int(window, "SlidingWindowSampler window")
        stride = check_positive_int(stride, "SlidingWindowSampler stride")
        if window > self.num_records:
            raise ValueError(f"window ({window}) is longer than the data ({self.num_records} records); "
                             "use a smaller window")
        self.window, self.stride = window, stride
        self.shuffle, self.seed = bool(shuffle), check_seed(seed)

    def __len__(self) -> int:
        return (self.num_records - self.window) // self.stride + 1

    def indices(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if self.shuffle:
            positions = FeistelPermutation(len(self), self.seed, epoch)(positions)
        return positions[..., None] * self.stride + np.arange(self.window, dtype=np.int64)

    def device_params(self, epoch: int):
        if self.num_records > MAX_INT32:
            return None
        return jnp.asarray(round_keys(self.seed, epoch)) if self.shuffle else ()

    def device_order(self, positions, params):
        positions = positions.astype(jnp.int32)
        return feistel_device(positions, params, len(self)) if self.shuffle else positions

    def device_expand(self, items, params):
        return items.astype(jnp.int32)[..., None] * self.stride + jnp.arange(self.window, dtype=jnp.int32)

    def device_structure(self) -> tuple:
        return len(self), self.window, self.stride, self.shuffle  # the seed is in the round keys

    def structure(self) -> str:
        return (f"SlidingWindowSampler(window={self.window}, stride={self.stride}, "
                f"shuffle={self.shuffle}, seed={self.seed})")
