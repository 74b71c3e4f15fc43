"""The pipeline iterator's cursor: `cursor`, `seek`, `upcoming`, and the pipeline's epoch reservation."""

import gc
import threading
import weakref

import jax
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.batching import schedule
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.typing import Element

N = 22


def noisy(element: Element, key: jax.Array) -> Element:
    return element.update_data({"x": element.data["x"] + jax.random.normal(key, element.data["x"].shape)})


def build(resident=True, batch_size=6, drop_remainder=False) -> Pipeline:
    data = {"id": np.arange(N, dtype=np.int32), "x": np.arange(N * 2, dtype=np.float32).reshape(N, 2)}
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=1, device_resident=resident), data=data)
    stage = ElementOperator(ElementOperatorConfig(stochastic=True), fn=noisy, rngs=nnx.Rngs(0))
    return Pipeline(source, [stage], batch_size, drop_remainder=drop_remainder)


def assert_same_batches(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for key in b:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("drop", [False, True])
def test_seek_to_the_cursor_after_k_batches_continues_with_the_same_batches(resident, drop):
    full = list(build(resident, drop_remainder=drop).epochs(3))
    for k in (0, 1, 3, 4, 7, len(full)):
        it = build(resident, drop_remainder=drop).epochs(3)
        for _ in range(k):
            next(it)
        cursor = it.cursor
        assert cursor == (it.get_state()["epoch"], it.get_state()["position"])
        it.close()
        fresh = build(resident, drop_remainder=drop).epochs(3)
        fresh.seek(*cursor)
        assert fresh.cursor == cursor
        assert_same_batches(list(fresh), full[k:])


def test_upcoming_lists_the_batches_next_returns_without_consuming_them():
    it = build().epochs(2)
    next(it)
    upcoming = list(it.upcoming())
    assert upcoming == list(schedule(N, 6, epoch=0, position=6, end_epoch=2))
    for epoch, position, num_valid in upcoming:
        batch = next(it)
        assert len(batch["id"]) == num_valid and it.cursor == (epoch, position + num_valid)
    assert list(it.upcoming()) == [] and it.end_epoch == 2


def test_seek_keeps_the_iterators_epochs_and_the_pipelines_next_epoch():
    pipeline = build()
    it = pipeline.epochs(2)
    assert pipeline.next_epoch == 2
    it.seek(1, 18)
    assert [len(b["id"]) for b in it] == [4] and pipeline.next_epoch == 2
    one = iter(pipeline)  # epoch 2 only
    one.seek(5, 0)  # past its end: nothing left
    assert list(one) == [] and one.end_epoch == 3


@pytest.mark.parametrize("epoch,position,match", [
    (-1, 0, r"seek epoch must be an int >= 0, got -1"),
    (0, N + 1, rf"seek position must be an int in \[0, {N}\] \(the epoch has {N} records\), got {N + 1}"),
    (True, 0, r"seek epoch must be an int >= 0, got True"),
    (0, 1.0, r"seek position must be an int in \[0, 22\]"),
])
def test_seek_rejects_a_cursor_outside_the_epoch(epoch, position, match):
    with pytest.raises(ValueError, match=match):
        build().epochs(1).seek(epoch, position)


def test_reserve_epochs_claims_ranges_for_iterators():
    pipeline = build()
    assert pipeline.reserve_epochs(3) == 0 and pipeline.next_epoch == 3
    assert pipeline.epochs(None).cursor == (3, 0) and pipeline.next_epoch == 3  # endless claims none
    assert iter(pipeline).cursor == (3, 0) and pipeline.next_epoch == 4
    assert pipeline.reserve_epochs(2, start=10) == 10 and pipeline.next_epoch == 12
    with pytest.raises(ValueError, match=r"num_epochs must be an int >= 0 or None, got -1"):
        pipeline.reserve_epochs(-1)


def test_a_dropped_iterator_is_collected_and_stops_its_producer():
    """The producer thread does not hold the iterator, so dropping it stops the thread."""
    before = set(threading.enumerate())
    it = build(resident=False).epochs(None)
    next(it)
    (producer,) = set(threading.enumerate()) - before
    ref = weakref.ref(it)
    del it
    gc.collect()
    assert ref() is None
    producer.join(timeout=10)
    assert not producer.is_alive()
