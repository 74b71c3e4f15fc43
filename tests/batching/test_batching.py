"""Batch arithmetic: counts and the schedule against a Python enumeration of batches, padding
positions, errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from datarax.batching import batch_at, check_batch_size, num_batches, padded_positions, schedule


def enumerate_batches(length, batch_size, drop, epoch, position, end_epoch):
    """(epoch, first position, size) of each batch, by slicing Python lists: the reference."""
    steps = []
    for e in range(epoch, end_epoch):
        records = list(range(length))[position if e == epoch else 0:]
        for chunk in (records[i:i + batch_size] for i in range(0, len(records), batch_size)):
            if not (drop and len(chunk) < batch_size):
                steps.append((e, chunk[0], len(chunk)))
    return steps


SCHEDULE_CASES = [
    (length, batch_size, drop, epoch, position)
    for length, batch_size, drop, epoch in itertools.product([0, 1, 7, 8, 9, 20], [1, 3, 8, 25], [False, True], [0, 2])
    for position in sorted({0, 1, batch_size, length - 1, length})
    if 0 <= position <= length
]


@pytest.mark.parametrize("length,batch_size,drop,epoch,position", SCHEDULE_CASES)
def test_schedule_equals_a_python_enumeration_of_batches(length, batch_size, drop, epoch, position):
    want = enumerate_batches(length, batch_size, drop, epoch, position, epoch + 3)
    got = list(schedule(length, batch_size, drop_remainder=drop, epoch=epoch, position=position,
                        end_epoch=epoch + 3))
    assert got == want
    endless = schedule(length, batch_size, drop_remainder=drop, epoch=epoch, position=position)
    assert list(itertools.islice(endless, len(want))) == want
    if num_batches(length, batch_size, drop) == 0:  # an endless schedule of empty epochs ends at once
        assert list(schedule(length, batch_size, drop_remainder=drop, epoch=epoch, position=position)) == []


@pytest.mark.parametrize("length,batch_size,drop", [(20, 3, False), (20, 3, True), (9, 8, False)])
def test_schedule_resumed_at_any_cursor_continues_the_same_batches(length, batch_size, drop):
    full = list(schedule(length, batch_size, drop_remainder=drop, end_epoch=3))
    assert len(full) == 3 * num_batches(length, batch_size, drop)
    for k, (epoch, position, n) in enumerate(full):
        rest = schedule(length, batch_size, drop_remainder=drop, epoch=epoch, position=position + n, end_epoch=3)
        assert list(rest) == full[k + 1:]


@pytest.mark.parametrize("length,batch_size,drop", [(20, 3, False), (20, 3, True), (9, 8, False), (8, 8, True),
                                                    (1, 4, False)])
def test_batch_at_counts_from_any_cursor_as_the_python_enumeration_does(length, batch_size, drop):
    full = enumerate_batches(length, batch_size, drop, 0, 0, 4)
    for k, (epoch, position, n) in enumerate(full):  # the cursor after batch k: reach every batch from it
        for j, want in enumerate(full):
            assert batch_at(length, batch_size, drop_remainder=drop, epoch=epoch, position=position + n,
                            offset=j - k - 1) == want
    with pytest.raises(ValueError, match="before epoch 0"):
        batch_at(length, batch_size, drop_remainder=drop, epoch=0, position=0, offset=-1)
    for start in range(1, length):  # an unaligned cursor: forward as the enumeration from it
        want = enumerate_batches(length, batch_size, drop, 1, start, 3)
        assert [batch_at(length, batch_size, drop_remainder=drop, epoch=1, position=start, offset=j)
                for j in range(len(want))] == want


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 64, 100])
@pytest.mark.parametrize("batch_size", [1, 3, 8, 128])
@pytest.mark.parametrize("drop", [False, True])
def test_num_batches_counts_the_batches_of_a_python_enumeration(length, batch_size, drop):
    batches = [list(range(length))[i:i + batch_size] for i in range(0, length, batch_size)]
    if drop:
        batches = [b for b in batches if len(b) == batch_size]
    assert num_batches(length, batch_size, drop) == len(batches)


def test_padded_positions_repeat_the_last_position_of_the_epoch():
    rows = np.arange(4)
    np.testing.assert_array_equal(padded_positions(0, rows, 10), [0, 1, 2, 3])
    np.testing.assert_array_equal(padded_positions(8, rows, 10), [8, 9, 9, 9])
    np.testing.assert_array_equal(padded_positions(np.array([[0], [8]]), rows, 10), [[0, 1, 2, 3], [8, 9, 9, 9]])


@pytest.mark.parametrize("bad", [0, -3, 2.0, True, "8", None])
def test_check_batch_size_rejects_what_is_not_a_positive_int(bad):
    with pytest.raises(ValueError, match=rf"batch_size must be a positive int, got {bad!r}"):
        check_batch_size(bad)
    assert check_batch_size(np.int64(5)) == 5 and type(check_batch_size(np.int64(5))) is int
