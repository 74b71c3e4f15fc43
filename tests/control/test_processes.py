"""WorkerPool: workers take the chunks of every job in flight from one queue, so a worker held up
by one chunk leaves the rest (of its job and of later jobs) to the others; a crash names the job
and rows it lost and the next job starts a fresh pool; a task that cannot be pickled fails its
submit. BatchesAhead: an interrupted read stops the workers."""

from __future__ import annotations

import os
import pickle
import time

import numpy as np
import pytest

from datarax.control.processes import BatchesAhead, SharedOutputs, WorkerCrashError, WorkerPool, row_blocks


def job(task, outputs):
    """Writes the chunk's marker into its rows; "wait" holds until the flag file exists (a hang
    guard of 60 s, never reached when the pool balances), "die" kills the worker."""
    kind, marker, flag = task
    outputs["x"][:] = marker
    if kind == "die":
        os._exit(3)
    if kind == "wait":
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.01)
    return os.getpid(), flag is None or os.path.exists(flag)


@pytest.fixture
def segment():
    outputs = SharedOutputs([("x", (), "int64")])
    outputs.ensure(8)
    yield outputs
    outputs.close()


def test_a_worker_held_by_one_chunk_leaves_the_next_jobs_chunks_to_the_others(segment, tmp_path):
    flag = str(tmp_path / "go")
    pool = WorkerPool(job, 2, "test-pool")
    try:
        a = pool.submit(segment, [(0, 1, ("wait", 1, flag)), (1, 2, ("quick", 2, None))])
        b = pool.submit(segment, [(2, 4, ("quick", 3, None)), (4, 6, ("quick", 4, None)), (6, 8, ("quick", 5, None))])
        assert pool.busy
        done_b = pool.result(b)  # the whole later job, while a's first chunk still holds its worker
        open(flag, "w").close()
        done_a = pool.result(a)
        assert not pool.busy
        held, saw_flag = done_a[0]
        assert saw_flag  # it was still waiting when job b was complete
        assert all(pid != held for pid, _ in done_b + done_a[1:])
        np.testing.assert_array_equal(segment.views(8)["x"], [1, 2, 3, 3, 4, 4, 5, 5])
        with pytest.raises(KeyError, match="no job"):
            pool.result(a)
    finally:
        pool.close()
    assert pool.pids == []


def test_a_crash_names_its_job_and_rows_and_the_next_job_gets_a_fresh_pool(segment):
    pool = WorkerPool(job, 1, "test-pool")
    try:
        a = pool.submit(segment, [(0, 2, ("quick", 1, None))])
        b = pool.submit(segment, [(2, 4, ("quick", 2, None)), (4, 6, ("die", 3, None))])
        first = pool.pids
        assert pool.result(a)[0][0] == first[0]
        lost = r"died \(exit code 3\) while computing rows 4-5 of a batch"
        with pytest.raises(WorkerCrashError, match=lost) as crash:
            pool.result(b)
        assert crash.value.job == b and pool.pids == [] and not pool.busy
        (pid, _), = pool.result(pool.submit(segment, [(0, 8, ("quick", 7, None))]))
        assert pid not in first
        np.testing.assert_array_equal(segment.views(8)["x"], [7] * 8)
    finally:
        pool.close()


def test_a_task_that_cannot_be_pickled_fails_its_submit_and_the_pool_works_on(segment):
    pool = WorkerPool(job, 1, "test-pool")
    try:
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
            pool.submit(segment, [(0, 4, ("quick", 1, None)), (4, 8, ("quick", 2, lambda: None))])
        assert not pool.busy  # nothing of that job was queued
        pool.result(pool.submit(segment, [(0, 8, ("quick", 6, None))]))
        np.testing.assert_array_equal(segment.views(8)["x"], [6] * 8)
    finally:
        pool.close()


