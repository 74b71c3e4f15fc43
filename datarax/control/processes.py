"""The one process pool: worker processes that write a batch's rows into shared memory, for
GIL-bound host functions (the thread pool, for work that releases the GIL, is `control.pool`).

Workers start on first use from a `forkserver` (`spawn` where there is none; never `fork`), each
writes its chunk of rows into a `SharedOutputs` segment, and a worker that dies becomes a
`WorkerCrashError` (the next batch starts a fresh pool). A script must start its pipeline under
`if __name__ == "__main__":`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import multiprocessing
import multiprocessing.connection
import pickle
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from datarax.core.errors import DataraxError

_ALIGN = 64
Layout = tuple[tuple[str, int, tuple[int, ...], str], ...]  # (field, byte offset, record shape, dtype)
EXECUTORS = ("threads", "processes")
_ATTACHED = 3  # shared segments a worker keeps open (a batch read out, one decoding, one decoded ahead)


class WorkerCrashError(DataraxError, RuntimeError):
    """A worker process died (not an exception in the job: those are reported per record); `job` is
    the id of the job whose chunk it was computing (None between chunks)."""

    def __init__(self, message: str, job: int | None = None):
        super().__init__(message)
        self.job = job


def context(preload: Sequence[str] = ()) -> Any:
    """The forkserver context (spawn where there is none), its server preloading `preload`.

    Sets the process-wide preload (effective only before the server starts): a worker pool passes
    its job's module, so the workers forked from the server need not import it (and JAX) themselves.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    if preload:
        ctx.set_forkserver_preload(["__main__", *preload])
    return ctx


def row_blocks(count: int, parts: int) -> list[tuple[int, int]]:
    """`count` rows cut into at most `parts` contiguous blocks of nearly equal size, as `(low, high)`."""
    edges = np.linspace(0, count, min(parts, count) + 1).astype(np.int64).tolist()
    return list(zip(edges[:-1], edges[1:]))


class SharedOutputs:
    """A shared-memory segment holding `rows` rows of every output field, reused batch to batch."""

    def __init__(self, spec: Sequence[tuple[str, tuple[int, ...], str]]):
        self.spec = tuple(spec)
        self.rows = 0
        self.segment: shared_memory.SharedMemory | None = None
        self.layout: Layout = ()

    def ensure(self, rows: int) -> None:
        """Makes room for `rows` rows (a new segment only when the current one is too small)."""
        if rows <= self.rows:
            return
        layout, offset = [], 0
        for name, shape, dtype in self.spec:
            layout.append((name, offset, shape, dtype))
            nbytes = rows * math.prod(shape) * np.dtype(dtype).itemsize
            offset += -(-nbytes // _ALIGN) * _ALIGN
        self.close()
        self.segment = shared_memory.SharedMemory(create=True, size=max(offset, 1))
        self.rows, self.layout = rows, tuple(layout)
        self._finalizer = weakref.finalize(self, release, self.segment)  # an owner dropped unclosed

    def views(self, count: int) -> dict[str, np.ndarray]:
        """The first `count` rows of every field (views into the segment)."""
        return views(self.segment.buf, self.layout, self.rows, 0, count)

    def close(self) -> None:
        """Frees the segment (idempotent; a later `ensure` makes a new one)."""
        segment, self.segment, self.rows = self.segment, None, 0
        if segment is not None:
            self._finalizer.detach()
            release(segment)

    def __getstate__(self) -> dict[str, Any]:  # a copy gets its own segment when it first needs one
        return {"spec": self.spec}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["spec"])


def release(segment: shared_memory.SharedMemory) -> None:
    segment.close()
    segment.unlink()


def views(buffer: Any, layout: Layout, rows: int, low: int, high: int) -> dict[str, np.ndarray]:
    return {name: np.ndarray((rows,) + tuple(shape), np.dtype(dtype), buffer=buffer, offset=offset)[low:high]
            for name, offset, shape, dtype in layout}


