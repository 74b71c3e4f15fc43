import json

import numpy as np
import pytest
from source_checks import check_exact_resume

from datarax import Pipeline
from datarax.samplers.mix import MixSampler, apportion, webster
from datarax.sources import MemorySource
from datarax.sources.mix import MixDataSources, MixDataSourcesConfig


def source(n: int, base: int) -> MemorySource:
    ids = np.arange(base, base + n, dtype=np.int32)
    return MemorySource(data={"id": ids, "x": np.stack([ids, ids * 2], 1).astype(np.float32)}, )


def mix(weights, lengths=(300, 100), **kw) -> MixDataSources:
    sources = [source(n, 1000 * (i + 1)) for i, n in enumerate(lengths)]
    return MixDataSources(MixDataSourcesConfig(weights=tuple(weights), seed=kw.pop("seed", 0),
                                                       shuffle=kw.pop("shuffle", True), **kw), sources=sources)


@pytest.mark.parametrize("total,weights", [(10, (1, 1, 1)), (1024, (0.7, 0.2, 0.1)), (7, (5, 0, 2)), (3, (1, 1, 1, 1))])
def test_apportion_is_largest_remainder(total, weights):
    counts = apportion(total, weights)
    quota = np.asarray(weights, float) / sum(weights) * total
    assert counts.sum() == total
    assert np.all(np.abs(counts - quota) < 1)  # every count is the floor or the ceiling of its quota


