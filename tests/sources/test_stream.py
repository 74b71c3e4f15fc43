"""The stream contract, on a toy stream whose reference order is plain Python slicing."""

import jax
import numpy as np
import pytest
from flax import nnx
from source_checks import check_exact_resume, pipeline_reads_streams, stream_batches

from datarax import Pipeline
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.sources.stream import UNBOUNDED, RecordReader, StreamSourceModule, check_stream_state

needs_stream_pipeline = pytest.mark.skipif(not pipeline_reads_streams(),
                                           reason="the pipeline iterator does not read stream sources yet")


class RangeStream(StreamSourceModule):
    """Epoch e yields the values e*1000 + [0, n) in order; state is the count read."""

    def __init__(self, n: int, known_length: bool = True):
        self.n, self.known = n, known_length

    def num_records(self):
        return self.n if self.known else None

    def element_spec(self):
        return {"x": jax.ShapeDtypeStruct((2,), np.int64)}

    def open(self, epoch, state):
        start = 0 if state is None else check_stream_state(state, ("read",), "RangeStream")["read"]
        return RangeReader(self.n, epoch, start)


class RangeReader(RecordReader):
    def __init__(self, n, epoch, start):
        self.n, self.epoch, self.pos = n, epoch, start

    def read(self, out, start, count):
        take = max(0, min(count, self.n - self.pos))
        values = self.epoch * 1000 + np.arange(self.pos, self.pos + take)
        out["x"][start:start + take] = np.stack([values, -values], 1)
        self.pos += take
        return take

    def get_state(self):
        return {"read": self.pos}


CASES = [  # (records, batch_size, drop_remainder)
    (10, 3, False), (10, 3, True), (9, 3, False), (1, 4, False), (25, 7, True),
]


@pytest.mark.parametrize("n,batch,drop", CASES)
def test_batches_match_python_slicing_over_epochs(n, batch, drop):
    got = stream_batches(RangeStream(n), "x", batch_size=batch, drop_remainder=drop, end_epoch=2)
    expected = []
    for e in range(2):
        values = [e * 1000 + i for i in range(n)]
        for s in range(0, n, batch):
            chunk = values[s:s + batch]
            if not (drop and len(chunk) < batch):
                expected.append(chunk)
    assert [b[0][:, 0].tolist() for b in got] == expected
    assert all(b[3] == {"read": b[2]} for b in got)  # the state rides with its own batch


def test_padding_repeats_the_last_record_like_clipped_indices():
    from datarax.control.producers import stream_host_batches

    (_, _, ids, valid, batch, _), = stream_host_batches(RangeStream(2), batch_size=5, drop_remainder=False,
                                                        ring_size=2, epoch=0, position=0, state=None, end_epoch=1)
    assert valid == 2 and ids.tolist() == [0, 1, 1, 1, 1]
    assert np.asarray(batch["x"])[:, 0].tolist() == [0, 1, 1, 1, 1]


def test_empty_stream_is_an_error_not_an_endless_loop():
    with pytest.raises(ValueError, match="RangeStream yielded no batch in epoch 0; the stream is empty"):
        stream_batches(RangeStream(0), "x", batch_size=4, end_epoch=None)
    with pytest.raises(ValueError, match="no full batch in epoch 0.*shorter than batch_size=4 with drop_remainder"):
        stream_batches(RangeStream(3), "x", batch_size=4, end_epoch=None, drop_remainder=True)


def test_unknown_length_is_unbounded():
    assert len(RangeStream(5, known_length=False)) == UNBOUNDED
    assert "records=None" in RangeStream(5, known_length=False).structure()


def test_bad_state_is_reported():
    with pytest.raises(ValueError, match="RangeStream stream state read must be an int >= 0, got -1"):
        RangeStream(5).open(0, {"read": -1})


def _tag(element, key):
    return element.update_data({"noise": jax.random.uniform(key, ())})


@needs_stream_pipeline
def test_pipeline_over_a_stream_resumes_exactly_with_stochastic_stages():
    def make():
        op = ElementOperator(ElementOperatorConfig(stochastic=True), fn=_tag, rngs=nnx.Rngs(0))
        return Pipeline(RangeStream(50, known_length=False), stages=[op], batch_size=8, prefetch=1)

    check_exact_resume(make, None, seed=1, epochs=2)


@needs_stream_pipeline
@pytest.mark.parametrize("known", [True, False])
def test_pipeline_epochs_and_length(known):
    pipeline = Pipeline(RangeStream(50, known), batch_size=8)
    for epoch in range(2):
        values = np.concatenate([np.asarray(b["x"])[:, 0] for b in pipeline])
        np.testing.assert_array_equal(values, epoch * 1000 + np.arange(50))
    if known:
        assert len(pipeline) == 7
    else:
        with pytest.raises(TypeError, match="a stream of unknown length, so it has no len"):
            len(pipeline)


@needs_stream_pipeline
def test_state_without_stream_entry_is_rejected():
    from datarax.pipeline.state import IteratorStateError

    it = Pipeline(RangeStream(20), batch_size=4).epochs(1)
    state = it.get_state()
    del state["stream"]
    with pytest.raises(IteratorStateError, match="no 'stream' entry"):
        it.set_state(state)
    it.close()
