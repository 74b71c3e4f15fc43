"""The pipeline iterator: yields batches, and saves/restores its position exactly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from datarax.batching import padded_positions
from datarax.control.prefetch import Prefetcher
from datarax.pipeline.state import IteratorStateError, check_state, make_state
from datarax.sources.stream import StreamSourceModule, stream_host_batches, to_device

if TYPE_CHECKING:
    from datarax.pipeline.pipeline import Pipeline


class PipelineIterator(Iterator[dict]):
    """Iterates a pipeline over one or more epochs.

    Its state, `{"version", "epoch", "position", "fingerprint", "num_records", "batch_size"}`, is
    the position after the last batch it returned; `set_state` on an iterator of an identically
    built pipeline continues with bitwise-identical batches. It is global: the same on every
    process of a sharded pipeline, so N processes' checkpoint resumes on M processes.
    """

    def __init__(self, pipeline: Pipeline, start_epoch: int, num_epochs: int | None, one_epoch: bool):
        self._pipeline = pipeline
        self._epoch = start_epoch
        self._position = 0
        self._num_epochs = num_epochs
        self._end = None if num_epochs is None else start_epoch + num_epochs
        self._one_epoch = one_epoch
        self._host: Prefetcher | None = None
        self._params, self._params_epoch = None, None
        self._stream_state: dict | None = None

    def _next_step(self) -> tuple[int, int, int]:
        """(epoch, position, num_valid) of the next batch; StopIteration at the end."""
        p = self._pipeline
        length, batch = len(p.sampler), p.batch_size
        epoch, position = self._epoch, self._position
        while self._end is None or epoch < self._end:
            remaining = length - position
            if remaining > 0 and not (p.drop_remainder and remaining < batch):
                return epoch, position, min(batch, remaining)
            epoch, position = epoch + 1, 0
        raise StopIteration

    def _steps(self, epoch: int, position: int) -> Iterator[tuple[int, int, np.ndarray, int]]:
        """(epoch, position, indices, num_valid) for every batch from (epoch, position) on."""
        p = self._pipeline
        length, batch = len(p.sampler), p.batch_size
        while self._end is None or epoch < self._end:
            remaining = length - position
            if remaining <= 0 or (p.drop_remainder and remaining < batch):
                epoch, position = epoch + 1, 0
                continue
            num_valid = min(batch, remaining)
            positions = padded_positions(position, p.compiled.rows, length)
            yield epoch, position, p.sampler.indices(positions, epoch), num_valid
            position += num_valid

    def _host_batches(self, epoch: int, position: int) -> Iterator[tuple]:
        p = self._pipeline
        if isinstance(p.source, StreamSourceModule):
            yield from stream_host_batches(p.source, batch_size=p.batch_size, drop_remainder=p.drop_remainder,
                                           ring_size=p.prefetch + 3, epoch=epoch, position=position,
                                           state=self._stream_state, end_epoch=self._end)
            return
        ring = [None] * (p.prefetch + 3)
        for i, (e, pos, idx, n) in enumerate(self._steps(epoch, position)):
            slot = i % len(ring)
            if ring[slot] is None:
                ring[slot] = p.source.get_batch(idx)
            else:
                p.source.get_batch(idx, out=ring[slot])
            # The copy must finish before this buffer is refilled len(ring) batches later; on CPU
            # device_put may alias an aligned buffer, so the sharded path hands over fresh copies.
            if p.placement is None:
                batch = to_device(ring[slot])
            else:
                batch = jax.block_until_ready(p.placement.put({k: v.copy() for k, v in ring[slot].items()}))
            yield e, pos, idx, n, batch, None

    def _start_host(self) -> None:
        self._stop_host()
        if self._pipeline.source.device_arrays() is None:
            self._host = Prefetcher(self._host_batches(self._epoch, self._position), self._pipeline.prefetch)

    def _stop_host(self) -> None:
        if self._host is not None:
            self._host.close()
            self._host = None

    def _device_params(self, epoch: int):
        if self._params_epoch != epoch:
            self._params, self._params_epoch = self._pipeline.sampler.device_params(epoch), epoch
        return self._params

    def __next__(self) -> dict:
        p = self._pipeline
        placement = p.placement
        arrays = p.source.device_arrays()
        stream_state = None
        if arrays is None:
            if self._host is None:
                self._start_host()
            epoch, position, idx, num_valid, batch, stream_state = next(self._host)
            meta = np.array([position, epoch, num_valid], np.int32)
            out = p.compiled.transform(batch, idx.astype(np.int32), meta)
        else:
            if placement is not None:
                arrays = placement.device_arrays(arrays)
            epoch, position, num_valid = self._next_step()
            meta = np.array([position, epoch, num_valid], np.int32)
            params = self._device_params(epoch)
            if params is None:
                positions = padded_positions(position, p.compiled.rows, len(p.sampler))
                idx = p.sampler.indices(positions, epoch).astype(np.int32)
                out = p.compiled.gather_transform(arrays, idx, meta)
            else:
                out = p.compiled.sample_gather_transform(arrays, params, meta)
        self._epoch, self._position = epoch, position + num_valid
        self._stream_state = stream_state
        if placement is not None:  # full global shape; padding rows are marked by the mask field
            return placement.assemble(out)
        if num_valid < p.batch_size:
            out = jax.tree.map(lambda x: x[:num_valid], out)
        return out

    def get_state(self) -> dict[str, Any]:
        """The position after the last returned batch, as a small JSON-able dict."""
        p = self._pipeline
        state = make_state(epoch=self._epoch, position=self._position, fingerprint=p.fingerprint,
                           num_records=len(p.source), batch_size=p.batch_size)
        if isinstance(p.source, StreamSourceModule):
            state["stream"] = self._stream_state
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from `state` (from `get_state` of an identically built pipeline)."""
        p = self._pipeline
        epoch, position = check_state(state, fingerprint=p.fingerprint, num_records=len(p.source),
                                      batch_size=p.batch_size, epoch_length=len(p.sampler))
        stream_state = None
        if isinstance(p.source, StreamSourceModule):
            if "stream" not in state:
                raise IteratorStateError("iterator state has no 'stream' entry, but this pipeline reads a stream "
                                         "source; restore a state saved from the same stream pipeline")
            stream_state = state["stream"]
        self._stop_host()
        self._epoch, self._position, self._stream_state = epoch, position, stream_state
        if self._one_epoch:
            self._end = epoch + 1
        # `for batch in pipeline` after this iterator continues after the epochs it covers.
        p._next_epoch = epoch + 1 if self._end is None else max(epoch + 1, self._end)
        self._start_host()

    def buffered(self) -> int | None:
        """Batches the background producer has ready (host-resident sources), None when the data is
        on the device (each batch is then one compiled call, nothing is produced ahead)."""
        if self._pipeline.source.device_arrays() is not None:
            return None
        return 0 if self._host is None else self._host.buffered()

    def close(self) -> None:
        """Stops background prefetching (idempotent)."""
        self._stop_host()

    def __enter__(self) -> PipelineIterator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        host = getattr(self, "_host", None)
        if host is not None:
            host._stop.set()

    async def save(self, directory):
        """Orbax v1 `StatefulCheckpointable` protocol (see `datarax.checkpoint`)."""
        from datarax.checkpoint.orbax import iterator_save

        return await iterator_save(self, directory)

    async def load(self, directory):
        """Orbax v1 `StatefulCheckpointable` protocol (see `datarax.checkpoint`)."""
        from datarax.checkpoint.orbax import iterator_load

        return await iterator_load(self, directory)
