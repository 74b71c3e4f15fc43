"""BucketedPipeline: each record once per epoch in its own bucket's shape, one compile per bucket, exact resume."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from datarax.host import HostStage
from datarax.pipeline.buckets import BucketedPipeline, assign_buckets
from datarax.pipeline.state import IteratorStateError
from datarax.sources import TextSource


class PadTo(HostStage):
    """'3 1 4' -> ids [3, 1, 4, 0, ...] (length `length`) and the record's true length."""

    def __init__(self, length):
        self.length = length

    def output_spec(self, spec):
        return {"ids": jax.ShapeDtypeStruct((self.length,), np.int32), "n": jax.ShapeDtypeStruct((), np.int32)}

    def __call__(self, batch, ctx):
        rows = [[int(t) for t in text.split()][:self.length] for text in batch["text"]]
        ids = np.zeros((len(rows), self.length), np.int32)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = row
        return {"ids": ids, "n": np.array([len(r) for r in rows], np.int32)}

    def structure(self):
        return f"PadTo({self.length})"


def documents(n=203, seed=0):
    """Record i is the numbers i*1000 + 1 ... of a random length in [1, 40] (so ids name the record)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 41, n)
    return [" ".join(str(i * 1000 + k + 1) for k in range(m)) for i, m in enumerate(lengths)], lengths


def build(batch_size=8, seed=0, boundaries=(8, 16, 32), drop_remainder=False):
    docs, lengths = documents()
    return BucketedPipeline(TextSource(documents=docs), lengths, boundaries, lambda length: [PadTo(length)], batch_size,
                            seed=seed, drop_remainder=drop_remainder)


def record_of(batch):
    return np.asarray(batch["ids"])[:, 0] // 1000  # the first token names the record


def test_each_record_once_per_epoch_in_the_smallest_bucket_that_holds_it():
    _, lengths = documents()
    pipeline = build()
    want = np.array((8, 16, 32))[assign_buckets(lengths, (8, 16, 32))]
    for _ in range(2):
        seen = []
        for batch in pipeline:
            ids, n = np.asarray(batch["ids"]), np.asarray(batch["n"])
            records = record_of(batch)
            assert {ids.shape[1]} == set(want[records])  # a batch never mixes buckets
            np.testing.assert_array_equal(n, np.minimum(lengths[records], ids.shape[1]))  # cut only past 32
            seen.extend(records.tolist())
        assert sorted(seen) == list(range(len(lengths)))


def test_each_bucket_compiles_once_and_the_order_changes_by_epoch():
    pipeline = build()
    first, second = list(pipeline.order(0)), list(pipeline.order(1))
    assert first != second and sorted(first) == sorted(second)
    for _ in range(2):
        for _ in pipeline:
            pass
    # Host-resident (the records are decoded by a host stage): each bucket's program compiled once,
    # its final short batch padded, over two epochs.
    assert [p.compiled.run._cache_size() for p in pipeline.pipelines] == [1, 1, 1]


@pytest.mark.parametrize("stop", [0, 5, 17, 30])
def test_resume_mid_epoch_from_a_json_state_continues_exactly(stop):
    it = build().epochs(2)
    for _ in range(stop):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    rest = [np.asarray(b["ids"]) for b in it]
    fresh = build().epochs(2)
    fresh.set_state(state)
    again = [np.asarray(b["ids"]) for b in fresh]
    assert len(again) == len(rest)
    for a, b in zip(rest, again):
        np.testing.assert_array_equal(a, b)


def test_foreign_or_corrupt_states_change_nothing():
    it = build().epochs(2)
    next(it)
    before = it.get_state()
    with pytest.raises(IteratorStateError, match="another bucketed pipeline"):
        it.set_state(build(seed=1).epochs(1).get_state())
    with pytest.raises(IteratorStateError, match="position in"):
        it.set_state({**before, "position": 10**6})
    assert it.get_state() == before


def test_argument_errors():
    docs, lengths = documents(10)
    with pytest.raises(ValueError, match="increasing positive ints"):
        BucketedPipeline(TextSource(documents=docs), lengths, (16, 8), lambda n: [PadTo(n)], 4)
    with pytest.raises(ValueError, match="one non-negative int per record"):
        BucketedPipeline(TextSource(documents=docs), lengths[:3], (8,), lambda n: [PadTo(n)], 4)


def test_a_trainer_checkpoint_restores_a_bucketed_iterator_exactly(tmp_path):
    """Saved beside a model and optimizer by `datarax.train.Checkpointer`, restored into a fresh
    iterator, it continues with the batches an uninterrupted iterator gives, bitwise."""
    import optax
    from flax import nnx

    from datarax.train import Checkpointer

    def model_and_optimizer():
        model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    uninterrupted = build().epochs(2)
    want = [np.asarray(b["ids"]) for b in uninterrupted]
    it = build().epochs(2)
    for _ in range(len(want) // 2 + 3):  # into the second epoch
        next(it)
    model, optimizer = model_and_optimizer()
    checkpointer = Checkpointer(tmp_path)
    assert checkpointer.save(7, model=model, optimizer=optimizer, iterator=it, metadata={})
    checkpointer.close()
    fresh = build().epochs(2)
    model, optimizer = model_and_optimizer()
    restored = Checkpointer(tmp_path).restore_latest(model=model, optimizer=optimizer, iterator=fresh)
    assert restored.step == 7 and fresh.get_state() == it.get_state()
    got = [np.asarray(b["ids"]) for b in fresh]
    assert len(got) == len(want) - (len(want) // 2 + 3)
    for g, w in zip(got, want[len(want) - len(got):]):
        np.testing.assert_array_equal(g, w)
