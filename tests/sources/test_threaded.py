import threading

import jax
import numpy as np
import pytest

from datarax import Pipeline
from datarax.core.source import DataSourceModule
from datarax.sources import MemorySource, MemorySourceConfig, ThreadedSource

N = 300


def host_source(n: int = N) -> MemorySource:
    ids = np.arange(n, dtype=np.int32)
    return MemorySource(MemorySourceConfig(device_resident=False),
                        data={"id": ids, "img": np.stack([ids] * 6, 1).reshape(n, 2, 3).astype(np.uint8)})


class ThreadRecorder(DataSourceModule):
    """Records which threads read which chunk; fails on a poisoned index."""

    def __init__(self):
        self.threads = set()

    def __len__(self):
        return N

    def element_spec(self):
        return {"x": jax.ShapeDtypeStruct((), np.int64)}

    def get_batch(self, indices, out=None):
        self.threads.add(threading.current_thread().name)
        if np.any(indices == 13):
            raise RuntimeError("decode failed on record 13")
        out = {"x": np.empty(np.shape(indices), np.int64)} if out is None else out
        out["x"][...] = indices
        return out


@pytest.mark.parametrize("shape", [(64,), (7,), (8, 9), (1,)])
def test_threaded_reads_equal_direct_reads(shape):
    inner = host_source()
    threaded = ThreadedSource(inner, num_threads=3, min_chunk=4)
    idx = np.random.default_rng(0).integers(0, N, shape)
    got, want = threaded.get_batch(idx), inner.get_batch(idx)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    out = {k: np.empty_like(v) for k, v in want.items()}
    assert threaded.get_batch(idx, out=out) is out
    threaded.close()


def test_chunks_run_on_pool_threads_and_errors_reach_the_caller():
    recorder = ThreadRecorder()
    threaded = ThreadedSource(recorder, num_threads=2, min_chunk=8)
    np.testing.assert_array_equal(threaded.get_batch(np.arange(100, 164))["x"], np.arange(100, 164))
    assert {t.startswith("datarax-read") for t in recorder.threads} == {True} and len(recorder.threads) >= 1
    with pytest.raises(RuntimeError, match="decode failed on record 13"):
        threaded.get_batch(np.arange(64))


def test_pipeline_over_a_threaded_source_matches_the_plain_one():
    plain = Pipeline(host_source(), batch_size=50)
    threaded = Pipeline(ThreadedSource(host_source(), num_threads=2), batch_size=50)
    assert plain.fingerprint == threaded.fingerprint  # same data, same resumable stream
    for a, b in zip(plain, threaded):
        np.testing.assert_array_equal(np.asarray(a["img"]), np.asarray(b["img"]))


def test_errors():
    with pytest.raises(ValueError, match="ThreadedSource source is device-resident"):
        ThreadedSource(MemorySource(MemorySourceConfig(device_resident=True), data={"x": np.arange(4)}))
    with pytest.raises(ValueError, match="ThreadedSource num_threads must be an int >= 1, got 0"):
        ThreadedSource(host_source(), num_threads=0)
    with pytest.raises(TypeError, match="ThreadedSource source must be a random-access DataSourceModule"):
        ThreadedSource([1, 2, 3])
