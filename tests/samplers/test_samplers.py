import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from datarax.batching import schedule
from datarax.samplers import (
    EpochAwareSampler,
    RangeSampler,
    SequentialSampler,
    ShuffleSampler,
    SlidingWindowSampler,
)


def batches(sampler, batch_size, *, drop_remainder=False, num_epochs=1, epoch=0, position=0) -> list[np.ndarray]:
    """The sampler's index batches as a pipeline iterator walks them (the schedule, then `indices`)."""
    steps = schedule(len(sampler), batch_size, drop_remainder=drop_remainder, epoch=epoch, position=position,
                     end_epoch=num_epochs)
    return [sampler.indices(np.arange(p, p + n), e) for e, p, n in steps]


RANGE_GRID = [(start, stop, step)
              for start, stop, step in itertools.product([0, 1, 3, 10, 17], [0, 1, 5, 12, 20], [1, 2, 3, 7, -1, -2, -5])
              if len(range(start, stop, step)) > 0]


@pytest.mark.parametrize("start,stop,step", RANGE_GRID)
def test_range_sampler_equals_python_range(start, stop, step):
    sampler = RangeSampler(start, stop, step)
    expected = list(range(start, stop, step))
    assert len(sampler) == len(expected)
    assert sampler.indices(np.arange(len(sampler)), 0).tolist() == expected
    assert np.concatenate(batches(sampler, 3)).tolist() == expected


def test_range_sampler_device_indices_match_host():
    for start, stop, step in RANGE_GRID[::7]:
        s = RangeSampler(start, stop, step)
        pos = np.arange(len(s))
        dev = jax.jit(lambda p, s=s: s.device_indices(p, s.device_params(0)))(jnp.asarray(pos, jnp.int32))
        np.testing.assert_array_equal(np.asarray(dev), s.indices(pos, 0))


def test_range_sampler_single_argument_and_errors():
    assert RangeSampler(4).indices(np.arange(4), 0).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="step must not be zero"):
        RangeSampler(0, 5, 0)
    with pytest.raises(ValueError, match="must be >= 0"):
        RangeSampler(-3, 5)
    with pytest.raises(TypeError, match="start must be an int"):
        RangeSampler(0.5, 5)


def test_sequential_and_shuffle_batches_cover_each_epoch_once():
    for sampler in (SequentialSampler(23), ShuffleSampler(23, seed=5)):
        got = batches(sampler, 5, num_epochs=2)
        assert [len(b) for b in got] == [5, 5, 5, 5, 3] * 2
        for epoch in range(2):
            ids = np.concatenate(got[epoch * 5:(epoch + 1) * 5])
            np.testing.assert_array_equal(np.sort(ids), np.arange(23))


def test_drop_remainder_in_sampler_iteration():
    got = batches(ShuffleSampler(23, seed=1), 5, drop_remainder=True, num_epochs=1)
    assert [len(b) for b in got] == [5, 5, 5, 5]


def test_sampler_batches_resume_exactly_from_any_cursor():
    """A fresh sampler from the cursor after k batches gives the rest: samplers hold no state."""
    full = batches(ShuffleSampler(50, seed=2), 7, num_epochs=3)
    steps = list(schedule(50, 7, end_epoch=3))
    for k in (0, 3, 7, 8, 15, 21):
        epoch, position = (0, 0) if k == 0 else (steps[k - 1][0], steps[k - 1][1] + steps[k - 1][2])
        rest = batches(ShuffleSampler(50, seed=2), 7, num_epochs=3, epoch=epoch, position=position)
        assert len(rest) == len(full) - k
        for a, b in zip(rest, full[k:]):
            np.testing.assert_array_equal(a, b)


def test_shuffle_device_indices_match_host():
    s = ShuffleSampler(1000, seed=11)
    f = jax.jit(s.device_indices)
    for epoch in range(3):
        pos = np.arange(1000)
        np.testing.assert_array_equal(np.asarray(f(jnp.asarray(pos), s.device_params(epoch))), s.indices(pos, epoch))


def test_sliding_window_matches_manual_windows():
    s = SlidingWindowSampler(10, window=4, stride=3)
    assert len(s) == 3
    assert s.indices(np.arange(3), 0).tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    shuffled = SlidingWindowSampler(10, window=4, stride=3, shuffle=True, seed=1)
    rows = sorted(map(tuple, shuffled.indices(np.arange(3), 0).tolist()))
    assert rows == [(0, 1, 2, 3), (3, 4, 5, 6), (6, 7, 8, 9)]
    dev = jax.jit(shuffled.device_indices)(jnp.arange(3), shuffled.device_params(0))
    np.testing.assert_array_equal(np.asarray(dev), shuffled.indices(np.arange(3), 0))
    with pytest.raises(ValueError, match=r"window \(11\) is longer than the data \(10 records\)"):
        SlidingWindowSampler(10, window=11)


def test_epoch_aware_stream_straddles_epochs_and_resumes():
    s = EpochAwareSampler(10, seed=4, num_epochs=3)
    got = batches(s, 4)  # the whole stream is one pipeline epoch
    assert [len(b) for b in got] == [4] * 7 + [2]
    ids = np.concatenate(got)
    for e in range(3):
        np.testing.assert_array_equal(np.sort(ids[e * 10:(e + 1) * 10]), np.arange(10))
        np.testing.assert_array_equal(ids[e * 10:(e + 1) * 10], ShuffleSampler(10, seed=4).indices(np.arange(10), e))
    assert s.epoch_of(np.array([0, 9, 10, 29])).tolist() == [0, 0, 1, 2]
    fresh = EpochAwareSampler(10, seed=4, num_epochs=3)
    np.testing.assert_array_equal(np.concatenate(batches(fresh, 4, position=12)), ids[12:])
    endless = EpochAwareSampler(3, seed=0)
    stream = endless.indices(np.arange(200))
    for e in range(200 // 3):
        np.testing.assert_array_equal(stream[e * 3:(e + 1) * 3], ShuffleSampler(3, seed=0).indices(np.arange(3), e))
    with pytest.raises(TypeError, match="has no length, so a pipeline cannot use it"):
        len(endless)
