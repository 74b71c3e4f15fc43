"""WeightedSampler: exact per-epoch group counts, no repeats within a group's pass, arithmetic resume."""

from __future__ import annotations

import numpy as np
import pytest
from sources.source_checks import check_exact_resume

from datarax import Pipeline
from datarax.samplers.weighted import WeightedSampler
from datarax.sources import MemorySource

# 10 records of class 0, 3 of class 1, 2 of class 2, interleaved in storage order
LABELS = np.array([0, 1, 0, 0, 2, 0, 1, 0, 0, 0, 2, 0, 1, 0, 0])


def group_counts(sampler, epoch, groups=LABELS):
    ids = sampler.indices(np.arange(len(sampler)), epoch)
    return np.bincount(groups[ids], minlength=groups.max() + 1), ids


@pytest.mark.parametrize("epoch", [0, 1, 5])
def test_class_balanced_epochs_hold_exact_equal_shares(epoch):
    sampler = WeightedSampler(LABELS, seed=4)
    counts, ids = group_counts(sampler, epoch)
    # 15 positions over 3 equal weights: 5 each (worked by hand)
    assert counts.tolist() == [5, 5, 5] and sampler.draws.tolist() == [5, 5, 5]
    assert ids.min() >= 0 and ids.max() < len(LABELS)


@pytest.mark.parametrize("weights, epoch_length, want", [
    ((0.5, 0.3, 0.2), 15, [8, 4, 3]),     # quotas 7.5, 4.5, 3.0: largest remainders, ties to the lower index
    ((0.5, 0.3, 0.2), 40, [20, 12, 8]),
    ((1, 0, 1), 7, [4, 0, 3]),            # 3.5 and 3.5: the tie goes to group 0
    ((2, 1, 1), 1000, [500, 250, 250]),
])
def test_weighted_epochs_hold_the_largest_remainder_counts(weights, epoch_length, want):
    sampler = WeightedSampler(LABELS, weights, epoch_length=epoch_length, seed=1, block_size=8)
    for epoch in range(3):
        assert group_counts(sampler, epoch)[0].tolist() == want


def test_a_group_repeats_only_after_all_its_records_were_drawn():
    """Each group's draws walk whole passes over its records, continuing across epochs: after any
    number of whole epochs from the start, the group's records were drawn equally often, to one
    (class 2: 2 records, class 1: 3, class 0: 10; 100 draws each per epoch)."""
    sampler = WeightedSampler(LABELS, epoch_length=300, seed=2, block_size=64)
    drawn = np.zeros(len(LABELS), np.int64)
    for epoch in range(4):
        drawn += np.bincount(sampler.indices(np.arange(300), epoch), minlength=len(LABELS))
        for group in range(3):
            per_record = drawn[LABELS == group]
            assert per_record.sum() == 100 * (epoch + 1)
            assert per_record.max() - per_record.min() <= 1


def test_weights_proportional_to_the_class_sizes_read_every_record_once():
    sampler = WeightedSampler(LABELS, np.bincount(LABELS), seed=3)
    for epoch in range(3):
        ids = sampler.indices(np.arange(len(LABELS)), epoch)
        assert sorted(ids.tolist()) == list(range(len(LABELS)))
    assert not np.array_equal(sampler.indices(np.arange(15), 0), sampler.indices(np.arange(15), 1))


def test_positions_are_a_function_of_seed_epoch_and_position():
    a, b = WeightedSampler(LABELS, seed=9), WeightedSampler(LABELS, seed=9)
    whole = a.indices(np.arange(15), 2)
    np.testing.assert_array_equal(b.indices(np.array([7, 3, 14]), 2), whole[[7, 3, 14]])
    assert not np.array_equal(WeightedSampler(LABELS, seed=10).indices(np.arange(15), 2), whole)


def test_a_pipeline_resumes_exactly_mid_epoch():
    data = {"x": np.arange(len(LABELS), dtype=np.int32), "label": LABELS.astype(np.int32)}

    def make():
        sampler = WeightedSampler(LABELS, (1, 2, 1), epoch_length=24, seed=5)
        return Pipeline(MemorySource(data=data), sampler=sampler, batch_size=5)

    check_exact_resume(make, None, seed=11, epochs=3)
    labels = np.concatenate([np.asarray(b["label"]) for b in make()])
    assert np.bincount(labels).tolist() == [6, 12, 6]


def test_bad_arguments_name_the_argument():
    with pytest.raises(TypeError, match=r"groups must be a non-empty 1-d array of int group ids"):
        WeightedSampler(np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match=r"groups must be >= 0, got -1 \(record 1\)"):
        WeightedSampler([0, -1, 1])
    with pytest.raises(ValueError, match=r"one weight per group id 0..2 \(3 weights\)"):
        WeightedSampler(LABELS, (1, 1))
    with pytest.raises(ValueError, match=r"give group\(s\) \[1\] a share, but no record has that group id"):
        WeightedSampler([0, 2, 2], (1, 1, 1))
    with pytest.raises(ValueError, match=r"WeightedSampler weights \(1.0, 1.0, 1.0\) give group\(s\) \[2\] no draw in "
                                         r"an epoch of 2; make epoch_length at least 3"):
        WeightedSampler(LABELS, (1, 1, 1), epoch_length=2)
    with pytest.raises(ValueError, match=r"weights must be finite, >= 0 and not all 0"):
        WeightedSampler(LABELS, (1, -1, 1))
    with pytest.raises(ValueError, match=r"WeightedSampler epoch_length must be a positive int"):
        WeightedSampler(LABELS, epoch_length=0)


def test_fingerprint_follows_the_labels_not_the_weights():
    base = WeightedSampler(LABELS, (1, 1, 1), seed=0).structure()
    assert WeightedSampler(LABELS, (3, 1, 1), seed=0).structure() == base
    assert WeightedSampler(LABELS[::-1], (1, 1, 1), seed=0).structure() != base
    assert WeightedSampler(LABELS, seed=1).structure() != base
