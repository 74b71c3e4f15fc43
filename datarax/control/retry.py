"""`RetryPolicy`: retry a failed read at the same position a bounded number of times, then raise.

A read from a network file system or an object store can fail once and succeed a moment later.
Without a policy, such an `OSError` reaches the caller of `next()`, and the next `next()` reads the
same batch again (the iterator never moves past records it did not return, and never ends
because of an error). With `Pipeline(..., retry_policy=RetryPolicy(max_retries=3))` the
background reader retries the read itself, after a backoff, and raises only when every retry
failed. Only `OSError` (which covers `TimeoutError`, `ConnectionError` and the like) is
retried; any other error is a bug or bad data, and retrying would only repeat it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TypeVar

from datarax.core.checks import check_int, check_number, field

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a pipeline's reader retries a read that raised `OSError`.

    Attributes:
        max_retries: retries after the first failed attempt (0: raise at once).
        backoff_s: the wait before the first retry; each later wait doubles it.
        max_backoff_s: the longest wait between two attempts.

    Example:
        >>> pipeline = Pipeline(source, stages, batch_size=64, retry_policy=RetryPolicy(max_retries=5))
    """

    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def __post_init__(self):
        check_int(*field(self, "max_retries"), 0)
        for name in ("backoff_s", "max_backoff_s"):
            try:
                check_number(*field(self, name), 0.0)
            except TypeError as exc:  # a bad number of seconds has always been a ValueError here
                raise ValueError(str(exc)) from None

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (0-based)."""
        return min(self.max_backoff_s, self.backoff_s * 2.0**retry)

    def call(self, read: Callable[[], T], *, sleep: Callable[[float], None] = time.sleep,
             permanent: tuple[type[BaseException], ...] = ()) -> T:
        """`read()`, retried after each `OSError` while retries are left; the last error is raised.

        `read` must start from the same position on every attempt (a stream reader reopens at
        the state before the failed read). `sleep` is injectable so tests need no real waits.
        `permanent` lists `OSError` kinds raised at once (e.g. `FileNotFoundError` where a file
        cannot come back).
        """
        for retry in range(self.max_retries):
            try:
                return read()
            except permanent:
                raise
            except OSError:
                sleep(self.delay(retry))
        return read()


NO_RETRY = RetryPolicy(max_retries=0)
