"""The one lazy thread pool: per-record decoders, file reads, chunked batch reads and the shards'
range requests run on it.

Threads pay off only where the work releases the GIL (file reads, Pillow and libsndfile decodes,
numpy copies). The pool starts on first use, runs inline for one thread or one item, and copies
and pickles as its settings (threads and locks neither copy nor pickle; a copy starts its own).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from datarax.core.checks import check_positive_int

# How long `close` waits for the threads in all: a thread stuck in a read that never returns (a
# hung network mount) is a daemon thread and is left to end with the process, never joined.
CLOSE_WAIT_S = 5.0


def _work(tasks: queue.SimpleQueue) -> None:
    while True:
        task = tasks.get()
        if task is None:
            return
        task()
        # Dropped before waiting for the next one: the finished task's closure holds the pool's
        # owner (a decoding stage, a source), which would otherwise never be collected, and so
        # never run the finaliser that stops these threads.
        del task


def _stop_threads(tasks: queue.SimpleQueue, count: int) -> None:
    for _ in range(count):
        tasks.put(None)


class ThreadPool:
    """`map(fn, items)` on `num_threads` daemon threads named `name`, started on first use.

    Daemon threads, not `concurrent.futures`' workers: Python joins those at exit, so one read
    blocked forever (a FIFO, a hung mount) would keep a Ctrl-C'd process from ever exiting.

    Example:
        >>> pool = ThreadPool(4, "datarax-read")
        >>> pool.map(lambda x: x * x, range(4))
        [0, 1, 4, 9]
    """

    def __init__(self, num_threads: int, name: str):
        self.num_threads = check_positive_int(num_threads, f"{name} num_threads", unit="threads")
        self.name = name
        self._lock = threading.Lock()
        self._tasks: queue.SimpleQueue | None = None
        self._threads: list[threading.Thread] = []
        self._stopper: weakref.finalize | None = None

    def _start(self) -> queue.SimpleQueue:
        tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=_work, args=(tasks,), name=f"{self.name}_{i}", daemon=True)
                         for i in range(self.num_threads)]
        for thread in self._threads:
            thread.start()
        # A pool dropped without close() still stops its threads (they hold no reference to it).
        self._stopper = weakref.finalize(self, _stop_threads, tasks, self.num_threads)
        self._tasks = tasks
        return tasks

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        """`[fn(item) for item in items]`, in order; an exception from `fn` is raised here, once
        every thread has stopped.

        Each of the `num_threads` threads takes every `num_threads`-th item: one task per thread
        rather than a future per item, and a batch's slow items spread over the threads.
        """
        items = list(items)
        workers = min(self.num_threads, len(items))
        if workers <= 1:
            return [fn(item) for item in items]
        with self._lock:
            tasks = self._tasks if self._tasks is not None else self._start()
        results: list[Any] = [None] * workers
        errors: list[BaseException | None] = [None] * workers
        left = [workers]
        done = threading.Condition()

        def stride(start: int) -> None:
            try:
                results[start] = [fn(item) for item in items[start::workers]]
            except BaseException as exc:  # raised in the caller's thread below
                errors[start] = exc
            finally:
                with done:
                    left[0] -= 1
                    done.notify_all()

        for start in range(workers):
            tasks.put(lambda start=start: stride(start))
        with done:
            while left[0]:
                done.wait()
        for error in errors:
            if error is not None:
                raise error
        out: list[Any] = [None] * len(items)
        for start, part in enumerate(results):
            out[start::workers] = part
        return out

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """Runs `fn(*args)` on a pool thread; returns its future (cancelled if `cancel()`ed first)."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def task() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # the caller's future.result() raises it
                    future.set_exception(exc)

        with self._lock:
            tasks = self._tasks if self._tasks is not None else self._start()
        tasks.put(task)
        return future

    def close(self) -> None:
        """Stops the threads (idempotent; a later `map` starts them again), waiting at most
        `CLOSE_WAIT_S` in all for threads that are still in a task."""
        with self._lock:
            stopper, threads = self._stopper, self._threads
            self._tasks, self._threads, self._stopper = None, [], None
        if stopper is not None:
            stopper()
        deadline = time.monotonic() + CLOSE_WAIT_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def __getstate__(self) -> dict[str, Any]:
        return {"num_threads": self.num_threads, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["num_threads"], state["name"])

    def __repr__(self) -> str:
        return f"ThreadPool({self.num_threads}, {self.name!r})"
