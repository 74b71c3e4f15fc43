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
from datarax.control.retry import RetryPolicy
from datarax.core.source import DataSourceModule, Handles
from datarax.host.stage import HostStage
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.pipeline.state import IteratorStateError
from datarax.samplers.simple import ShuffleSampler
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.sources.stream import RecordReader, StreamSourceModule, check_stream_state
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
    producer.join(timeout=120)  # a hang guard: the thread stops at its next poll of the stop flag
    assert not producer.is_alive()


class FlakyStream(StreamSourceModule):
    """An endless stream whose record at position p of epoch e is e * 10**6 + p.

    `fail_reads` holds read-call numbers (counted over all readers, from 0) that raise
    `OSError` before reading anything, as a network file system's transient error would.
    """

    def __init__(self, fail_reads=(), partial=False):
        self.calls = Handles(arrays={"calls": np.zeros(1, np.int64)})  # mutable in place, outside NNX state
        self.fail_reads, self.partial = frozenset(fail_reads), partial

    def element_spec(self):
        return {"id": jax.ShapeDtypeStruct((), np.int64)}

    def open(self, epoch, state):
        return FlakyReader(self, epoch, 0 if state is None else check_stream_state(state, ("read",), "Flaky")["read"])


class FlakyReader(RecordReader):
    def __init__(self, source, epoch, pos):
        self.source, self.epoch, self.pos = source, epoch, pos

    def read(self, out, start, count):
        calls = self.source.calls.arrays["calls"]
        calls[0] += 1
        if calls[0] - 1 in self.source.fail_reads:
            if self.source.partial:  # half the records read, then the error: the reader moved on
                self.pos += count // 2
            raise OSError(f"injected read error (call {calls[0] - 1})")
        out["id"][start:start + count] = self.epoch * 10**6 + np.arange(self.pos, self.pos + count)
        self.pos += count
        return count

    def get_state(self):
        return {"read": self.pos}


class FlakySource(DataSourceModule):
    """A host-resident random-access source whose listed `get_batch` calls raise `OSError`."""

    def __init__(self, n, fail_reads=()):
        self.data = Handles(arrays={"id": np.arange(n, dtype=np.int32)})
        self.calls = Handles(arrays={"calls": np.zeros(1, np.int64)})
        self.fail_reads = frozenset(fail_reads)

    def __len__(self):
        return len(self.data.arrays["id"])

    def element_spec(self):
        return {"id": jax.ShapeDtypeStruct((), np.int32)}

    def get_batch(self, indices, out=None):
        calls = self.calls.arrays["calls"]
        calls[0] += 1
        if calls[0] - 1 in self.fail_reads:
            raise OSError(f"injected read error (call {calls[0] - 1})")
        got = {"id": np.take(self.data.arrays["id"], indices, axis=0)}
        if out is None:
            return got
        np.copyto(out["id"], got["id"])
        return out

    def sampler(self):
        return ShuffleSampler(len(self), seed=3)


def ids(batch):
    return np.asarray(batch["id"]).tolist()


def stream_ids(epoch, start, batch_size):
    return [epoch * 10**6 + p for p in range(start, start + batch_size)]


@pytest.mark.parametrize("prefetch", [1, 3])
def test_a_read_error_in_an_endless_stream_raises_and_the_next_call_continues_exactly(prefetch):
    it = Pipeline(FlakyStream(fail_reads={4}), [], batch_size=5, prefetch=prefetch).epochs(None)
    got = [ids(next(it)) for _ in range(4)]
    with pytest.raises(OSError, match="injected read error"):
        next(it)
    assert it.get_state()["stream"] == {"read": 20}
    got += [ids(next(it)) for _ in range(3)]
    assert got == [stream_ids(0, 5 * b, 5) for b in range(7)]


