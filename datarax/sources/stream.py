"""The stream contract: sources read in order, resumed from a small JSON state.

Some data cannot be read by index (a streaming HuggingFace `IterableDataset`, a grain
`IterDataset` with worker processes). Such a source is a `StreamSourceModule`: `open(epoch,
state)` returns a `RecordReader` positioned at `state` (None: the start of the epoch), which
copies the next records into the caller's buffers and reports its state after them.

The pipeline reads a stream on its background thread with `stream_host_batches`: full-size
reused buffers, a short final batch padded by repeating its last record (no recompilation),
and the reader's state carried with every batch, so the iterator's state after a batch is
exactly the state after that batch's records, whatever the prefetch depth. A stage's record id
for a stream record is its position in the epoch.

An epoch ends when the reader has no more records. A stream with an unknown length has
`len(source) == UNBOUNDED`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.core.checks import check_int
from datarax.samplers.base import Sampler
from datarax.sources._columns import allocate, spec_text

UNBOUNDED = 2**62


class RecordReader(abc.ABC):
    """Reads one epoch of a stream in order, from the position it was opened at."""

    @abc.abstractmethod
    def read(self, out: dict[str, np.ndarray], start: int, count: int) -> int:
        """Copies up to `count` next records into rows `start:start+count` of `out`.

        Returns how many were copied: fewer than `count` only at the end of the epoch.
        """

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]:
        """A JSON-able state: `open(epoch, state)` continues right after the records read so far."""

    def close(self) -> None:
        """Releases the reader's resources (idempotent)."""


class StreamSourceModule(nnx.Module, abc.ABC):
    """Abstract base of sources that are read in order, not by index."""

    @abc.abstractmethod
    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        """Shape and dtype of one record's fields (no batch axis)."""

    @abc.abstractmethod
    def open(self, epoch: int, state: dict[str, Any] | None) -> RecordReader:
        """A reader over `epoch`, at `state` (from `RecordReader.get_state`) or at its start."""

    def num_records(self) -> int | None:
        """Records per epoch when known, else None (an epoch ends when the stream does)."""
        return None

    def __len__(self) -> int:
        n = self.num_records()
        return UNBOUNDED if n is None else n

    def device_arrays(self) -> None:
        """Streams are host-resident."""
        return None

    def default_sampler(self) -> Sampler:
        return StreamSampler(len(self))

    def structure(self) -> str:
        return f"{type(self).__qualname__}(records={self.num_records()}, spec={spec_text(self.element_spec())})"


class StreamSampler(Sampler):
    """The positions of a stream epoch; a record's id is its position."""

    def __init__(self, num_records: int):
        self.num_records = int(num_records)

    def __len__(self) -> int:
        return self.num_records

    def indices(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64)


def check_stream_state(state: Any, keys: tuple[str, ...], owner: str) -> dict[str, Any]:
    """Validates a reader state dict holding (at least) the int fields `keys`."""
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise ValueError(f"{owner} stream state must be a dict with keys {list(keys)} from get_state(), got "
                         f"{state!r:.200}; it is corrupt or from another source")
    for k in keys:
        check_int(state[k], f"{owner} stream state {k}", 0, hint="; the state is corrupt")
    return state


def to_device(buffers: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    """Copies reused host buffers to the default device and waits for the copy.

    On CPU, `jax.device_put` may alias a 64-byte-aligned numpy buffer instead of copying it
    (seen with jax 0.10, also with `may_alias=False`); a ring buffer refilled later would then
    change a batch already handed out, so the copy is forced there.
    """
    if jax.default_backend() == "cpu":
        return jax.block_until_ready({k: jnp.array(v, copy=True) for k, v in buffers.items()})
    return jax.block_until_ready(jax.device_put(buffers))


def _pad(buffers: dict[str, np.ndarray], valid: int) -> None:
    # The padded tail repeats the last record, as the random-access path clips its indices.
    for buf in buffers.values():
        buf[valid:] = buf[valid - 1]


class _EpochReader:
    """One epoch's reader that a failed read closes; the next read reopens it where the batch began.

    The reader may have consumed part of a batch before failing, so a retry (by a retry policy,
    or by the next `next()` of the iterator) reopens it at the state after the last full batch.
    """

    def __init__(self, source: StreamSourceModule, epoch: int, state: dict[str, Any] | None):
        self._source, self._epoch, self._state = source, epoch, state
        self._reader: RecordReader | None = None

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


def stream_host_batches(source: StreamSourceModule, *, batch_size: int, drop_remainder: bool, ring_size: int,
                        epoch: int, position: int, state: dict[str, Any] | None,
                        end_epoch: int | None, retry_policy: Any = None) -> Iterator[tuple]:
    """Yields `(epoch, position, record_ids, num_valid, device_batch, state_after)` per batch.

    Reads from (`epoch`, `position`, `state`) on; each batch is `batch_size` rows (a short final
    batch padded), copied to the device before the next read reuses its host buffer, which is
    one of `ring_size` buffers (more than the consumer can hold at once). A read that raises
    is retried at the same state under `retry_policy` (a `datarax.pipeline.RetryPolicy`; None:
    the error is raised at once).
    """
    spec = source.element_spec()
    ring: list[dict[str, np.ndarray] | None] = [None] * ring_size
    step = 0
    while end_epoch is None or epoch < end_epoch:
        reader = _EpochReader(source, epoch, state)
        fresh = state is None and position == 0
        try:
            while True:
                slot = step % ring_size
                if ring[slot] is None:
                    ring[slot] = allocate(spec, (batch_size,))
                buffers = ring[slot]
                if retry_policy is None:
                    valid = reader.read(buffers, batch_size)
                else:
                    valid = retry_policy.call(lambda: reader.read(buffers, batch_size))  # noqa: B023 (called at once)
                if valid == 0 or (drop_remainder and valid < batch_size):
                    break
                if valid < batch_size:
                    _pad(buffers, valid)
                ids = np.minimum(np.arange(position, position + batch_size, dtype=np.int64), position + valid - 1)
                batch = to_device(buffers)
                yield epoch, position, ids, valid, batch, reader.commit()
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
