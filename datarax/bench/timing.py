"""Timing helpers shared by benchmark scenarios: medians over repeats, blocking on results."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax


def block(tree: Any) -> Any:
    return jax.block_until_ready(tree)


def epoch_rate(run_epoch: Callable[[], Iterable[Any]], num_records: int, repeats: int) -> dict:
    """Times `repeats` full epochs (each result blocked on at the end) and returns el/s stats.

    `run_epoch()` returns an iterable of batches; the clock stops after the last one is ready.
    """
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        last = None
        for last in run_epoch():
            pass
        block(last)
        rates.append(num_records / (time.perf_counter() - start))
    return {"el_s": statistics.median(rates), "el_s_runs": [round(r, 1) for r in rates]}


def first_batch_seconds(make_iterator: Callable[[], Iterable[Any]]) -> float:
    start = time.perf_counter()
    block(next(iter(make_iterator())))
    return time.perf_counter() - start


def row(scenario: str, datarax: dict, floor: dict, **extra: Any) -> dict:
    """One result line: datarax and its floor side by side, with their ratio."""
    out = {"scenario": scenario, "datarax_el_s": round(datarax["el_s"], 1), "floor_el_s": round(floor["el_s"], 1),
           "ratio": round(datarax["el_s"] / floor["el_s"], 3)}
    out.update({"datarax_runs": datarax["el_s_runs"], "floor_runs": floor["el_s_runs"]})
    out.update(extra)
    out["backend"] = jax.default_backend()
    return out