def test_a_persistent_read_error_raises_on_every_call_and_never_ends_the_stream():
    it = Pipeline(FlakyStream(fail_reads={2, 3, 4}), [], batch_size=4, prefetch=1).epochs(None)
    assert [ids(next(it)) for _ in range(2)] == [stream_ids(0, 0, 4), stream_ids(0, 4, 4)]
    for _ in range(3):
        with pytest.raises(OSError):
            next(it)
    assert ids(next(it)) == stream_ids(0, 8, 4)


@pytest.mark.parametrize("partial", [False, True])
def test_retry_policy_rereads_a_stream_at_the_same_position(partial):
    policy = RetryPolicy(max_retries=2, backoff_s=0.0)
    source = FlakyStream(fail_reads={3, 6, 7}, partial=partial)
    it = Pipeline(source, [], batch_size=5, prefetch=2, retry_policy=policy).epochs(None)
    assert [ids(next(it)) for _ in range(8)] == [stream_ids(0, 5 * b, 5) for b in range(8)]


def test_retry_policy_raises_after_its_retries_and_the_next_call_retries_again():
    policy = RetryPolicy(max_retries=1, backoff_s=0.0)
    it = Pipeline(FlakyStream(fail_reads={1, 2}), [], batch_size=3, prefetch=1, retry_policy=policy).epochs(None)
    assert ids(next(it)) == stream_ids(0, 0, 3)
    with pytest.raises(OSError, match="call 2"):
        next(it)
    assert [ids(next(it)) for _ in range(2)] == [stream_ids(0, 3, 3), stream_ids(0, 6, 3)]


def test_a_read_error_of_a_random_access_source_raises_and_the_next_call_continues_exactly():
    want = [ids(b) for b in Pipeline(FlakySource(22), [], batch_size=4, prefetch=2).epochs(2)]
    it = Pipeline(FlakySource(22, fail_reads={2}), [], batch_size=4, prefetch=2).epochs(2)
    got = [ids(next(it)) for _ in range(2)]
    with pytest.raises(OSError, match="injected"):
        next(it)
    got += [ids(b) for b in it]
    assert got == want
    retried = Pipeline(FlakySource(22, fail_reads={2, 5}), [], batch_size=4,
                       retry_policy=RetryPolicy(max_retries=1, backoff_s=0.0)).epochs(2)
    assert [ids(b) for b in retried] == want


def test_retry_policy_backs_off_exponentially_up_to_its_cap():
    sleeps, attempts = [], []

    def read():
        attempts.append(1)
        if len(attempts) < 5:
            raise OSError("transient")
        return "done"

    policy = RetryPolicy(max_retries=4, backoff_s=0.5, max_backoff_s=2.0)
    assert policy.call(read, sleep=sleeps.append) == "done"
    assert sleeps == [0.5, 1.0, 2.0, 2.0]
    with pytest.raises(OSError):
        RetryPolicy(max_retries=1, backoff_s=0.0).call(lambda: (_ for _ in ()).throw(OSError("x")), sleep=sleeps.append)
    with pytest.raises(ValueError, match="never retried"):
        RetryPolicy(max_retries=3).call(lambda: (_ for _ in ()).throw(ValueError("never retried")),
                                        sleep=sleeps.append)


@pytest.mark.parametrize("kwargs,match", [
    ({"max_retries": -1}, "max_retries"), ({"max_retries": 1.5}, "max_retries"),
    ({"backoff_s": -1.0}, "backoff_s"), ({"max_backoff_s": float("nan")}, "max_backoff_s"),
])
def test_retry_policy_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RetryPolicy(**kwargs)


def next_batch_after(it):
    return ids(next(it))


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("epoch", [2**31, 2**32, 2**40, 2**63])
def test_set_state_rejects_an_epoch_the_program_cannot_hold_and_changes_nothing(resident, epoch):
    pipeline = build(resident)
    want = build(resident)
    it, ref = pipeline.epochs(3), want.epochs(3)
    next(it), next(ref)
    state = it.get_state()
    next_epoch = pipeline.next_epoch
    with pytest.raises(IteratorStateError, match="epoch"):
        it.set_state({**state, "epoch": epoch})
    assert it.get_state() == state and pipeline.next_epoch == next_epoch
    rest, rest_ref = list(it), list(ref)
    assert_same_batches(rest, rest_ref)


