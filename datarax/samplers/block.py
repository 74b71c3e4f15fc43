"""`BlockShuffleSampler`: a real shuffle of blocked records (shards' row groups) in O(1) state.

A Feistel permutation of the blocks keyed by (seed, epoch), then the records of each window of
`window` consecutive blocks of that order permuted together (Feistel keyed by (seed, epoch,
window)). Position p of epoch e is a function of (seed, e, p) alone, and a reader that knows the
block order fetches exactly the blocks that come next (`datarax.sources.ShardedSource`).
"""

from __future__ import annotations

import collections
import threading
import zlib
from collections.abc import Sequence

import numpy as np

from datarax.core.checks import check_positive_int
from datarax.core.source import Handles
from datarax.samplers.base import Sampler
from datarax.samplers.feistel import FeistelPermutation
from datarax.samplers.keyed import derive_seed


class BlockShuffleSampler(Sampler):
    """Two-level shuffle of blocked records, O(1) iterator state.

    Args:
        block_counts: records per block, in storage order (record ids run through the blocks).
        window: blocks shuffled together.
        seed: the shuffle seed.
        shuffle: False gives storage order.
    """

    def __init__(self, block_counts: Sequence[int], window: int = 16, seed: int = 0, shuffle: bool = True):
        self.counts = np.asarray(block_counts, np.int64)
        if self.counts.ndim != 1 or self.counts.size == 0 or (self.counts < 1).any():
            raise ValueError(f"BlockShuffleSampler block_counts must be a non-empty list of positive counts, got "
                             f"{block_counts!r}")
        self.window = check_positive_int(window, "BlockShuffleSampler window")
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])
        self._orders = Handles(epochs=collections.OrderedDict(), lock=threading.Lock())  # out of NNX state

    def __len__(self) -> int:
        return int(self.starts[-1])

    def epoch_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(block order, rank of each block in it, record offsets of the ordered blocks)` of `epoch`."""
        epochs = self._orders.epochs
        with self._orders.lock:
            if epoch not in epochs:
                n = len(self.counts)
                order = (FeistelPermutation(n, derive_seed(self.seed, 0xB10C), epoch)(np.arange(n))
                         if self.shuffle and n > 1 else np.arange(n))
                rank = np.empty(n, np.int64)
                rank[order] = np.arange(n)
                epochs[epoch] = (order, rank, np.concatenate([[0], np.cumsum(self.counts[order])]))
                while len(epochs) > 2:
                    epochs.popitem(last=False)
            return epochs[epoch]

    def indices(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        positions = np.asarray(positions, np.int64)
        flat = positions.reshape(-1)
        if not self.shuffle:
            return flat.reshape(positions.shape).copy()
        order, _, ordered = self.epoch_order(epoch)
        window_starts = ordered[::self.window]
        if window_starts[-1] != ordered[-1]:
            window_starts = np.append(window_starts, ordered[-1])
        w = np.searchsorted(window_starts, flat, side="right") - 1
        within = flat - window_starts[w]
        for win in np.unique(w).tolist():
            sel = w == win
            size = int(window_starts[win + 1] - window_starts[win])
            perm = FeistelPermutation(size, derive_seed(self.seed, epoch, win), 0)
            within[sel] = perm(within[sel])
        rank_pos = window_starts[w] + within  # the record's place in the epoch's block order
        j = np.searchsorted(ordered, rank_pos, side="right") - 1
        ids = self.starts[order[j]] + (rank_pos - ordered[j])
        return ids.reshape(positions.shape)

    def structure(self) -> str:
        return (f"BlockShuffleSampler(blocks={len(self.counts)}, records={len(self)}, "
                f"counts_crc32={zlib.crc32(self.counts.tobytes()):08x}, window={self.window}, seed={self.seed}, "
                f"shuffle={self.shuffle})")