class WorkerPool:
    """`num_workers` daemon processes that take the chunks of jobs from one shared queue.

    `submit(outputs, chunks)` queues a job's chunks `(low, high, task)` and returns its id at once;
    each worker takes the next queued chunk as soon as it is free, of this job or of one submitted
    after it, so uneven records balance across the workers, and workers done with one job's chunks
    start on the next job's while the others finish theirs (no barrier between batches).
    `result(job)` waits for that job's chunks and gives their results in chunk order.

    `job` is pickled once per worker; `job(task, outputs)` gets a task and its rows of the shared
    outputs and returns a picklable result. `shared` (e.g. a `SharedBudget`, made from `context()`)
    goes to each worker as it starts, and reaches the job as `job.attach(shared)`.
    """

    def __init__(self, job: Callable[[Any, dict[str, np.ndarray]], Any], num_workers: int, name: str,
                 shared: Any = None):
        self.payload = pickle.dumps(job)
        self.preload = getattr(job, "__module__", None) or type(job).__module__  # a function's, or its class's
        self.num_workers, self.name, self.shared = num_workers, name, shared
        self._lock = threading.RLock()
        self._jobs: dict[int, _Job] = {}  # submitted, not yet collected by `result`
        self._ids = itertools.count()
        self._workers: list[tuple[Any, Any]] = []  # (process, connection)
        self._tasks: Any = None  # the queue the workers take chunks from
        self._holding: Any = None  # per worker: the (job, chunk) it computes, job -1 when none
        self._finalizer: weakref.finalize | None = None

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids (empty before the first batch and after `close()`)."""
        return [p.pid for p, _ in self._workers]

    @property
    def busy(self) -> bool:
        """Whether a job submitted is not yet collected."""
        return bool(self._jobs)

    def submit(self, outputs: SharedOutputs, chunks: Sequence[tuple[int, int, Any]]) -> int:
        """Queues chunk `i` = `(low, high, task)` of a job writing into `outputs`; returns the job's id.

        The caller keeps `outputs` as they are until `result` has the job back."""
        with self._lock:
            if len(self._workers) < min(self.num_workers, len(chunks)):
                self._start(min(self.num_workers, len(chunks)))
            job_id, where = next(self._ids), (outputs.segment.name, outputs.layout, outputs.rows)
            # Pickled here, so a task that cannot be pickled fails this call (the queue's own thread
            # would drop it, and the job would never finish).
            messages = [pickle.dumps((job_id, i, where, low, high, task)) for i, (low, high, task) in enumerate(chunks)]
            self._jobs[job_id] = _Job([(low, high) for low, high, _ in chunks], [_PENDING] * len(chunks),
                                      len(chunks))
            for message in messages:
                self._tasks.put(message)
            return job_id

    def result(self, job_id: int) -> list[Any]:
        """The results of job `job_id`, in chunk order, once the workers have sent them all."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise KeyError(f"{self.name}: no job {job_id} in flight (collected already, or lost when the "
                               "workers stopped)")
            while job.remaining:
                self._receive()
            del self._jobs[job_id]
            return job.results

    def _receive(self) -> None:
        """Waits for the next worker messages and files their results; raises for a worker that failed
        outside its job or died (stopping every worker: the jobs in flight are lost)."""
        workers = self._workers
        ready = set(multiprocessing.connection.wait([c for _, c in workers] + [p.sentinel for p, _ in workers]))
        for w, (process, conn) in enumerate(workers):
            if conn in ready:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    self._died(w, process)  # raises
                job_id, index, status, value = message
                if status == "error":
                    self._shutdown()
                    raise RuntimeError(value)
                job = self._jobs.get(job_id)
                if job is not None:
                    job.results[index] = value
                    job.remaining -= 1
            elif process.sentinel in ready:
                self._died(w, process)

    def _died(self, w: int, process: Any) -> None:
        job_id, index = self._holding[2 * w], self._holding[2 * w + 1]
        job = self._jobs.get(job_id)
        if job is not None and job.results[index] is not _PENDING:
            job = None  # it died after sending that chunk's result
        process.join(1)
        code = process.exitcode
        self._shutdown()
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        where = (f"while computing rows {job.rows[index][0]}-{job.rows[index][1] - 1} of a batch" if job is not None
                 else "between chunks")
        raise WorkerCrashError(
            f"{self.name} worker process {process.pid} died ({how}) {where}; the workers are stopped and a fresh "
            "pool starts with the next batch. A crash rather than an exception is usually a fault in a C extension "
            "or the out-of-memory killer: try the function on those records in this process",
            job=job_id if job is not None else None)

    def _start(self, count: int) -> None:
        ctx = context([self.preload])
        if self._tasks is None:
            self._tasks = ctx.Queue()
            self._tasks.cancel_join_thread()  # an exit never waits on chunks no worker will take
            self._holding = ctx.Array("q", [-1, 0] * self.num_workers, lock=False)
        while len(self._workers) < count:
            parent, child = ctx.Pipe()
            w = len(self._workers)
            process = ctx.Process(target=worker_main, daemon=True, name=f"{self.name}-{w}",
                                  args=(child, self._tasks, self._holding, w, self.payload, list(sys.path),
                                        self.shared))
            process.start()
            child.close()
            self._workers.append((process, parent))
        if self._finalizer is None:
            self._finalizer = weakref.finalize(self, stop_workers, self._workers, self._tasks, False)

    def _shutdown(self, polite: bool = False) -> None:
        """Stops the workers: `polite` (nothing in flight) asks each to stop, else they are terminated."""
        polite = polite and not self._jobs
        self._jobs.clear()
        workers, tasks, self._workers, self._tasks, self._holding = self._workers, self._tasks, [], None, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        stop_workers(workers, tasks, polite)

    def close(self) -> None:
        """Stops and joins the workers (idempotent; a later `submit` starts new ones); jobs in flight are lost."""
        with self._lock:
            self._shutdown(polite=True)

    def __getstate__(self) -> dict[str, Any]:  # processes, pipes and locks neither copy nor pickle
        if self.shared is not None:
            raise TypeError(f"{self.name}: a WorkerPool with shared state does not copy; build its stage again")
        return {"payload": self.payload, "preload": self.preload, "num_workers": self.num_workers, "name": self.name,
                "shared": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._jobs, self._ids = threading.RLock(), {}, itertools.count()
        self._workers, self._tasks, self._holding, self._finalizer = [], None, None, None


class BatchesAhead:
    """The batches a `WorkerPool` computes ahead, in two shared segments: the batch read next and
    the one after it.

    `ahead(key, chunks)` names the batch after the one read next; its chunks are queued as soon as
    that one is in flight, so a worker done with its part of a batch takes the next batch's next
    part instead of waiting for the slowest. `read(key, chunks, out)` copies batch `key` into `out`
    (computing it first when it was not named ahead) and returns its chunks' results; batches
    computed ahead but not read next (a seek, another order) are waited out and dropped.
    """

    def __init__(self, pool: WorkerPool, spec: Sequence[tuple[str, tuple[int, ...], str]]):
        self.pool = pool
        self._segments = (SharedOutputs(spec), SharedOutputs(spec))
        self._lock = threading.Lock()
        self._flights: list[tuple] = []  # (key, segment, rows, job id), oldest first
        self._queued: tuple | None = None  # (key, chunks) named ahead, waiting for a free segment

    def ahead(self, key: Any, chunks: Sequence[tuple[int, int, Any]]) -> None:
        with self._lock:
            self._queued = (key, chunks)
            if self._flights:  # else it starts right behind the batch read next
                self._start_queued()

    def read(self, key: Any, chunks: Callable[[], Sequence[tuple[int, int, Any]]],
             out: dict[str, np.ndarray]) -> list[Any]:
        """Batch `key`'s chunk results, its rows copied into `out`; `chunks()` makes its work when it
        was not named ahead (or was lost with a worker that died on another batch)."""
        with self._lock:
            taken = None
            while taken is None:
                if all(flight[0] != key for flight in self._flights):
                    if self._free_segment() is None:
                        self._drop()
                    self._start(key, chunks(), self._free_segment())
                    self._start_queued()
                taken = self._take(key)
            results, segment, count = taken
            for name, rows in segment.views(count).items():
                np.copyto(out[name], rows)
            self._start_queued()  # the segment is free again
            return results

    def _free_segment(self) -> SharedOutputs | None:
        return next((s for s in self._segments if all(s is not flight[1] for flight in self._flights)), None)

    def _start_queued(self) -> None:
        if self._queued is None:
            return
        key, chunks = self._queued
        if any(flight[0] == key for flight in self._flights):
            self._queued = None
        elif (segment := self._free_segment()) is not None:
            self._queued = None
            self._start(key, chunks, segment)

    def _start(self, key: Any, chunks: Sequence[tuple[int, int, Any]], segment: SharedOutputs) -> None:
        count = max(high for _, high, _ in chunks)
        segment.ensure(count)
        self._flights.append((key, segment, count, self.pool.submit(segment, chunks)))

    def _take(self, key: Any) -> tuple[list, SharedOutputs, int] | None:
        """`(results, segment, rows)` of batch `key`, in flight, after dropping the batches started
        before it; None when a worker died on another batch's rows: the pool lost every job, and
        the wanted batch is computed afresh."""
        while self._flights and self._flights[0][0] != key:
            self._drop()
        if not self._flights:
            return None
        _, segment, count, job = self._flights.pop(0)
        try:
            results = self.pool.result(job)
        except WorkerCrashError as crash:
            self._flights.clear()
            if crash.job is None or crash.job == job:
                raise
            return None
        except BaseException:
            self._abandon()
            raise
        return results, segment, count

    def _drop(self) -> None:
        """Waits out the oldest job in flight (its batch not wanted); a worker dying meanwhile stopped
        the pool, and every job in flight went with it."""
        try:
            self.pool.result(self._flights.pop(0)[3])
        except WorkerCrashError:
            self._flights.clear()
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Stops the workers (a wait was interrupted, e.g. by Ctrl-C): chunks still queued must not
        write into a segment a later batch reuses. The next `read` starts a fresh pool."""
        self.pool.close()
        self._flights.clear()

    def close(self) -> None:
        """Stops the workers and frees the segments (a later `read` starts them again)."""
        with self._lock:
            self.pool.close()
            self._flights, self._queued = [], None
            for segment in self._segments:
                segment.close()


_PENDING = object()  # a chunk whose result has not come back


@dataclasses.dataclass
class _Job:
    rows: list[tuple[int, int]]  # each chunk's (low, high)
    results: list[Any]
    remaining: int


def stop_workers(workers: list[tuple[Any, Any]], tasks: Any, polite: bool) -> None:
    """Stops the workers: `polite` queues a stop for each and joins it (terminating one that does not
    stop); otherwise (a worker died, or chunks are still queued) each is terminated at once."""
    if polite and tasks is not None:
        for _ in workers:
            tasks.put(None)
    for process, conn in workers:
        if polite:
            process.join(5)
        if process.is_alive():
            process.terminate()
        process.join(5)
        conn.close()
    workers.clear()
    if tasks is not None:
        tasks.close()


def worker_main(conn: Any, tasks: Any, holding: Any, w: int, payload: bytes, path: list[str],
                shared: Any = None) -> None:
    """Worker `w`'s loop: load the job once, then run the chunks it takes from `tasks` until it takes
    None; `holding[2w:2w+2]` says which (job, chunk) it computes; `path` is the parent's `sys.path`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path[:] = path
    try:
        job = pickle.loads(payload)
        if shared is not None:
            job.attach(shared)
    except BaseException:  # any failure to load the job is reported, then the worker ends
        conn.send((-1, -1, "error", "a worker process could not load the function: " + traceback.format_exc(limit=4)
                   + "Define the function at module level in an importable module (not in a notebook cell or "
                     "under `if __name__ == '__main__':`)"))
        return
    segments: dict[str, shared_memory.SharedMemory] = {}  # the latest few, newest last
    while True:
        message = tasks.get()
        if message is None:
            break
        job_id, index, (name, layout, rows), low, high, task = pickle.loads(message)
        holding[2 * w], holding[2 * w + 1] = job_id, index
        if name not in segments:
            if len(segments) >= _ATTACHED:
                segments.pop(next(iter(segments))).close()
            segments[name] = attach(name)
        try:
            result = ("ok", job(task, views(segments[name].buf, layout, rows, low, high)))
        except BaseException:  # the parent raises it with the worker's traceback
            result = ("error", f"a worker process failed outside the function: {traceback.format_exc()}")
        conn.send((job_id, index) + result)
        holding[2 * w] = -1
    for segment in segments.values():
        segment.close()


def attach(name: str) -> shared_memory.SharedMemory:
    """Opens the parent's segment. Workers share the parent's resource tracker (spawn and forkserver
    hand it down), so the registration this makes is the parent's own, removed when it unlinks."""
    return shared_memory.SharedMemory(name=name)
