"""`WeightedSampler`: class-balanced or weighted sampling with exact per-epoch counts.

Every epoch gives each group (usually a class) exactly its share of the positions, apportioned by
the group weights; it is `MixSampler` over the groups, so resume is exact by arithmetic.

Example:
    >>> sampler = WeightedSampler(groups=source.labels, seed=0)  # class-balanced
    >>> pipeline = Pipeline(source, [DecodeImage(size=128)], sampler=sampler, batch_size=64)
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from datarax.core.checks import check_bool, check_positive_int, check_seed, is_number
from datarax.samplers.base import Sampler
from datarax.samplers.mix import MixSampler, apportion


class WeightedSampler(Sampler):
    """Draws every group an exact share of each epoch (class-balanced by default).

    Args:
        groups: one non-negative int group id per record (e.g. the labels), in record order.
        weights: one non-negative weight per group id `0 .. max(groups)` (normalised); None gives
            every group that has records the same weight (class balance).
        epoch_length: positions per epoch; None is the number of records.
        seed: the shuffle seed.
        shuffle: walk each group in a fresh order every time it is exhausted (else storage order)
            and interleave the groups pseudo-randomly (else by the block's slots in order).
        block_size: positions per block within which each group's share is met to two slots.

    Attributes:
        counts: records per group id.
        draws: positions per group in every epoch (`weights` apportioned over `epoch_length`).
    """

    def __init__(self, groups: Sequence[int] | np.ndarray, weights: Sequence[float] | None = None, *,
                 epoch_length: int | None = None, seed: int = 0, shuffle: bool = True, block_size: int = 1024):
        groups = np.asarray(groups)
        if groups.ndim != 1 or groups.size == 0 or not np.issubdtype(groups.dtype, np.integer):
            raise TypeError(f"WeightedSampler groups must be a non-empty 1-d array of int group ids (one per record, "
                            f"e.g. source.labels), got an array of dtype {groups.dtype} and shape {groups.shape}")
        if groups.min() < 0:
            raise ValueError(f"WeightedSampler groups must be >= 0, got {int(groups.min())} (record "
                             f"{int(np.argmin(groups))}); map the ids to 0, 1, ... first")
        self.counts = np.bincount(groups).astype(np.int64)
        if weights is None:
            weights = tuple(1.0 if c > 0 else 0.0 for c in self.counts)
        weights = tuple(weights) if isinstance(weights, (tuple, list, np.ndarray)) else weights
        if not isinstance(weights, tuple) or len(weights) != len(self.counts):
            raise ValueError(f"WeightedSampler weights must hold one weight per group id 0..{len(self.counts) - 1} "
                             f"({len(self.counts)} weights), got {weights!r}")
        if not all(is_number(w) and np.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"WeightedSampler weights must be finite, >= 0 and not all 0, got {weights!r}")
        self.weights = tuple(float(w) for w in weights)
        empty = [g for g, (w, c) in enumerate(zip(self.weights, self.counts)) if c == 0 and w > 0]
        if empty:
            raise ValueError(f"WeightedSampler weights give group(s) {empty} a share, but no record has that group id; "
                             "set their weights to 0 or check the labels")
        self.num_records = int(groups.size)
        self.seed = check_seed(seed, "WeightedSampler seed")
        self.shuffle = check_bool(shuffle, "WeightedSampler shuffle")
        self.epoch_length = (self.num_records if epoch_length is None
                             else check_positive_int(epoch_length, "WeightedSampler epoch_length"))
        present = np.flatnonzero(self.counts)  # groups with records: the mixture's components
        draws = apportion(self.epoch_length, self.weights)
        starved = [g for g, (w, d) in enumerate(zip(self.weights, draws)) if w > 0 and d == 0]
        if starved:
            needed = int(np.ceil(sum(self.weights) / min(w for w in self.weights if w > 0)))
            raise ValueError(f"WeightedSampler weights {self.weights} give group(s) {starved} no draw in an epoch of "
                             f"{self.epoch_length}; make epoch_length at least {needed} or raise their weights")
        self._mix = MixSampler(self.counts[present], [self.weights[g] for g in present], seed=self.seed,
                               shuffle=self.shuffle, epoch_length=self.epoch_length,
                               block_size=check_positive_int(block_size, "WeightedSampler block_size"))
        self.draws = np.zeros(len(self.counts), np.int64)
        self.draws[present] = self._mix.draws
        # the records of group 0, then group 1, ...: the mixture's concatenation of its components
        self._order = np.argsort(groups, kind="stable").astype(np.int64)
        self._groups_crc = zlib.crc32(groups.astype(np.int64).tobytes())

    def __len__(self) -> int:
        return self.epoch_length

    def indices(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        return self._order[self._mix.indices(positions, epoch)]

    def structure(self) -> str:
        # As for the mixture, the weights are left out: a run may resume under new weights.
        return (f"WeightedSampler(records={self.num_records}, groups_crc32={self._groups_crc:08x}, seed={self.seed}, "
                f"shuffle={self.shuffle}, epoch_length={self.epoch_length}, block_size={self._mix.block_size})")
