"""Checks every source's tests share: epoch coverage and exact resume through a real Pipeline."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np

from datarax import Pipeline


def epoch_values(pipeline: Pipeline, field: str) -> np.ndarray:
    """The values of `field` over the pipeline's next epoch, in order."""
    return np.concatenate([np.asarray(batch[field]) for batch in pipeline])


def check_shuffled_coverage(make_pipeline: Callable[[], Pipeline], field: str, expected: np.ndarray) -> None:
    """Each epoch holds every record exactly once, in an order that is neither storage order nor
    the previous epoch's."""
    pipeline = make_pipeline()
    first, second = epoch_values(pipeline, field), epoch_values(pipeline, field)
    for values in (first, second):
        np.testing.assert_array_equal(np.sort(values, axis=0), np.sort(expected, axis=0))
    assert not np.array_equal(first, expected), "shuffle=True but epoch 0 is in storage order"
    assert not np.array_equal(first, second), "epochs 0 and 1 came in the same order"


def check_exact_resume(make_pipeline: Callable[[], Pipeline], field: str, seed: int, epochs: int = 2) -> None:
    """Stopping at a random step, saving the state (through JSON) and restoring it into a freshly
    built pipeline continues with exactly the batches of an uninterrupted run."""
    reference = [np.asarray(b[field]) for b in make_pipeline().epochs(epochs)]
    stop = int(np.random.default_rng(seed).integers(1, len(reference) - 1))
    with make_pipeline().epochs(epochs) as interrupted:
        for _ in range(stop):
            next(interrupted)
        state = json.loads(json.dumps(interrupted.get_state()))
    with make_pipeline().epochs(epochs) as resumed:
        resumed.set_state(state)
        rest = [np.asarray(b[field]) for b in resumed]
    assert len(rest) == len(reference) - stop
    for got, want in zip(rest, reference[stop:]):
        np.testing.assert_array_equal(got, want)