@pytest.mark.parametrize("resident", [True, False])
def test_set_state_accepts_the_largest_epoch_the_program_holds(resident):
    it = iter(build(resident))
    state = it.get_state()
    it.set_state({**state, "epoch": 2**31 - 1})
    assert np.asarray(next(it)["id"]).shape == (6,)


@pytest.mark.parametrize("garbage", [
    {"read": "x"}, {"nope": 1}, "garbage", 17, [1, 2], {"read": -3},
])
def test_set_state_rejects_a_garbage_stream_state_and_changes_nothing(garbage):
    it = Pipeline(FlakyStream(), [], batch_size=3).epochs(None)
    [next(it) for _ in range(2)]
    state = it.get_state()
    with pytest.raises(IteratorStateError, match="stream"):
        it.set_state({**state, "stream": garbage})
    assert it.get_state() == state
    assert [ids(next(it)) for _ in range(2)] == [stream_ids(0, 6, 3), stream_ids(0, 9, 3)]


def test_set_state_rejects_a_stream_state_of_none_past_the_epochs_start():
    it = Pipeline(FlakyStream(), [], batch_size=3).epochs(None)
    next(it)
    state = it.get_state()
    with pytest.raises(IteratorStateError, match="stream"):
        it.set_state({**state, "stream": None})
    assert ids(next(it)) == stream_ids(0, 3, 3)


def test_set_state_rejects_a_stream_position_past_int32():
    it = Pipeline(FlakyStream(), [], batch_size=3).epochs(None)
    next(it)
    state = it.get_state()
    with pytest.raises(IteratorStateError, match="position"):
        it.set_state({**state, "position": 2**31, "stream": {"read": 2**31}})
    assert ids(next(it)) == stream_ids(0, 3, 3)


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line in /proc/self/status")


class Identity(HostStage):
    def output_spec(self, spec):
        return dict(spec)

    def __call__(self, batch, ctx):
        return dict(batch)


def abandoned_loop_pipeline(kind: str) -> Pipeline:
    if kind == "host":
        return build(resident=False)
    if kind == "stream":
        return Pipeline(FlakyStream(), [], batch_size=4)
    if kind == "host_stage":
        return Pipeline(FlakySource(40), [Identity()], batch_size=4)
    return build(resident=False).raw_loader()


def wait_for_threads(limit: int, timeout_s: float = 60.0) -> int:
    """Polls (no fixed sleep) until at most `limit` threads are alive, or gives up after a generous bound."""
    pause = threading.Event()
    for _ in range(int(timeout_s / 0.05)):
        if threading.active_count() <= limit:
            break
        gc.collect()
        pause.wait(0.05)
    return threading.active_count()


@pytest.mark.parametrize("kind", ["host", "stream", "host_stage", "raw_loader"])
@pytest.mark.parametrize("form", ["break", "dropped_epochs"])
def test_abandoned_loops_leave_no_thread_and_bounded_memory(kind, form):
    pipeline = abandoned_loop_pipeline(kind)

    def abandon():
        if form == "break":
            for _ in pipeline.epochs(None) if kind == "stream" else pipeline:
                break
        else:
            it = pipeline.epochs(None)
            next(it)
            del it

    gc.collect()
    start_threads = threading.active_count()
    for _ in range(3):  # compile and warm the allocator before measuring memory
        abandon()
    assert wait_for_threads(start_threads + 3) <= start_threads + 3
    start_rss = rss_bytes()
    for _ in range(200):
        abandon()
    assert wait_for_threads(start_threads + 3) <= start_threads + 3
    assert rss_bytes() - start_rss < 100 * 2**20
