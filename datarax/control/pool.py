"""The one lazy thread pool: per-record decoders, file reads and chunked batch reads run on it.

Threads pay off only where the work releases the GIL (file reads, Pillow and libsndfile decodes,
numpy copies). The pool starts on first use, runs inline for one thread or one item, and copies
and pickles as its settings (threads and locks neither copy nor pickle; a copy starts its own).
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable
from typing import Any

from datarax.core.checks import check_positive_int


class ThreadPool:
    """`map(fn, items)` on `num_threads` threads named `name`, started on first use.

    Example:
        >>> pool = ThreadPool(4, "datarax-read")
        >>> pool.map(lambda x: x * x, range(4))
        [0, 1, 4, 9]
    """

    def __init__(self, num_threads: int, name: str):
        self.num_threads = check_positive_int(num_threads, f"{name} num_threads", unit="threads")
        self.name = name
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

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
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.num_threads, thread_name_prefix=self.name)
            pool = self._pool

        def stride(start: int) -> list[Any]:
            return [fn(item) for item in items[start::workers]]

        futures = [pool.submit(stride, start) for start in range(workers)]
        concurrent.futures.wait(futures)
        out: list[Any] = [None] * len(items)
        for start, future in enumerate(futures):
            out[start::workers] = future.result()
        return out

    def close(self) -> None:
        """Stops the threads (idempotent; a later `map` starts them again)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __getstate__(self) -> dict[str, Any]:
        return {"num_threads": self.num_threads, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["num_threads"], state["name"])

    def __repr__(self) -> str:
        return f"ThreadPool({self.num_threads}, {self.name!r})"
