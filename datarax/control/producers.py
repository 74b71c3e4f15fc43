"""Batch producers: the generators a host-resident pipeline runs on its prefetch thread.

Each yields one `HostBatch` per batch, its data already copied to the device out of one of
`ring_size(prefetch)` reused host buffers. They are functions of their arguments, not iterator
methods, so the prefetch thread does not keep the iterator alive: an iterator dropped without
`close()` is collected, and its `__del__` stops the thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from datarax.batching import padded_positions
from datarax.core.checks import check_int_range, narrowed_dtype
from datarax.monitoring.stages import StageTimes

# The names of the reader's own parts in its `StageTimes` (host stages add theirs).
READ = "source read"
COPY = "copy to device"


class HostBatch(NamedTuple):
    """One batch from a producer, at `(epoch, position)` of the schedule."""

    epoch: int
    position: int
    indices: np.ndarray  # the record id of each row (padding rows repeat the last one)
    num_valid: int
    data: dict  # the batch on the device
    stream_state: dict | None  # a stream reader's state after this batch (None: random access)


def ring_size(prefetch: int) -> int:
    """Reused host buffers a producer cycles through for a prefetch queue of `prefetch` batches.

    A buffer is refilled only after every batch that may still be read from it is done: the
    `prefetch` queued, the one the consumer holds, the one being produced, and one for the
    copy to the device still in flight.
    """
    return prefetch + 3


def to_device(buffers: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Copies reused host buffers to the default device. On an accelerator the copy runs on after
    the call returns: `DeviceCopies` waits for it before the buffers are refilled.

    On CPU, `jax.device_put` may alias a 64-byte-aligned numpy buffer instead of copying it
    (seen with jax 0.10, also with `may_alias=False`); a ring buffer refilled later would then
    change a batch already handed out, so the copy is forced there, and waited for.
    """
    if jax.default_backend() == "cpu":
        return jax.block_until_ready({k: jnp.array(v, copy=True) for k, v in buffers.items()})
    return jax.device_put(buffers)


class DeviceCopies:
    """The device batch last copied out of each host buffer of a producer's ring.

    The copy of batch n to an accelerator runs while the producer reads batch n + 1 into another
    buffer; a buffer is refilled only after the copy out of it is done (`wait`, ring_size batches
    later, so it seldom waits), and the time waited counts as copying in the reader's times.
    """

    def __init__(self, size: int, times: StageTimes):
        self.batches: list[dict[str, jax.Array] | None] = [None] * size
        self.times, self.waited = times, 0.0
        self.in_flight = jax.default_backend() != "cpu"  # on CPU `to_device` has waited already

    def wait(self, slot: int) -> None:
        """Blocks until the copy out of buffer `slot` is done (before the buffer is refilled)."""
        batch, self.batches[slot] = self.batches[slot], None
        if batch is not None:
            began = self.times.clock()
            jax.block_until_ready(batch)
            self.waited += self.times.clock() - began

    def put(self, slot: int, buffers: dict[str, np.ndarray], records: int) -> dict[str, jax.Array]:
        """Starts the copy of buffer `slot` to the device; returns the device batch."""
        began = self.times.clock()
        batch = to_device(buffers)
        if self.in_flight:
            self.batches[slot] = batch
        self.times.add(COPY, self.waited + self.times.clock() - began, records=records, work="copy")
        self.waited = 0.0
        return batch


def check_int_fields(batch: dict[str, np.ndarray], source: Any, ids: np.ndarray, rows: int | None = None) -> None:
    """Refuses a batch whose 64-bit integer field holds a value JAX would wrap (64-bit mode off),
    naming the source, the field, the value and the record: the check of sources whose values
    are first seen a batch at a time (files read per batch, streams). A few comparisons per
    64-bit field; nothing for the other dtypes."""
    flat_ids = np.asarray(ids).reshape(-1)
    inner = getattr(source, "source", source)  # behind host stages, the source the user built
    describe_record = getattr(source, "describe_record", lambda record: f"the record at position {record}")
    for name, values in batch.items():
        if narrowed_dtype(values.dtype) is None:
            continue
        check_int_range(values[:rows] if rows is not None else values, type(inner).__name__, name,
                        where=lambda row: describe_record(int(flat_ids[min(row, flat_ids.size - 1)])),
                        fix="cast the field where the data is written (to int32, or float64), or leave it out")


