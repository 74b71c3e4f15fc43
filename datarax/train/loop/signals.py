"""SIGTERM and SIGINT as a graceful stop request while `Trainer.fit` runs."""

from __future__ import annotations

import signal
import threading
from typing import Any


class StopOnSignals:
    """Turns SIGTERM/SIGINT into a graceful stop request for the duration of `fit`.

    A second SIGINT raises KeyboardInterrupt, so a user can still break out of a stuck save.
    """

    def __init__(self, trainer: Any):
        self._trainer = trainer
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self._trainer.stop_reason is not None:
            raise KeyboardInterrupt
        self._trainer.request_stop(signal.Signals(signum).name)

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
