"""datarax.batching: how an epoch's records become batches.

The rules every iterator in datarax follows, in one place: a batch size is a positive int; an
epoch of `length` records gives `ceil(length / batch_size)` batches, or `floor` with
`drop_remainder=True`; `schedule` lists them, epoch after epoch, from any cursor; a short final
batch is padded to the full size by repeating its last position, so the compiled program keeps
one shape (no recompile), and the padding rows are marked invalid in the `BatchContext` mask and
sliced off before the batch is returned. Regrouping records inside a pipeline is
`datarax.operators.nodes.RebatchNode`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from datarax.core.checks import check_bool, check_int, check_positive_int

# Batches a device-resident pipeline keeps dispatched behind the one it returns (`Pipeline`'s
# `dispatch_ahead`); the default was chosen by measurement (docs/benchmarks.md, `overhead`).
DISPATCH_AHEAD = 1
MAX_DISPATCH_AHEAD = 64
MAX_PREFETCH = 64  # batches a host-resident source prepares ahead, at most
# Batches a device-resident pipeline computes in one dispatched program on a TPU when it is not
# told (`Pipeline(batches_per_dispatch=None)`): a call costs about 150 us to dispatch there, as
# much as a CIFAR batch's whole augmentation (docs/tpu.md). At most `DISPATCH_BYTES` of output per
# program. Other backends dispatch each batch: a call costs a few microseconds on the CPU, and
# nothing was measured on a GPU.
TPU_BATCHES_PER_DISPATCH = 8
DISPATCH_BYTES = 64 * 2**20


def resolve_batches_per_dispatch(requested: int | None, batch_bytes: int, backend: str) -> int:
    """`requested`, or the default for `backend` and a batch of `batch_bytes` output bytes (see above)."""
    if requested is not None:
        return requested
    if backend != "tpu":
        return 1
    return max(1, min(TPU_BATCHES_PER_DISPATCH, DISPATCH_BYTES // max(1, batch_bytes)))


def check_batch_size(batch_size: object) -> int:
    """`batch_size` as an int, or a ValueError naming the bad value."""
    return check_positive_int(batch_size, "batch_size")


def check_settings(*, batch_size: object = 32, drop_remainder: object = False, prefetch: object = 2,
                   dispatch_ahead: object = DISPATCH_AHEAD) -> tuple[int, int]:
    """`Pipeline`'s checks of its batching settings (a configuration file's top-level keys use them
    too); returns (batch_size, prefetch)."""
    batch_size = check_batch_size(batch_size)
    check_bool(drop_remainder, "drop_remainder")
    prefetch = check_int(prefetch, "prefetch", 1, high=MAX_PREFETCH, why=" (batches held ready in memory)",
                         hint="; a few batches hide reading jitter, use 2-8")
    check_int(dispatch_ahead, "dispatch_ahead", 0, high=MAX_DISPATCH_AHEAD,
              why=" (batches kept dispatched on the device)", hint=f"; the default is {DISPATCH_AHEAD}")
    return batch_size, prefetch


def num_batches(length: int, batch_size: int, drop_remainder: bool) -> int:
    """Batches in an epoch of `length` records."""
    return length // batch_size if drop_remainder else -(-length // batch_size)


def schedule(length: int, batch_size: int, *, drop_remainder: bool = False, epoch: int = 0, position: int = 0,
             end_epoch: int | None = None) -> Iterator[tuple[int, int, int]]:
    """`(epoch, position, num_valid)` of every batch from the cursor `(epoch, position)` on.

    The cursor is where the next batch starts: a position in `[0, length]` of `epoch`, where
    `length` means "after the epoch's last batch". Batches run epoch after epoch until
    `end_epoch` (exclusive; None: endlessly); each holds `num_valid` records (`batch_size`,
    except an epoch's short final batch, which `drop_remainder=True` skips). An iterator's state
    is the cursor after its last batch, so resuming is `schedule(..., epoch=e, position=p)`.

    Example:
        >>> list(schedule(5, 2, epoch=0, position=2, end_epoch=2))
        [(0, 2, 2), (0, 4, 1), (1, 0, 2), (1, 2, 2), (1, 4, 1)]
    """
    # Epochs without a single batch would otherwise make an endless schedule spin forever.
    empty = num_batches(length, batch_size, drop_remainder) == 0
    while end_epoch is None or epoch < end_epoch:
        stop = position + (length - position) // batch_size * batch_size if drop_remainder else length
        for start in range(position, stop, batch_size):
            yield epoch, start, min(batch_size, length - start)
        if empty:
            return
        epoch, position = epoch + 1, 0


def chunk_schedule(length: int, batch_size: int, count: int, *, drop_remainder: bool, epoch: int,
                   position: int) -> np.ndarray:
    """`int32[count, 3]`: `(position, epoch, num_valid)` of the next `count` batches of `epoch` from
    `position`, as `schedule` lists them; rows past the epoch's last batch are `(length, epoch, 0)`.

    Example:
        >>> chunk_schedule(5, 2, 4, drop_remainder=False, epoch=1, position=2).tolist()
        [[2, 1, 2], [4, 1, 1], [5, 1, 0], [5, 1, 0]]
    """
    table = np.tile(np.array([length, epoch, 0], np.int32), (count, 1))
    steps = itertools.islice(schedule(length, batch_size, drop_remainder=drop_remainder, epoch=epoch,
                                      position=position, end_epoch=epoch + 1), count)
    for row, (_, start, valid) in zip(table, steps):
        row[0], row[2] = start, valid
    return table


def padded_positions(start, rows, length: int, xp=np):
    """The epoch positions of batch rows `rows` for a batch starting at `start`: rows past the
    end of the epoch repeat its last position (padding, masked out by the iterator).

    `xp` is the array module (`jax.numpy` inside a compiled program); no intermediate exceeds
    `length`, so int32 positions cannot overflow.
    """
    return start + xp.minimum(rows, length - 1 - start)


def batch_indices(sampler, epoch: int, starts: np.ndarray, batch_size: int) -> np.ndarray:
    """int32[len(starts), batch_size, ...]: the record indices of the batches of `epoch` that start at
    `starts`, in one host sampler call (with a trailing axis where an item is a window of records)."""
    positions = padded_positions(np.asarray(starts)[:, None], np.arange(batch_size), len(sampler))
    got = sampler.indices(positions.reshape(-1), epoch)
    return got.reshape(len(starts), batch_size, *got.shape[1:]).astype(np.int32)


def batch_at(length: int, batch_size: int, *, drop_remainder: bool, epoch: int, position: int,
             offset: int) -> tuple[int, int, int]:
    """`(epoch, position, num_valid)` of the batch `offset` batches from the cursor `(epoch, position)`:
    0 is the batch `next()` returns next, -1 the one it returned last, in O(1) (no batch is made).

    Counting back assumes every epoch's batches start at position 0, as they do for an iterator that
    was never moved to an unaligned position (a trainer's); forward from an unaligned cursor, the
    batches of its epoch start at the cursor, as `schedule` lists them.

    Example:
        >>> batch_at(5, 2, drop_remainder=False, epoch=1, position=2, offset=-2)
        (0, 4, 1)
        >>> batch_at(5, 2, drop_remainder=False, epoch=1, position=2, offset=3)
        (2, 2, 2)
    """
    per_epoch = num_batches(length, batch_size, drop_remainder)
    if per_epoch == 0:
        raise ValueError(f"an epoch of {length} records has no batch of {batch_size} (drop_remainder="
                         f"{drop_remainder}), so no step reads a batch")
    if position >= per_epoch * batch_size or position >= length:  # past the epoch's last batch
        epoch, position = epoch + 1, 0
    if position % batch_size:
        if offset < 0:
            raise ValueError(f"the cursor (epoch {epoch}, position {position}) is not at a batch boundary of "
                             f"batch_size {batch_size}, so the batches before it are not known by arithmetic")
        left = num_batches(length - position, batch_size, drop_remainder)  # this epoch's batches from the cursor
        if offset < left:
            start = position + offset * batch_size
            return epoch, start, min(batch_size, length - start)
        epoch, position, offset = epoch + 1, 0, offset - left
    index = epoch * per_epoch + position // batch_size + offset
    if index < 0:
        raise ValueError(f"the batch {-offset} before the cursor (epoch {epoch}, position {position}) would lie "
                         "before epoch 0")
    epoch, k = divmod(index, per_epoch)
    start = k * batch_size
    return epoch, start, min(batch_size, length - start)
