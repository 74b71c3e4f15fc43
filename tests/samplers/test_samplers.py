import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from datarax.samplers import (
    EpochAwareSampler,
    RangeSampler,
    SequentialSampler,
    ShuffleSampler,
    SlidingWindowSampler,
)

RANGE_GRID = [(start, stop, step)
              for start, stop, step in itertools.product([0, 1, 3, 10, 17], [0, 1, 5, 12, 20], [1, 2, 3, 7, -1, -2, -5])
              if len(range(start, stop, step)) > 0]


@pytest.mark.parametrize("start,stop,step", RANGE_GRID)
def test_range_sampler_equals_python_range(start, stop, step):
    sampler = RangeSampler(start, stop, step)
    expected = list(range(start, stop, step))
    assert len(sampler) == len(expected)
    assert sampler.indices(np.arange(len(sampler)), 0).tolist() == expected
    batches = list(sampler.iter_batches(3))
    assert np.concatenate(batches).tolist() == expected


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
        it = sampler.iter_batches(5, num_epochs=2)
        batches = list(it)
        assert [len(b) for b in batches] == [5, 5, 5, 5, 3] * 2
        for epoch in range(2):
            ids = np.concatenate(batches[epoch * 5:(epoch + 1) * 5])
            np.testing.assert_array_equal(np.sort(ids), np.arange(23))


def test_drop_remainder_in_sampler_iteration():
    batches = list(ShuffleSampler(23, seed=1).iter_batches(5, drop_remainder=True, num_epochs=1))
    assert [len(b) for b in batches] == [5, 5, 5, 5]


def test_sampler_iterator_resumes_exactly():
    sampler = ShuffleSampler(50, seed=2)
    full = list(sampler.iter_batches(7, num_epochs=3))
    for k in (0, 3, 7, 8, 15, 21):
        it = sampler.iter_batches(7, num_epochs=3)
        for _ in range(k):
            next(it)
        state = it.get_state()
        fresh = ShuffleSampler(50, seed=2).iter_batches(7, num_epochs=3)
        fresh.set_state(state)
        rest = list(fresh)
        assert len(rest) == len(full) - k
        for a, b in zip(rest, full[k:]):
            np.testing.assert_array_equal(a, b)


def test_sampler_state_errors():
    it = SequentialSampler(10).iter_batches(3)
    with pytest.raises(ValueError, match="version"):
        it.set_state({"epoch": 0})
    with pytest.raises(ValueError, match=r"position must be in \[0, 10\]"):
        it.set_state({"version": 1, "epoch": 0, "position": 11})


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
    stream = s.stream(4)
    batches = list(stream)
    assert [len(b) for b in batches] == [4] * 7 + [2]
    ids = np.concatenate(batches)
    for e in range(3):
        np.testing.assert_array_equal(np.sort(ids[e * 10:(e + 1) * 10]), np.arange(10))
        np.testing.assert_array_equal(ids[e * 10:(e + 1) * 10], ShuffleSampler(10, seed=4).indices(np.arange(10), e))
    assert s.epoch_of(np.array([0, 9, 10, 29])).tolist() == [0, 0, 1, 2]
    it = s.stream(4)
    next(it), next(it), next(it)
    fresh = EpochAwareSampler(10, seed=4, num_epochs=3).stream(4)
    fresh.set_state(it.get_state())
    np.testing.assert_array_equal(np.concatenate(list(fresh)), ids[12:])
    endless = EpochAwareSampler(3, seed=0).stream(2)
    assert len([next(endless) for _ in range(100)]) == 100
