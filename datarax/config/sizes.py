"""Up-front checks of a configuration's sizes, each naming its TOML key, before anything is allocated.

`batch_size` may not exceed an epoch's records, and the batches held at once (plus what the source
and host stages keep, `held_bytes()`) must fit in host and device memory. docs/config.md
("What datarax guarantees") gives the counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from datarax.config.schema import ConfigError
from datarax.control.budget import host_memory_bytes
from datarax.control.budget import human as human
from datarax.control.producers import ring_size


def memory_bytes() -> int | None:
    """The memory a batch may use: physical host memory, or the first device's limit if smaller
    (None when neither is known)."""
    limits = []
    host = host_memory_bytes()
    if host is not None:
        limits.append(host)
    try:
        import jax

        stats = jax.local_devices()[0].memory_stats() or {}
        if stats.get("bytes_limit"):
            limits.append(int(stats["bytes_limit"]))
    except Exception:  # a backend without memory statistics: the host limit stands
        pass
    return min(limits) if limits else None


def spec_bytes(spec: Any) -> int:
    """Bytes of the arrays a (nested) dict of `ShapeDtypeStruct`s describes."""
    if isinstance(spec, Mapping):
        return sum(spec_bytes(v) for v in spec.values())
    return math.prod(spec.shape) * np.dtype(spec.dtype).itemsize


def epoch_records(source: Any, sampler: Any) -> int | None:
    """Records of an epoch: the sampler's, else the source's (None for a stream of unknown length)."""
    if sampler is not None:
        return len(sampler)
    counted = getattr(source, "num_records", None)
    if callable(counted):
        return counted()
    return len(source)


def check_batch_fits_epoch(batch_size: int, records: int | None, drop_remainder: bool) -> None:
    """Raises `ConfigError` at `batch_size` when one batch is more than an epoch's records."""
    if records is None or batch_size <= records:
        return
    outcome = ("every epoch would hold no batch (drop_remainder = true)" if drop_remainder else
               f"its one batch would be {batch_size - records:,} rows of padding around the data")
    message = (f"batch_size {batch_size:,} is larger than the {records:,} records of an epoch, so {outcome}; "
               f"use a batch_size of at most {records:,}")
    raise ConfigError([message])


def held_bytes(*components: Any) -> int:
    """What components keep in memory besides the batches: the sum of their `held_bytes()` (a
    `ShardedSource`'s block cache, a stage's decode budget); 0 for those without one."""
    return sum(int(c.held_bytes()) for c in components if callable(getattr(c, "held_bytes", None)))


def check_memory(batch_size: int, prefetch: int, record_bytes: int, host_resident: bool, what: str,
                 dispatch_ahead: int = 0, held: int = 0) -> None:
    """Raises `ConfigError` at `batch_size` when the batches held at once exceed `memory_bytes()`, or
    they plus the `held` bytes the source and stages keep exceed the host's memory."""
    in_flight = ring_size(prefetch) if host_resident else 2 + dispatch_ahead
    # Each row also carries its int64 record id through the sampler and the program.
    row = (record_bytes + 8) * in_flight
    for limit, kept in ((memory_bytes(), 0), (host_memory_bytes(), held) if held else (None, 0)):
        needed = batch_size * row + kept
        if limit is not None and needed > limit:
            break
    else:
        return
    fit = max(0, limit - kept) // row
    holder = (f"batch_size {batch_size:,} with prefetch {prefetch}" if host_resident
              else f"batch_size {batch_size:,} with dispatch_ahead {dispatch_ahead}")
    caches = f" plus {human(kept)} the source and stages keep (their caches and budgets)" if kept else ""
    fix = (f"use a batch_size of at most {fit:,}" + (" (or a smaller prefetch)" if host_resident
                                                     else " (or a smaller dispatch_ahead)" if dispatch_ahead else "")
           if fit >= 1 else
           "what the source and stages keep leaves no room for a batch: lower a decoding stage's max_decode_bytes or a "
           "sharded source's cache_blocks" if kept >= limit else
           "not even one record fits: make the records (or what the stages make of them) smaller")
    message = (f"{holder} needs about {human(needed)} ({in_flight} batches of {human(record_bytes)} {what} per "
               f"record{caches}), more than the {human(limit)} of memory here; {fix}")
    raise ConfigError([message])
