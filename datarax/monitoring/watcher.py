"""Timing helpers shared with the training kit (`datarax.train`): a thread that records when each
step's output became ready, and the overlap of an interval with sorted host intervals."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np


class ReadyWatcher:
    """Waits on submitted outputs off the main thread, in order, and reports `on_ready(index, time)`.

    `time` is `time.perf_counter()` when `jax.block_until_ready` returned: the moment the work that
    produced the output finished on the device (to within the thread's wake-up latency). A failed
    computation is reported as ready when it failed; its error is the main thread's to raise.
    """

    def __init__(self, on_ready: Callable[[int, float], None], name: str = "datarax-ready-watcher",
                 clock: Callable[[], float] = time.perf_counter):
        self._on_ready = on_ready
        self._clock = clock
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            index, output = item
            try:
                jax.block_until_ready(output)
            except Exception:  # the main thread reports the failure; only the time matters here
                pass
            self._on_ready(index, self._clock())

    def submit(self, index: int, output: Any) -> None:
        self._queue.put((index, output))

    def close(self) -> None:
        """Waits for every submitted output, then stops the thread (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


def overlap(starts: np.ndarray, ends: np.ndarray, begin: float, end: float) -> float:
    """Total overlap of `[begin, end]` with sorted, disjoint segments `[starts[k], ends[k]]`."""
    lo = np.searchsorted(ends, begin, side="right")
    hi = np.searchsorted(starts, end, side="left")
    if hi <= lo:
        return 0.0
    s, e = starts[lo:hi], ends[lo:hi]
    return float(np.clip(np.minimum(e, end) - np.maximum(s, begin), 0.0, None).sum())
