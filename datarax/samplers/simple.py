"""Sequential, shuffled and range samplers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax.numpy as jnp
import numpy as np

from datarax.core.checks import MAX_INT32, check_positive_int, check_seed, is_int
from datarax.samplers.base import Sampler
from datarax.samplers.feistel import FeistelPermutation, feistel_device, round_keys

if TYPE_CHECKING:
    from datarax.core.source import DataSourceModule


def check_num_records(num_records: object) -> int:
    """`num_records` as an int, or a ValueError naming the bad value."""
    return check_positive_int(num_records, "num_records")


class SequentialSampler(Sampler):
    """Records in storage order: position i is record i."""

    def __init__(self, num_records: int):
        self.num_records = check_num_records(num_records)

    def __len__(self) -> int:
        return self.num_records

    def indices(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64)

    def device_params(self, epoch: int):
        return () if self.num_records <= MAX_INT32 else None


class ShuffleSampler(Sampler):
    """A fresh pseudo-random order every epoch, keyed by (seed, epoch), in O(1) memory.

    Example:
        >>> s = ShuffleSampler(5, seed=1)
        >>> sorted(s.indices(np.arange(5), epoch=0).tolist())
        [0, 1, 2, 3, 4]
    """

    def __init__(self, num_records: int, seed: int = 0):
        self.num_records = check_num_records(num_records)
        self.seed = check_seed(seed)
        self._perm_epoch = -1
        self._perm: FeistelPermutation | None = None

    def __len__(self) -> int:
        return self.num_records

    def permutation(self, epoch: int) -> FeistelPermutation:
        if epoch != self._perm_epoch:
            self._perm = FeistelPermutation(self.num_records, self.seed, epoch)
            self._perm_epoch = epoch
        return self._perm

    def indices(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        return self.permutation(epoch)(positions)

    def device_params(self, epoch: int):
        return jnp.asarray(round_keys(self.seed, epoch)) if self.num_records <= MAX_INT32 else None

    def device_order(self, positions, params):
        return feistel_device(positions, params, self.num_records)

    def device_structure(self) -> int:
        return self.num_records  # the seed is in the round keys, `device_params`

    def structure(self) -> str:
        return f"ShuffleSampler(seed={self.seed})"


class RangeSampler(Sampler):
    """The records of Python's `range(start, stop, step)`, negative steps included."""

    def __init__(self, start: int, stop: int | None = None, step: int = 1):
        if stop is None:
            start, stop = 0, start
        for name, v in (("start", start), ("stop", stop), ("step", step)):
            if not is_int(v):
                raise TypeError(f"RangeSampler {name} must be an int, got {v!r}")
        if step == 0:
            raise ValueError("RangeSampler step must not be zero, got 0")
        self._range = range(int(start), int(stop), int(step))
        if self._range and min(self._range[0], self._range[-1]) < 0:
            raise ValueError(f"RangeSampler yields record indices, which must be >= 0; got {self._range}")

    def __len__(self) -> int:
        return len(self._range)

    def indices(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        r = self._range
        return r.start + np.asarray(positions, dtype=np.int64) * r.step

    def device_params(self, epoch: int):
        r = self._range
        return () if max(r.start, r.stop, abs(r.step) * len(r)) <= MAX_INT32 else None

    def device_expand(self, items, params):
        r = self._range
        return r.start + items.astype(jnp.int32) * r.step

    def structure(self) -> str:
        r = self._range
        return f"RangeSampler({r.start}, {r.stop}, {r.step})"


def default_sampler(source: DataSourceModule) -> Sampler:
    """The sampler a pipeline reads `source` with unless it is given one: the source's own
    (`source.sampler()`), else a fresh order every epoch keyed by `(source.seed, epoch)` when the
    source's config has `shuffle=True` (a `ShuffleConfig`), else storage order."""
    own = source.sampler()
    if own is not None:
        return own
    if getattr(getattr(source, "config", None), "shuffle", False):
        return ShuffleSampler(len(source), seed=getattr(source, "seed", 0))
    return SequentialSampler(len(source))
