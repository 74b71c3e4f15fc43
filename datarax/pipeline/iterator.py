"""The pipeline iterator: yields batches, and saves/restores its position exactly."""

from __future__ import annotations

import itertools
import operator
from collections import deque
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from datarax.batching import chunk_schedule, padded_positions, schedule
from datarax.control.prefetch import Prefetcher
from datarax.control.producers import indexed_host_batches, ring_size, stream_host_batches
from datarax.core.checks import MAX_INT32, check_int
from datarax.pipeline.state import CheckpointableIterator, IteratorStateError, check_state, make_state
from datarax.sources.stream import StreamSourceModule


class Chunk(NamedTuple):
    """Batches sampled on the device ahead, from `start` of `epoch` (`CompiledProgram.sample_chunk`)."""

    epoch: int
    start: int
    rows: list  # one device array per batch, for `CompiledProgram.expand_gather_and_run`
    params: Any  # the sampler's device parameters for `epoch`
    valid: int  # rows that hold batches of the epoch (the rest are past its end)


class PipelineIterator(CheckpointableIterator):
    """Iterates a pipeline over one or more epochs.

    Its state, `{"version", "epoch", "position", "fingerprint", "num_records", "batch_size"}`, is
    the position after the last batch it returned; `set_state` on an iterator of an identically
    built pipeline continues with bitwise-identical batches. It is global: the same on every
    process of a sharded pipeline, so N processes' checkpoint resumes on M processes.

    Args:
        pipeline: the `datarax.Pipeline` to iterate (typed loosely: the pipeline module imports
            this one, not the other way round).
        start_epoch: the first epoch (claimed from the pipeline with `reserve_epochs`).
        num_epochs: how many epochs to run; None: endlessly.
        one_epoch: a restored state moves the iterator to the state's epoch (`iter(pipeline)`),
            rather than keeping its range of epochs (`pipeline.epochs(n)`).
    """

    def __init__(self, pipeline: nnx.Module, start_epoch: int, num_epochs: int | None, one_epoch: bool):
        self._pipeline = pipeline
        self._end = None if num_epochs is None else start_epoch + num_epochs
        self._one_epoch = one_epoch
        self._host: Prefetcher | None = None
        self._params, self._params_epoch = None, None
        self._chunk: Chunk | None = None  # the last sampled chunk
        self._ahead: deque = deque()  # (epoch, position, num_valid, output) dispatched, not yet returned
        self._ahead_values: list = []
        self._move(start_epoch, 0, None)

    @property
    def pipeline(self) -> nnx.Module:
        """The pipeline this iterator reads."""
        return self._pipeline

    @property
    def cursor(self) -> tuple[int, int]:
        """`(epoch, position)` after the last batch returned: where the next batch starts."""
        return self._epoch, self._position

    @property
    def end_epoch(self) -> int | None:
        """The first epoch this iterator does not reach (None: it is endless)."""
        return self._end

    def upcoming(self) -> Iterator[tuple[int, int, int]]:
        """`(epoch, position, num_valid)` of the batches `next()` will return, without consuming them."""
        p = self._pipeline
        return schedule(len(p.sampler), p.batch_size, drop_remainder=p.drop_remainder, epoch=self._epoch,
                        position=self._position, end_epoch=self._end)

    def seek(self, epoch: int, position: int) -> None:
        """Moves the cursor: the next batch is the one starting at `position` of `epoch`.

        The iterator keeps its range of epochs and the pipeline's next epoch is unchanged (unlike
        `set_state`, which restores a saved iterator). `ScanRunner` uses this to leave the
        iterator where a Python loop over the same batches would.

        Example:
            >>> it = pipeline.epochs(3)
            >>> it.seek(1, 64)  # skip epoch 0 and the first 64 records of epoch 1
        """
        p = self._pipeline
        if isinstance(p.source, StreamSourceModule):
            raise TypeError(f"seek cannot move a stream pipeline ({type(p.source).__name__}): its position also "
                            "needs the stream reader's state; restore a saved state with set_state")
        check_int(epoch, "seek epoch", 0)
        check_int(epoch, "seek epoch", high=MAX_INT32, why=" (the program holds it as int32)")
        length = len(p.sampler)
        check_int(position, "seek position", 0, high=length, why=f" (the epoch has {length} records)")
        self._move(epoch, position, None)

    def _move(self, epoch: int, position: int, stream_state: dict | None) -> None:
        self._stop_host()
        self._epoch, self._position, self._stream_state = epoch, position, stream_state
        self._ahead.clear()
        # A device-resident source steps through this schedule on the caller's thread; a
        # host-resident one gets its own in the producer when that starts.
        p = self._pipeline
        arrays = p.source.device_arrays()
        if arrays is not None and p.placement is not None:
            arrays = p.placement.device_arrays(arrays)
        self._arrays = arrays  # the device-resident arrays as the program takes them (None: host-resident)
        self._schedule = self.upcoming() if arrays is not None else None

    def _start_host(self) -> None:
        self._stop_host()
        p = self._pipeline
        if p.source.device_arrays() is not None:
            return
        if isinstance(p.source, StreamSourceModule):
            batches = stream_host_batches(p.source, batch_size=p.batch_size, drop_remainder=p.drop_remainder,
                                          ring_size=ring_size(p.prefetch), epoch=self._epoch, position=self._position,
                                          state=self._stream_state, end_epoch=self._end,
                                          retry_policy=p.retry_policy, times=p.reader_times)
        else:
            batches = indexed_host_batches(p, self.upcoming())
        self._host = Prefetcher(batches, p.prefetch)
        p.track_reader(self._host)

    def _stop_host(self, wait: bool = True) -> None:
        if self._host is not None:
            if wait:
                self._host.close()
            else:
                self._host.stop()
            self._host = None

    def _dispatch(self, arrays, step: tuple[int, int, int], values: list) -> list[tuple]:
        """Dispatches the device-resident batch `step = (epoch, position, num_valid)` and, when the
        pipeline computes several batches per program, the batches after it in the same sampled
        chunk (taken from the schedule); returns `(epoch, position, num_valid, output)` of each."""
        p = self._pipeline
        compiled, batch = p.compiled, p.batch_size
        epoch, position, num_valid = step
        chunk = self._chunk
        k = position - chunk.start if chunk is not None and chunk.epoch == epoch else -1
        if not (0 <= k < len(chunk.rows) * batch and k % batch == 0):  # not the next row of the chunk sampled ahead
            if self._params_epoch != epoch:
                self._params, self._params_epoch = p.sampler.device_params(epoch), epoch
            params = self._params
            if params is None:  # a host-only sampler: indices from the host, one small copy per batch
                positions = padded_positions(position, compiled.rows, len(p.sampler))
                idx = p.sampler.indices(positions, epoch).astype(np.int32)
                meta = np.array([position, epoch, num_valid], np.int32)
                return [(*step, compiled.gather_and_run(values, arrays, idx, meta))]
            metas = chunk_schedule(len(p.sampler), batch, compiled.chunk_batches, drop_remainder=p.drop_remainder,
                                   epoch=epoch, position=position)
            chunk = self._chunk = Chunk(epoch, position, compiled.sample_chunk(params, metas), params,
                                        int(np.count_nonzero(metas[:, 2])))
            k = 0
        row = k // batch
        count = min(p.batches_per_dispatch, chunk.valid - row)
        if p.batches_per_dispatch == 1 or count < 1:
            return [(*step, compiled.expand_gather_and_run(values, arrays, chunk.params, chunk.rows[row]))]
        # The chunk's rows are the schedule's next batches of this epoch: take as many as one program computes.
        steps = [step, *itertools.islice(self._schedule, count - 1)]
        rows = chunk.rows[row:row + len(steps)]
        rows += [rows[-1]] * (p.batches_per_dispatch - len(rows))  # one program shape; the padding is dropped
        outs = compiled.expand_gather_and_run_many(values, arrays, chunk.params, tuple(rows))
        return [(*s, out) for s, out in zip(steps, outs)]

    def _next_device(self, arrays) -> tuple[int, int, int, Any]:
        """`(epoch, position, num_valid, output)` of the next device-resident batch, keeping
        `pipeline.dispatch_ahead` more dispatched behind it."""
        p = self._pipeline
        ahead = self._ahead
        values = p.compiled.values()
        if ahead and not all(map(operator.is_, values, self._ahead_values)):
            # A stage's variables changed since those batches were dispatched: they must see the new ones.
            ahead.clear()
            self._schedule = self.upcoming()
        self._ahead_values = values
        try:
            while len(ahead) <= p.dispatch_ahead:
                step = next(self._schedule, None)
                if step is None:
                    break
                ahead.extend(self._dispatch(arrays, step, values))
        except BaseException:
            # Nothing was returned past the cursor: start again from it on the next call.
            ahead.clear()
            self._schedule = self.upcoming()
            raise
        if not ahead:
            raise StopIteration
        return ahead.popleft()

    def __next__(self) -> dict:
        p = self._pipeline
        placement = p.placement
        arrays = self._arrays
        stream_state = None
        if arrays is None:
            if self._host is None:
                self._start_host()
            try:
                got = next(self._host)
                meta = np.array([got.position, got.epoch, got.num_valid], np.int32)
                out = p.compiled.run(p.compiled.values(), got.data, got.indices.astype(np.int32), meta)
                epoch, position, num_valid, stream_state = got.epoch, got.position, got.num_valid, got.stream_state
            except StopIteration:
                raise
            except BaseException as exc:
                # The producer has moved past the failed batch (or stopped): the next call
                # restarts it at the cursor, so no record is skipped and the stream never
                # ends because of an error; a persistent error is raised again by every call.
                # Ctrl-C (KeyboardInterrupt) does not wait for the producer: it may be stuck in a
                # read that never returns (a FIFO, a hung mount); told to stop, it ends by itself.
                self._stop_host(wait=isinstance(exc, Exception))
                raise
        else:
            epoch, position, num_valid, out = self._next_device(arrays)
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
            stream_state = self._check_stream_state(state, epoch, position)
        # Everything is checked: only now does the iterator move (a failed set_state changes nothing).
        if self._one_epoch:
            self._end = epoch + 1
        # `for batch in pipeline` after this iterator continues after the epochs it covers.
        p.reserve_epochs(1 if self._end is None else max(1, self._end - epoch), start=epoch)
        self._move(epoch, position, stream_state)
        self._start_host()

    def _check_stream_state(self, state: dict[str, Any], epoch: int, position: int) -> dict[str, Any] | None:
        """The state's `stream` entry, proven by opening (and closing) a reader at it."""
        source = self._pipeline.source
        if "stream" not in state:
            raise IteratorStateError("iterator state has no 'stream' entry, but this pipeline reads a stream "
                                     "source; restore a state saved from the same stream pipeline")
        stream_state = state["stream"]
        if stream_state is None:
            if position != 0:
                raise IteratorStateError(f"iterator state 'stream' entry is None (the start of an epoch) but its "
                                         f"position is {position}; the state is corrupt")
            return None
        try:
            reader = source.open(epoch, stream_state)
        except OSError:
            raise  # the state may be fine and the storage briefly unreachable: not a corrupt state
        except Exception as exc:
            raise IteratorStateError(f"iterator state 'stream' entry {stream_state!r:.200} cannot be opened by "
                                     f"{type(source).__name__}: {exc}; the state is corrupt or from another "
                                     "source") from exc
        reader.close()
        return stream_state

    def buffered(self) -> int | None:
        """Batches the background producer has ready (host-resident sources), None when the data is
        on the device (each batch is then one compiled call, nothing is produced ahead)."""
        if self._pipeline.source.device_arrays() is not None:
            return None
        return 0 if self._host is None else self._host.buffered()

    def close(self) -> None:
        """Stops background prefetching and drops batches dispatched ahead (idempotent)."""
        self._stop_host()
        self._ahead.clear()

    def __del__(self):
        host = getattr(self, "_host", None)
        if host is not None:
            host.stop()