def indexed_host_batches(pipeline: Any, steps: Iterator[tuple[int, int, int]]) -> Iterator[HostBatch]:
    """A random-access source's batches for each `(epoch, position, num_valid)` of `steps`."""
    p = pipeline
    length = len(p.sampler)
    ring = [None] * ring_size(p.prefetch)
    times = p.reader_times
    copies = DeviceCopies(len(ring), times)
    steps = iter(steps)
    following = next(steps, None)
    i = -1
    while following is not None:
        i += 1
        epoch, position, num_valid = following
        idx = p.sampler.indices(padded_positions(position, p.compiled.rows, length), epoch)
        following = next(steps, None)
        if following is not None:  # the source may start fetching the next batch's records now
            p.source.upcoming(p.sampler.indices(padded_positions(following[1], p.compiled.rows, length),
                                                following[0]), following[0])
        slot = i % len(ring)
        copies.wait(slot)
        with times.measure(READ, records=num_valid, work="read"):
            if ring[slot] is None:
                ring[slot] = p.retry_policy.call(lambda: p.source.read(idx, epoch))  # called at once
            else:
                p.retry_policy.call(lambda: p.source.read(idx, epoch, out=ring[slot]))  # called at once
        check_int_fields(ring[slot], p.source, idx)
        # On CPU device_put may alias an aligned buffer, so the sharded path hands over fresh copies.
        if p.placement is None:
            batch = copies.put(slot, ring[slot], num_valid)
        else:
            with times.measure(COPY, records=num_valid, work="copy"):
                batch = jax.block_until_ready(p.placement.put({k: v.copy() for k, v in ring[slot].items()}))
        yield HostBatch(epoch, position, idx, num_valid, batch, None)


def _pad(buffers: dict[str, np.ndarray], valid: int) -> None:
    # The padded tail repeats the last record, as the random-access path clips its indices.
    for buf in buffers.values():
        buf[valid:] = buf[valid - 1]


class _EpochReader:
    """One epoch's reader that a failed read closes; the next read reopens it where the batch began.

    The reader may have consumed part of a batch before failing, so a retry (by a retry policy,
    or by the next `next()` of the iterator) reopens it at the state after the last full batch.
    """

    def __init__(self, source: Any, epoch: int, state: dict[str, Any] | None):
        self._source, self._epoch, self._state = source, epoch, state
        self._reader = None

    def read(self, buffers: dict[str, np.ndarray], count: int) -> int:
        if self._reader is None:
            self._reader = self._source.open(self._epoch, self._state)
        try:
            return self._reader.read(buffers, 0, count)
        except BaseException:
            self.close()
            raise

    def commit(self) -> dict[str, Any]:
        """The state after the records read so far, where a later failed read restarts."""
        self._state = self._reader.get_state()
        return self._state

    def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()


def stream_host_batches(source: Any, *, batch_size: int, drop_remainder: bool, ring_size: int,
                        epoch: int, position: int, state: dict[str, Any] | None,
                        end_epoch: int | None, retry_policy: Any = None,
                        times: StageTimes | None = None) -> Iterator[HostBatch]:
    """A `datarax.sources.StreamSourceModule`'s batches from (`epoch`, `position`, `state`) on.

    Each batch is `batch_size` rows (a short final batch padded) in one of `ring_size` host
    buffers (more than the consumer can hold at once), copied to the device (on an accelerator
    while the next batch is read) before its buffer is refilled. A read that raises is retried at
    the same state under `retry_policy` (a `datarax.pipeline.RetryPolicy`; None: the error is
    raised at once). The reads and copies are timed into `times` (None: a throwaway `StageTimes`).
    """
    times = StageTimes() if times is None else times
    spec = source.element_spec()
    ring: list[dict[str, np.ndarray] | None] = [None] * ring_size
    copies = DeviceCopies(ring_size, times)
    step = 0
    while end_epoch is None or epoch < end_epoch:
        reader = _EpochReader(source, epoch, state)
        fresh = state is None and position == 0
        try:
            while True:
                slot = step % ring_size
                if ring[slot] is None:
                    ring[slot] = {k: np.empty((batch_size, *s.shape), s.dtype) for k, s in spec.items()}
                buffers = ring[slot]
                copies.wait(slot)
                began = times.clock()
                if retry_policy is None:
                    valid = reader.read(buffers, batch_size)
                else:
                    valid = retry_policy.call(lambda: reader.read(buffers, batch_size))  # called at once
                times.add(READ, times.clock() - began, records=valid, work="read")
                if valid == 0 or (drop_remainder and valid < batch_size):
                    break
                ids = np.minimum(np.arange(position, position + batch_size, dtype=np.int64), position + valid - 1)
                check_int_fields(buffers, source, ids, valid)
                if valid < batch_size:
                    _pad(buffers, valid)
                data = copies.put(slot, buffers, valid)
                yield HostBatch(epoch, position, ids, valid, data, reader.commit())
                step += 1
                position += valid
                fresh = False
                if valid < batch_size:
                    break
        finally:
            reader.close()
        if fresh:
            raise ValueError(f"{type(source).__name__} yielded no {'full ' if drop_remainder else ''}batch in epoch "
                             f"{epoch}; the stream is empty (or shorter than batch_size={batch_size} with "
                             "drop_remainder=True)")
        epoch, position, state = epoch + 1, 0, None
