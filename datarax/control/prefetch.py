"""A background thread that runs an iterator ahead of its consumer, through a bounded queue.

An error raised by the iterator is raised by the consumer's `next()`, and by every later call:
a failed producer never looks like one that finished.

`close()` never deadlocks: the producer only ever blocks on `put` with a timeout and checks the
stop flag between tries, and the consumer side drains the queue while waiting for the thread.
At interpreter exit every prefetcher still running is closed first (`atexit`): a daemon thread
killed in the middle of native code (a tokenizer in Rust, a decoder in C) can abort the process.
The wait is bounded (`EXIT_WAIT_S` for all of them): a thread stuck in a read that never returns
is left to end with the process, so Ctrl-C always exits.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Generic, TypeVar

from datarax.core.checks import check_int

T = TypeVar("T")

_DONE = object()
_POLL_S = 0.05
_LIVE: weakref.WeakSet = weakref.WeakSet()


# At exit, the prefetchers still running get this long in all (not each) to stop their threads.
EXIT_WAIT_S = 3.0


@atexit.register
def _close_all() -> None:
    # Every producer is told to stop first, then waited for against one deadline: a producer stuck
    # in a read that never returns (a FIFO, a hung mount) costs the exit EXIT_WAIT_S, not 5 s per
    # prefetcher (a Ctrl-C'd pipeline with an eval and a train iterator took 15 s).
    prefetchers = list(_LIVE)
    for prefetcher in prefetchers:
        prefetcher.stop()
    deadline = time.monotonic() + EXIT_WAIT_S
    for prefetcher in prefetchers:
        prefetcher.close(timeout=max(0.0, deadline - time.monotonic()))


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Prefetcher(Iterator[T], Generic[T]):
    """Iterates `source` on a daemon thread, at most `buffer_size` items ahead.

    Example:
        >>> with Prefetcher(iter(range(3)), buffer_size=2) as p:
        ...     list(p)
        [0, 1, 2]
    """

    def __init__(self, source: Iterator[T], buffer_size: int = 2, name: str = "datarax-prefetch"):
        check_int(buffer_size, "buffer_size", 1)
        self._source = source
        self._queue: queue.Queue = queue.Queue(maxsize=buffer_size)
        self._stop = threading.Event()
        self._finished = False
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _LIVE.add(self)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._source:
                if not self._put(item):
                    return
            self._put(_DONE)
        except BaseException as exc:  # re-raised in the consumer's thread
            self._put(_Failure(exc))

    def __next__(self) -> T:
        if self._failure is not None:
            raise self._failure  # an error is never followed by a silent end
        if self._finished:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if self._stop.is_set() or (not self._thread.is_alive() and self._queue.empty()):
                    self._finished = True
                    raise StopIteration from None
        if item is _DONE:
            self._finished = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._finished = True
            self._failure = item.exc
            raise item.exc
        return item

    def stop(self) -> None:
        """Asks the producer to stop, without waiting for it (safe in `__del__`); `close` also waits."""
        self._stop.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stops the producer and waits for its thread; safe to call more than once."""
        self._stop.set()
        self._finished = True
        while self._thread.is_alive():
            try:
                while True:
                    self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(_POLL_S)
            timeout -= _POLL_S
            if timeout <= 0:
                break
        close = getattr(self._source, "close", None)
        if close is not None and not self._thread.is_alive():
            close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def buffered(self) -> int:
        """Items produced and waiting in the queue right now (0: the consumer will wait)."""
        return self._queue.qsize()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_stop", None) is not None:
            self.stop()
