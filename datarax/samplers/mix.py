"""`MixSampler`: the positions of a weighted mixture's epoch -> records of its concatenated components.

Per-epoch draws per component are apportioned by the weights (exactly the sizes when the weights
are proportional to them); every block of `block_size` positions holds each component's share
within two slots; each component is walked through its own shuffled passes. Everything is O(1)
per position, so the iterator state stays `(epoch, position)`. See docs/sources.md, "Mixing sources".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from datarax.core.checks import check_seed, is_number
from datarax.samplers.base import Sampler
from datarax.samplers.feistel import FeistelPermutation
from datarax.samplers.keyed import derive_seed


def check_weights(weights: object, owner: str) -> tuple[float, ...]:
    if not isinstance(weights, (tuple, list)) or not weights:
        raise TypeError(f"{owner} weights must be a non-empty tuple of numbers, got {weights!r}")
    if not all(is_number(x) and x >= 0 for x in weights) or sum(weights) <= 0:
        raise ValueError(f"{owner} weights must be finite, >= 0 and not all 0, got {weights!r}")
    return tuple(float(x) for x in weights)


def apportion(total: int, weights: Sequence[float]) -> np.ndarray:
    """Splits `total` slots by `weights` with the largest-remainder method (ties to lower index)."""
    w = np.asarray(weights, np.float64)
    quota = w / w.sum() * total
    counts = np.floor(quota).astype(np.int64)
    rest = total - int(counts.sum())
    order = np.lexsort((np.arange(len(w)), -(quota - counts)))
    counts[order[:rest]] += 1
    return counts


def webster(seats: int, weights: Sequence[float] | np.ndarray) -> np.ndarray:
    """Splits `seats` by `weights` with Webster's divisor method (Sainte-Lague; ties to lower index).

    Divisor methods are house monotone: no component loses a seat when `seats` grows, so the
    differences between consecutive totals (the slots of one block) are never negative.
    """
    w = np.asarray(weights, np.float64)
    quota = w / w.sum() * seats
    counts = np.floor(quota + 0.5).astype(np.int64)
    while counts.sum() > seats:
        cost = np.where(counts > 0, quota / np.maximum(counts - 0.5, 0.5), np.inf)
        counts[int(np.argmin(cost))] -= 1
    while counts.sum() < seats:
        counts[int(np.argmax(quota / (counts + 0.5)))] += 1
    return counts


class MixSampler(Sampler):
    """Positions of a mixture epoch -> global record ids of the concatenated components."""

    def __init__(self, lengths: Sequence[int], weights: Sequence[float], *, seed: int = 0, shuffle: bool = True,
                 epoch_length: int | None = None, block_size: int = 1024):
        self.lengths = tuple(int(n) for n in lengths)
        weights = check_weights(weights, "MixSampler")
        if len(weights) != len(self.lengths):
            raise ValueError(f"MixSampler needs one weight per source: {len(weights)} weights for "
                             f"{len(self.lengths)} sources")
        self.seed, self.shuffle = check_seed(seed), bool(shuffle)
        self.epoch_length = sum(self.lengths) if epoch_length is None else int(epoch_length)
        # A block never exceeds the epoch, so a short epoch meets the weights exactly too.
        self.block_size = min(int(block_size), self.epoch_length)
        self.draws = apportion(self.epoch_length, weights)  # per component and epoch
        starved = [i for i, (w, c) in enumerate(zip(weights, self.draws)) if w > 0 and c == 0]
        if starved:
            needed = math.ceil(sum(weights) / min(w for w in weights if w > 0))
            raise ValueError(f"MixSampler weights {weights} give sources {starved} no draw in an epoch of "
                             f"{self.epoch_length}; make the epoch longer (at least {needed}) or raise their weights")
        self._offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self._perms: dict[tuple, FeistelPermutation] = {}
        self._starts: dict[int, np.ndarray] = {}

    def block_start(self, block: int) -> np.ndarray:
        """Each component's draws before block `block` in an epoch (the same in every epoch)."""
        if block not in self._starts:
            if len(self._starts) > 256:
                self._starts.clear()
            self._starts[block] = webster(min(block * self.block_size, self.epoch_length), self.draws)
        return self._starts[block]

    def __len__(self) -> int:
        return self.epoch_length

    def _perm(self, n: int, *key: int) -> FeistelPermutation:
        if key not in self._perms:
            if len(self._perms) > 64:
                self._perms.clear()
            self._perms[key] = FeistelPermutation(n, derive_seed(self.seed, *key), 0)
        return self._perms[key]

    def indices(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        positions = np.asarray(positions, np.int64)
        flat = positions.reshape(-1)
        block, offset = np.divmod(flat, self.block_size)
        comp = np.empty_like(flat)
        draw = np.empty_like(flat)
        for b in np.unique(block).tolist():
            sel = block == b
            start, end = self.block_start(b), self.block_start(b + 1)
            counts = end - start
            cums = np.concatenate([[0], np.cumsum(counts)])
            slot = self._perm(int(counts.sum()), 0, epoch, b)(offset[sel])
            comp[sel] = np.searchsorted(cums[1:], slot, side="right")
            draw[sel] = start[comp[sel]] + slot - cums[comp[sel]]
        draw = epoch * self.draws[comp] + draw
        lengths = np.asarray(self.lengths, np.int64)[comp]
        comp_epoch, local = np.divmod(draw, lengths)
        if self.shuffle:
            for c, e in np.unique(np.stack([comp, comp_epoch], axis=1), axis=0).tolist():
                sel = (comp == c) & (comp_epoch == e)
                local[sel] = self._perm(self.lengths[c], 1, c, e)(local[sel])
        return (self._offsets[comp] + local).reshape(positions.shape)

    def component_of(self, record_ids: np.ndarray) -> np.ndarray:
        """Which component each global record id belongs to."""
        return np.searchsorted(self._offsets[1:], np.asarray(record_ids), side="right")

    def structure(self) -> str:
        # Weights are left out on purpose: a state may be restored under new weights.
        return (f"MixSampler(lengths={self.lengths}, seed={self.seed}, shuffle={self.shuffle}, "
                f"epoch_length={self.epoch_length}, block_size={self.block_size})")
