"""`AheadRunner`: a host stage's batches through worker processes, the next batch started before
this one is read, so no worker waits for another's rows between batches."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from datarax.host.processes import SharedOutputs, WorkerCrashError, WorkerPool

Flight = tuple[Hashable, int, SharedOutputs, int]  # (batch key, the pool's ticket, segment, rows)


class AheadRunner:
    """Runs batches through `pool` into `lookahead + 1` shared segments: the batch read now and
    those named ahead of their read (`ahead`), whose chunks the workers take as soon as they finish
    this one's.

    `chunks(data, ctx)` splits a batch into the pool's `(low, high, task)` chunks, and `key(ctx)`
    names a batch (its records, epoch, stage and seed). A batch started ahead is kept until it is
    read; when a batch needs a segment and all are taken (a retry, a rewind), the oldest batch
    started is dropped.
    """

    def __init__(self, pool: WorkerPool, spec: Sequence[tuple[str, tuple[int, ...], str]],
                 chunks: Callable[[Any, Any], list], key: Callable[[Any], Hashable], lookahead: int = 2):
        self.pool, self.chunks, self.key = pool, chunks, key
        self.segments = tuple(SharedOutputs(spec) for _ in range(lookahead + 1))
        self.flights: list[Flight] = []  # oldest first
        self.lock = threading.Lock()

    def ahead(self, data: Any, ctx: Any) -> None:
        """Starts the batch `ctx` names (one to be read after the batch read next) if a segment is free."""
        with self.lock:
            if len(self.flights) < len(self.segments) and self.key(ctx) not in self._keys():
                self._start(data, ctx)

    def run(self, data: Any, ctx: Any, out: dict[str, np.ndarray]) -> list[Any]:
        """The batch's chunk results, its rows copied into `out` (decoded ahead or now)."""
        key = self.key(ctx)
        with self.lock:
            found = self._take(key)
            if found is None:  # not started ahead: start it now
                self._start(data, ctx)
                found = self._take(key)
            results, segment, count = found
            for name, view in segment.views(count).items():
                np.copyto(out[name], view)
        return results

    def _keys(self) -> list[Hashable]:
        return [flight[0] for flight in self.flights]

    def _start(self, data: Any, ctx: Any) -> None:
        while len(self.flights) == len(self.segments):  # all taken: drop the oldest batch started
            self._finish(self.flights.pop(0), wanted=False)
        taken = [flight[2] for flight in self.flights]
        segment = next(s for s in self.segments if all(s is not t for t in taken))
        segment.ensure(len(data))
        ticket = self.pool.start(segment, self.chunks(data, ctx))
        self.flights.append((self.key(ctx), ticket, segment, len(data)))

    def _take(self, key: Hashable) -> tuple[list[Any], SharedOutputs, int] | None:
        """The results, segment and rows of the batch `key` started earlier (None if none was)."""
        keys = self._keys()
        if key not in keys:
            return None
        flight = self.flights.pop(keys.index(key))
        return self._finish(flight, wanted=True), flight[2], flight[3]

    def _finish(self, flight: Flight, wanted: bool) -> list[Any] | None:
        try:
            return self.pool.finish(flight[1])
        except Exception as exc:
            self.flights.clear()  # the pool stopped: every batch in flight is lost
            if wanted or not isinstance(exc, WorkerCrashError):
                raise
            return None  # a batch not asked for: the fresh pool decodes the one asked

    def close(self) -> None:
        """Stops the workers and frees the segments (a later batch starts them again)."""
        with self.lock:
            self.pool.close()
            self.flights.clear()
            for segment in self.segments:
                segment.close()
