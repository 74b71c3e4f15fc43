"""Batch arithmetic: counts against a Python enumeration of batches, padding positions, errors."""

from __future__ import annotations

import numpy as np
import pytest

from datarax.batching import check_batch_size, num_batches, padded_positions


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