@pytest.mark.parametrize("lengths,weights,block,epoch_length", [
    ((300, 100), (3, 1), 1024, None),
    ((50, 70, 20), (1, 1, 2), 64, 500),
    ((10, 1000), (0.5, 0.5), 100, 333),
])
def test_draws_follow_the_weights_block_by_block_without_repeats(lengths, weights, block, epoch_length):
    sampler = MixSampler(lengths, weights, seed=7, block_size=block, epoch_length=epoch_length)
    n, epochs = len(sampler), 3
    ids = np.concatenate([sampler.indices(np.arange(n), e) for e in range(epochs)])
    comp = sampler.component_of(ids)
    size = sampler.block_size
    for start in range(0, (n // size) * size, size):  # each full block meets the counts exactly
        np.testing.assert_array_equal(np.bincount(comp[start:start + size], minlength=len(lengths)),
                                      apportion(size, weights))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for c, length in enumerate(lengths):
        counts = np.bincount(ids[comp == c] - offsets[c], minlength=length)
        # the component's draws walk whole shuffled passes, so no record is drawn twice before
        # every other record was drawn once: counts differ by at most one
        assert counts.max() - counts.min() <= 1 and counts.sum() == (comp == c).sum()


def test_weights_proportional_to_lengths_cover_every_record_each_epoch():
    pipeline = Pipeline(mix((3, 1)), batch_size=64)
    epochs = [np.concatenate([np.asarray(b["id"]) for b in pipeline]) for _ in range(2)]
    expected = np.concatenate([1000 + np.arange(300), 2000 + np.arange(100)])
    for ids in epochs:
        np.testing.assert_array_equal(np.sort(ids), expected)
    assert not np.array_equal(epochs[0], epochs[1])


def test_batches_gather_the_right_records_and_tag_their_source():
    src = mix((1, 1), source_field="source")
    idx = np.array([[0, 399], [300, 7]])
    got = src.get_batch(idx)
    np.testing.assert_array_equal(got["id"], [[1000, 2099], [2000, 1007]])
    np.testing.assert_array_equal(got["x"][..., 1], 2 * got["id"])
    np.testing.assert_array_equal(got["source"], [[0, 1], [1, 0]])


def test_exact_resume_mid_epoch():
    check_exact_resume(lambda: Pipeline(mix((0.6, 0.4), seed=3, block_size=128), batch_size=48), "id", seed=5)


def test_weights_can_change_on_restore():
    old = Pipeline(mix((0.9, 0.1), seed=1, block_size=100), batch_size=40)
    it = old.epochs(3)
    for _ in range(4):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    it.close()
    new = Pipeline(mix((0.1, 0.9), seed=1, block_size=100), batch_size=40)
    assert new.fingerprint == old.fingerprint  # weights are not part of the identity
    resumed = new.epochs(3)
    resumed.set_state(state)
    rest = [np.asarray(b["id"]) for b in resumed]
    # from the restore point on, the stream is the one a pipeline built with the new weights gives
    fresh = [np.asarray(b["id"]) for b in Pipeline(mix((0.1, 0.9), seed=1, block_size=100), batch_size=40).epochs(3)]
    for got, want in zip(rest, fresh[4:]):
        np.testing.assert_array_equal(got, want)
    last_epoch = np.concatenate(rest[-10:])
    assert np.mean(last_epoch >= 2000) == pytest.approx(0.9, abs=0.01)


def test_errors():
    with pytest.raises(ValueError, match="must share one element spec: sources\\[0\\] has"):
        MixDataSources(MixDataSourcesConfig(weights=(1, 1), shuffle=True),
                       sources=[source(5, 0), MemorySource(data={"id": np.arange(5)})])
    with pytest.raises(ValueError, match="needs one weight per source: config.weights has 1 for 2 sources"):
        MixDataSources(MixDataSourcesConfig(weights=(1,), shuffle=True), sources=[source(5, 0), source(5, 10)])
    with pytest.raises(ValueError, match="weights must be finite, >= 0 and not all 0, got \\(0, 0\\)"):
        MixDataSourcesConfig(weights=(0, 0), shuffle=True)
    with pytest.raises(ValueError, match="give sources \\[1\\] no draw in an epoch of 20; make the epoch longer"):
        MixSampler((10, 10), (0.99, 0.01), block_size=10)
    with pytest.raises(TypeError, match="sources\\[1\\] must be a random-access DataSourceModule"):
        MixDataSources(MixDataSourcesConfig(weights=(1, 1), shuffle=True), sources=[source(5, 0), [1, 2]])
    with pytest.raises(ValueError, match="source_field 'id' is already a field"):
        MixDataSources(MixDataSourcesConfig(weights=(1, 1), shuffle=True, source_field="id"), sources=[source(5, 0),
                                                                                                       source(5, 9)])


def test_proportional_weights_give_permutations_every_epoch():
    """Sizes 7,000 / 3,000 with weights 0.7 / 0.3: each epoch holds every record exactly once
    (per-block rounding used to draw 7,002 / 2,998, with duplicates growing 2, 6, 10, 14)."""
    sampler = MixSampler((7000, 3000), (0.7, 0.3), seed=3)
    for epoch in range(4):
        ids = sampler.indices(np.arange(len(sampler)), epoch)
        np.testing.assert_array_equal(np.sort(ids), np.arange(10000))


@pytest.mark.parametrize("seed", range(5))
def test_every_block_follows_the_weights_within_two_slots(seed):
    rng = np.random.default_rng(seed)
    lengths = tuple(int(n) for n in rng.integers(50, 3000, 3))
    weights = tuple(float(w) for w in rng.random(3) + 0.05)
    sampler = MixSampler(lengths, weights, seed=seed, block_size=int(rng.integers(7, 300)))
    ids = sampler.indices(np.arange(len(sampler)), 1)
    comp = sampler.component_of(ids)
    share = np.asarray(sampler.draws) / len(sampler)
    for start in range(0, len(sampler), sampler.block_size):
        size = min(sampler.block_size, len(sampler) - start)
        counts = np.bincount(comp[start:start + size], minlength=3)
        # a block is the difference of two cumulative totals, each within a slot of its share
        assert np.all(np.abs(counts - share * size) < 2.0)
    np.testing.assert_array_equal(np.bincount(comp, minlength=3), sampler.draws)


def test_webster_never_takes_a_seat_back_as_the_house_grows():
    rng = np.random.default_rng(0)
    for _ in range(20):
        weights = rng.random(int(rng.integers(2, 6))) + 1e-3
        totals = np.array([webster(n, weights) for n in range(0, 400)])
        assert np.all(totals.sum(axis=1) == np.arange(400))
        assert np.all(np.diff(totals, axis=0) >= 0)


