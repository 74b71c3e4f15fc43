import tracemalloc

import jax.numpy as jnp
import numpy as np
import pytest

from datarax.core.checks import check_seed
from datarax.samplers.feistel import FeistelPermutation, feistel_device, round_keys

SIZES = [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 100, 255, 256, 257, 1000, 4097, 65535, 65536, 65537]


@pytest.mark.parametrize("n", SIZES)
def test_every_epoch_is_a_permutation_and_inverse_undoes_it(n):
    for epoch in range(3):
        perm = FeistelPermutation(n, seed=1234, epoch=epoch)
        ids = perm(np.arange(n))
        np.testing.assert_array_equal(np.sort(ids), np.arange(n))
        np.testing.assert_array_equal(perm.inverse(ids), np.arange(n))


@pytest.mark.parametrize("n", [5, 17, 1000, 65537])
def test_device_evaluation_equals_host(n):
    for seed, epoch in [(0, 0), (7, 3), (2**40 + 5, 11)]:
        host = FeistelPermutation(n, seed, epoch)(np.arange(n))
        dev = feistel_device(jnp.arange(n), jnp.asarray(round_keys(seed, epoch)), n)
        np.testing.assert_array_equal(np.asarray(dev), host)


def test_epochs_and_seeds_give_different_orders():
    n = 1000
    orders = {tuple(FeistelPermutation(n, s, e)(np.arange(n))) for s in range(3) for e in range(3)}
    assert len(orders) == 9
    # Not close to the identity: few fixed points (a random permutation has ~1 on average).
    assert np.sum(FeistelPermutation(n, 0, 0)(np.arange(n)) == np.arange(n)) < 10


def test_orders_look_uniform():
    # Position of record 0 over many seeds is spread over the whole range (chi-square-ish bound).
    n = 64
    positions = [int(FeistelPermutation(n, s, 0).inverse(np.array([0]))[0]) for s in range(2000)]
    counts = np.bincount(positions, minlength=n)
    expected = 2000 / n
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert chi2 < 2.5 * n


def test_billion_records_first_batch_in_constant_memory():
    # How fast is a benchmark's question (python -m benchmarks); a test checks the memory bound.
    n = 10**9
    tracemalloc.start()
    perm = FeistelPermutation(n, seed=3, epoch=0)
    ids = perm(np.arange(1024))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000, peak  # O(batch), nowhere near the 8 GB of a materialised permutation
    assert len(np.unique(ids)) == 1024 and ids.min() >= 0 and ids.max() < n
    np.testing.assert_array_equal(perm.inverse(ids), np.arange(1024))
    far = np.arange(n - 1000, n)
    np.testing.assert_array_equal(perm.inverse(perm(far)), far)


def test_wide_domains_above_two_to_the_32():
    n = 2**40 + 3
    perm = FeistelPermutation(n, seed=9, epoch=1)
    pos = np.array([0, 1, 2, n - 1, n - 2, 2**35])
    ids = perm(pos)
    assert ids.max() < n and len(set(ids.tolist())) == len(pos)
    np.testing.assert_array_equal(perm.inverse(ids), pos)


@pytest.mark.parametrize("seed,exc,match", [
    (-1, ValueError, r"seed must be in \[0, 2\*\*63 - 1\], got -1"),
    (2**63, ValueError, r"got 9223372036854775808"),
    (1.5, TypeError, r"seed must be an int .* got 1.5"),
    (True, TypeError, r"got True"),
])
def test_bad_seeds_are_rejected(seed, exc, match):
    with pytest.raises(exc, match=match):
        check_seed(seed)