def test_an_interrupted_read_drops_its_segments_so_no_late_chunk_writes_into_a_later_batch(monkeypatch, tmp_path):
    flag = str(tmp_path / "go")
    batches = BatchesAhead(WorkerPool(job, 2, "test-pool"), [("x", (), "int64")])
    out = {"x": np.zeros(4, np.int64)}
    try:
        batches.ahead("b", [(0, 2, ("wait", 9, flag)), (2, 4, ("wait", 9, flag))])
        before = batches._segments
        real = WorkerPool.result
        monkeypatch.setattr(WorkerPool, "result", lambda self, job_id: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            batches.read("a", lambda: [(0, 4, ("quick", 1, None))], out)
        # the "wait" chunks may still write, but only into segments no later batch reads
        assert all(s.segment is None for s in before) and not set(batches._segments) & set(before)
        assert len(batches.pool.pids) == 2  # the workers run on (another stage may share them)
        monkeypatch.setattr(WorkerPool, "result", real)
        open(flag, "w").close()
        batches.read("a", lambda: [(0, 2, ("quick", 1, None)), (2, 4, ("quick", 2, None))], out)
        np.testing.assert_array_equal(out["x"], [1, 1, 2, 2])
    finally:
        batches.close()


@pytest.mark.parametrize("count", [0, 1, 2, 7, 64, 65, 100])
@pytest.mark.parametrize("parts", [1, 2, 3, 13, 200])
def test_row_blocks_cut_the_rows_into_near_equal_contiguous_blocks(count, parts):
    blocks = row_blocks(count, parts)
    assert [i for low, high in blocks for i in range(low, high)] == list(range(count))  # contiguous, in order
    sizes = sorted(high - low for low, high in blocks)
    assert len(blocks) == min(parts, count)
    if count:  # the same sizes as numpy's own equal split (which puts the larger blocks first)
        assert sizes == sorted(len(b) for b in np.array_split(np.arange(count), min(parts, count)))



def test_a_job_the_workers_cannot_load_fails_alone_and_the_workers_run_on(segment):
    """One pool serves every stage of its kind: a stage whose job does not load (its module gone
    from the workers' path) fails its own batches, naming the fix, and the others' jobs still run."""
    pool = WorkerPool(job, 2, "test-pool")
    try:
        pool.result(pool.submit(segment, [(0, 4, ("quick", 1, None)), (4, 8, ("quick", 1, None))]))
        pids = pool.pids
        broken = b"\x80\x04\x95not a pickle"
        with pytest.raises(RuntimeError, match="(?s)could not load the function.*module level"):
            pool.result(pool.submit(segment, [(0, 4, ("quick", 2, None)), (4, 8, ("quick", 2, None))], broken))
        pool.result(pool.submit(segment, [(0, 8, ("quick", 3, None))]))
        np.testing.assert_array_equal(segment.views(8)["x"], [3] * 8)
        assert pool.pids == pids
    finally:
        pool.close()


class _Pipe:
    """A worker's pipe that counts its closes and holds the first one open until `release` is set, so
    the other thread's stop runs while it is in progress (as a finalizer's would at exit)."""

    def __init__(self, entered, release):
        self.closes, self.entered, self.release = 0, entered, release

    def close(self):
        self.closes += 1
        self.entered.set()
        assert self.release.wait(30), "hang guard"


class _Process:
    def join(self, timeout=None):
        pass

    def is_alive(self):
        return False


def test_two_threads_stopping_one_pool_close_each_pipe_once():
    import threading

    from datarax.control.processes import stop_workers
    entered, release = threading.Event(), threading.Event()
    pipes = [_Pipe(entered, release) for _ in range(3)]
    workers = [(_Process(), pipe) for pipe in pipes]
    first = threading.Thread(target=stop_workers, args=(workers, None, False))
    first.start()
    assert entered.wait(30), "hang guard"  # the first stop is closing a pipe
    second = threading.Thread(target=stop_workers, args=(workers, None, True))
    second.start()
    release.set()
    first.join(30)
    second.join(30)
    assert not first.is_alive() and not second.is_alive()
    assert [pipe.closes for pipe in pipes] == [1, 1, 1] and workers == []


class _ReentrantPipe:
    """A pipe whose close stops another pool's workers in the same thread, as a finalizer the garbage
    collector runs during a stop would."""

    def __init__(self, other):
        self.other, self.closes = other, 0

    def close(self):
        from datarax.control.processes import stop_workers
        self.closes += 1
        stop_workers(self.other, None, False)


def test_a_stop_run_inside_another_stop_in_the_same_thread_returns():
    import threading

    from datarax.control.processes import stop_workers
    inner = [_Pipe(threading.Event(), threading.Event()) for _ in range(2)]
    for pipe in inner:
        pipe.release.set()
    others = [(_Process(), pipe) for pipe in inner]
    outer = _ReentrantPipe(others)
    stopping = threading.Thread(target=stop_workers, args=([(_Process(), outer)], None, False))
    stopping.start()
    stopping.join(30)  # hang guard: a lock held by the outer stop would hold the inner one forever
    assert not stopping.is_alive()
    assert outer.closes == 1 and [pipe.closes for pipe in inner] == [1, 1] and others == []


@pytest.mark.parametrize("when", ["during the wait", "before the wait"])
def test_the_pools_finalizer_at_exit_ends_a_wait_for_its_workers(segment, tmp_path, monkeypatch, when):
    """At exit the pool's finalizer stops its workers while a prefetch thread may be collecting a
    job (holding the pool's lock, which the other exit finalizers then wait on): the collector gets
    a WorkerCrashError saying so, rather than waiting on no workers forever, and the pool starts
    fresh workers for the next job."""
    import multiprocessing.connection
    import threading

    flag = str(tmp_path / "go")  # never created: the chunk holds its worker until it is stopped
    pool = WorkerPool(job, 2, "test-pool")
    waiting, outcome = threading.Event(), []
    real_wait = multiprocessing.connection.wait

    def wait(objects, timeout=None):
        waiting.set()
        return real_wait(objects, timeout)

    def collect():
        try:
            pool.result(held)
        except BaseException as exc:  # noqa: BLE001 - the test checks which
            outcome.append(exc)

    collector = threading.Thread(target=collect, daemon=True)
    try:
        held = pool.submit(segment, [(0, 4, ("wait", 1, flag)), (4, 8, ("wait", 2, flag))])
        workers = pool.pids
        if when == "before the wait":
            pool._finalizer()
        monkeypatch.setattr(multiprocessing.connection, "wait", wait)
        collector.start()
        if when == "during the wait":
            assert waiting.wait(60), "hang guard"
            pool._finalizer()
        collector.join(60)  # hang guard
        assert not collector.is_alive(), "the collector still waits on the stopped workers"
        monkeypatch.setattr(multiprocessing.connection, "wait", real_wait)
        crash, = outcome
        assert isinstance(crash, WorkerCrashError) and crash.job is None
        assert "worker processes were stopped" in str(crash) and "interpreter is exiting" in str(crash)
        assert not pool.busy and pool.pids == []
        done = pool.result(pool.submit(segment, [(0, 8, ("quick", 5, None))]))
        assert done[0][0] not in workers
        np.testing.assert_array_equal(segment.views(8)["x"], [5] * 8)
    finally:
        if not collector.is_alive():  # else it holds the pool's lock for good (the failure shown above)
            pool.close()
