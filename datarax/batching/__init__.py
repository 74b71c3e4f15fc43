"""datarax.batching: how an epoch's records become batches.

The rules every iterator in datarax follows, in one place: a batch size is a positive int; an
epoch of `length` records gives `ceil(length / batch_size)` batches, or `floor` with
`drop_remainder=True`; a short final batch is padded to the full size by repeating its last
position, so the compiled program keeps one shape (no recompile), and the padding rows are
marked invalid in the `BatchContext` mask and sliced off before the batch is returned.
Regrouping records inside a pipeline is `datarax.operators.nodes.RebatchNode`.
"""

from __future__ import annotations

import numpy as np


def check_batch_size(batch_size: object) -> int:
    """`batch_size` as an int, or a ValueError naming the bad value."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    return int(batch_size)


def num_batches(length: int, batch_size: int, drop_remainder: bool) -> int:
    """Batches in an epoch of `length` records."""
    return length // batch_size if drop_remainder else -(-length // batch_size)


def padded_positions(start: int, rows: np.ndarray, length: int) -> np.ndarray:
    """The epoch positions of batch rows `rows` for a batch starting at `start`: rows past the
    end of the epoch repeat its last position (padding, masked out by the iterator)."""
    return np.minimum(start + rows, length - 1)
