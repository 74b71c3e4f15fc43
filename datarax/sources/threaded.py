"""Parallel batch reads on a thread pool, for sources whose reading or decoding releases the GIL.

`ThreadedSource` reads each batch as contiguous chunks, concurrently, into the caller's buffers.
Per-record Python decoding does not get faster on threads: use `GrainStreamSource` over grain's
worker processes, or `HostMap` (in worker processes by default), for that.
"""

from __future__ import annotations

import jax
import numpy as np

from datarax.control.pool import ThreadPool
from datarax.core.checks import check_int, describe_value
from datarax.core.fields import allocate
from datarax.core.source import DataSourceModule
from datarax.samplers.base import Sampler
from datarax.samplers.simple import default_sampler


class ThreadedSource(DataSourceModule):
    """Wraps a host-resident source so that each batch is read by `num_threads` threads.

    Args:
        source: the source to read from (its `get_batch` must be safe to call concurrently on
            disjoint index chunks, as every source in `datarax.sources` is).
        num_threads: threads per batch read.
        min_chunk: the fewest records a thread is given (small batches use fewer threads).

    Example:
        >>> source = ThreadedSource(ArrayRecordSource(config, paths=files), num_threads=4)
    """

    def __init__(self, source: DataSourceModule, *, num_threads: int = 2, min_chunk: int = 16):
        if not isinstance(source, DataSourceModule):
            raise TypeError(f"ThreadedSource source must be a random-access DataSourceModule, "
                            f"got {describe_value(source)}")
        if source.device_arrays() is not None:
            raise ValueError("ThreadedSource source is device-resident (its gather runs inside the compiled step); "
                             "threads only help host-resident sources")
        self.source = source
        self.min_chunk = check_int(min_chunk, "ThreadedSource min_chunk", 1)
        self._pool = ThreadPool(check_int(num_threads, "ThreadedSource num_threads", 1), "datarax-read")

    def __len__(self) -> int:
        return len(self.source)

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return self.source.element_spec()

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        indices = np.asarray(indices)
        if out is None:
            out = allocate(self.element_spec(), indices.shape)
        flat = indices.reshape(-1)
        spec = self.element_spec()
        flat_out = {k: out[k].reshape((flat.size,) + tuple(spec[k].shape)) for k in spec}
        parts = max(1, min(self.num_threads, flat.size // self.min_chunk))
        bounds = np.linspace(0, flat.size, parts + 1).astype(np.int64)

        def read(chunk: tuple[int, int]) -> None:
            a, b = chunk
            self.source.get_batch(flat[a:b], {k: v[a:b] for k, v in flat_out.items()})

        self._pool.map(read, zip(bounds[:-1], bounds[1:]))
        return out

    @property
    def num_threads(self) -> int:
        return self._pool.num_threads

    def upcoming(self, indices: np.ndarray, epoch: int) -> None:
        self.source.upcoming(indices, epoch)

    def sampler(self) -> Sampler:
        return default_sampler(self.source)

    def structure(self) -> str:
        # Threads change how a batch is read, not what it holds.
        return self.source.structure()

    def close(self) -> None:
        """Stops the thread pool (idempotent)."""
        self._pool.close()
