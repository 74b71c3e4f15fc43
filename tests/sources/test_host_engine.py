"""The host engine as host-resident sources see it: background reads, restart on restore, close."""

import threading
import time

import jax
import numpy as np

from datarax import Pipeline
from datarax.core.source import DataSourceModule

N = 64


class GatedSource(DataSourceModule):
    """Counts reads and can hold the reader thread inside `get_batch` until released."""

    def __init__(self):
        self.reads = 0
        self.gate = threading.Event()
        self.gate.set()
        self.inside = threading.Event()

    def __len__(self):
        return N

    def element_spec(self):
        return {"x": jax.ShapeDtypeStruct((), np.int32)}

    def get_batch(self, indices, out=None):
        self.inside.set()
        self.gate.wait()
        self.reads += 1
        values = np.asarray(indices, np.int32)
        if out is None:
            return {"x": values.copy()}
        out["x"][...] = values
        return out


def wait_for(condition, seconds=60.0):  # a hang guard only: the condition is what is waited on
    deadline = time.time() + seconds
    while not condition() and time.time() < deadline:
        time.sleep(0.01)
    return condition()


def test_reads_run_ahead_on_a_bounded_queue_and_close_stops_them():
    source = GatedSource()
    pipeline = Pipeline(source, batch_size=4, prefetch=2)
    it = pipeline.epochs(None)
    np.testing.assert_array_equal(np.asarray(next(it)["x"]), [0, 1, 2, 3])
    # the producer fills the queue (prefetch) plus one batch in hand, then blocks on the full queue
    assert wait_for(lambda: source.reads >= 1 + 2 + 1)
    time.sleep(0.2)
    assert source.reads <= 1 + 2 + 1
    host = it._host
    it.close()
    assert not host.alive


def test_close_while_the_producer_is_blocked_inside_a_read():
    source = GatedSource()
    it = Pipeline(source, batch_size=4, prefetch=1).epochs(None)
    next(it)
    source.inside.clear()
    source.gate.clear()  # the next read blocks
    next(it)  # frees a queue slot, so the producer moves on to that read
    assert wait_for(source.inside.is_set)
    host = it._host
    threading.Timer(0.3, source.gate.set).start()  # a slow read that eventually returns
    it.close()  # waits for the read in progress to return, then stops
    assert not host.alive


def test_prefetch_restarts_right_after_a_restore():
    source = GatedSource()
    first = Pipeline(source, batch_size=4).epochs(1)
    for _ in range(3):
        next(first)
    state = first.get_state()
    first.close()
    restored_source = GatedSource()
    with Pipeline(restored_source, batch_size=4).epochs(1) as it:
        it.set_state(state)
        # batches are being read before anyone asks for one
        assert wait_for(lambda: restored_source.reads >= 1)
        np.testing.assert_array_equal(np.asarray(next(it)["x"]), [12, 13, 14, 15])
    assert it._host is None


def test_context_manager_closes_the_reader_thread():
    source = GatedSource()
    with Pipeline(source, batch_size=8).epochs(None) as it:
        next(it)
        host = it._host
    assert not host.alive
