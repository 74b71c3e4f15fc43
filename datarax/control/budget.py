"""The one memory budget shared by a decoding stage's threads (or worker processes: `SharedBudget`).

Each decode reserves its estimated memory (from what the record declares, e.g. width x height)
before it allocates, waits while the others hold too much, and gives it back when done, so the
stage never holds more than `limit` bytes. A record whose estimate alone is over the limit never
fits (`fits` says so) and is refused as a bad record.

Example:
    >>> budget = MemoryBudget(2**30, "DecodeImage")
    >>> with budget.reserve(700 * 2**20):
    ...     pass  # decode here; a second 700 MB record waits until this one is done
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

DEFAULT_FRACTION = 4  # a quarter of the host's memory ...
DEFAULT_CAP = 8 * 2**30  # ... and at most 8 GiB: the model, the batches and the other stages need the rest


def human(n: float) -> str:
    """`97.7 KiB`, `7.28 TiB`."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:,.0f} bytes" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"


def host_memory_bytes() -> int | None:
    """The host's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def default_budget() -> int:
    """A decoding stage's budget when none is given: a quarter of the host's memory, at most 8 GiB
    (2 GiB where the host's memory is unknown)."""
    memory = host_memory_bytes()
    return min(memory // DEFAULT_FRACTION, DEFAULT_CAP) if memory else 2 * 2**30


class MemoryBudget:
    """At most `limit` bytes reserved at once by the threads that share it.

    Attributes:
        limit: the bound, in bytes.
        peak: the most bytes ever reserved at once (for tests and monitoring).
    """

    def __init__(self, limit: int, name: str):
        self.limit = int(limit)
        self.name = name
        self.peak = 0
        self._held = 0
        self._changed = threading.Condition()

    def fits(self, nbytes: int) -> bool:
        """Whether a reservation of `nbytes` can ever be granted (it is at most the limit)."""
        return nbytes <= self.limit

    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        """Holds `nbytes` of the budget for the `with` block, first waiting until they fit.

        Raises:
            ValueError: `nbytes` is over the whole limit (check `fits` first, to refuse the record).
        """
        nbytes = max(0, int(nbytes))
        if not self.fits(nbytes):
            raise ValueError(f"{self.name} cannot reserve {nbytes:,} bytes of a {self.limit:,}-byte budget")
        with self._changed:
            # Every reservation fits alone, so once the others give theirs back this one goes ahead.
            self._changed.wait_for(lambda: self._held + nbytes <= self.limit)
            self._held += nbytes
            self.peak = max(self.peak, self._held)
        try:
            yield
        finally:
            with self._changed:
                self._held -= nbytes
                self._changed.notify_all()

    def __getstate__(self) -> dict[str, Any]:
        return {"limit": self.limit, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["limit"], state["name"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.limit}, {self.name!r})"


class SharedBudget(MemoryBudget):
    """A `MemoryBudget` shared by worker processes: its count lives in shared memory.

    Made from a `multiprocessing` context `ctx`; it reaches a worker only as an argument of the
    worker's process (as every `multiprocessing` lock does), not by pickling afterwards.
    """

    def __init__(self, limit: int, name: str, ctx: Any):
        self.limit, self.name = int(limit), name
        self._shared = ctx.Array("q", 2, lock=False)  # [held, peak]
        self._changed = ctx.Condition()

    @property
    def peak(self) -> int:
        return int(self._shared[1])

    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        nbytes = max(0, int(nbytes))
        if not self.fits(nbytes):
            raise ValueError(f"{self.name} cannot reserve {nbytes:,} bytes of a {self.limit:,}-byte budget")
        shared = self._shared
        with self._changed:
            self._changed.wait_for(lambda: shared[0] + nbytes <= self.limit)
            shared[0] += nbytes
            shared[1] = max(shared[1], shared[0])
        try:
            yield
        finally:
            with self._changed:
                shared[0] -= nbytes
                self._changed.notify_all()

    def __getstate__(self) -> dict[str, Any]:  # only while a process starts (multiprocessing's rule)
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
