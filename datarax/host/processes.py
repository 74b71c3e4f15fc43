"""Worker processes that write a batch's rows into shared memory, for GIL-bound host functions.

Workers start on first use from a `forkserver` (`spawn` where there is none; never `fork`), each
writes its chunk of rows into a `SharedOutputs` segment, and a worker that dies becomes a
`WorkerCrashError` (the next batch starts a fresh pool). A script must start its pipeline under
`if __name__ == "__main__":`.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import pickle
import signal
import sys
import threading
import time
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


class WorkerCrashError(DataraxError, RuntimeError):
    """A worker process died (not an exception in the job: those are reported per record)."""


def context() -> Any:
    """The forkserver context (spawn where there is none), its server preloading datarax.

    Sets the process-wide preload (effective only before the server starts), so workers need not
    import JAX themselves.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["__main__", "datarax.host.map", "datarax.host.image"])
    return ctx


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
    """`num_workers` daemon processes that take chunks of rows off one queue, so a worker done with
    its chunk takes the next one, of this batch or of one started after it.

    `job` is pickled once per worker; `job(task, outputs)` gets a task and its rows of the shared
    outputs and returns a picklable result. `shared` (e.g. a `SharedBudget`, made from `context()`)
    goes to each worker as it starts, and reaches the job as `job.attach(shared)`. Several jobs may
    be in flight, each in its own `SharedOutputs`: `start` queues one and returns its ticket,
    `finish(ticket)` waits for its results.
    """

    def __init__(self, job: Callable[[Any, dict[str, np.ndarray]], Any], num_workers: int, name: str,
                 shared: Any = None):
        self.payload = pickle.dumps(job)
        self.num_workers, self.name, self.shared = num_workers, name, shared
        self._lock = threading.RLock()
        self._jobs: dict[int, tuple[list, list, list]] = {}  # ticket -> (rows per chunk, results, chunks left)
        self._tickets = 0
        self._tasks: Any = None  # the queue the workers take chunks from
        self._workers: list[tuple[Any, Any]] = []  # (process, connection its results come back on)
        self._finalizer: weakref.finalize | None = None

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids (empty before the first batch and after `close()`)."""
        return [p.pid for p, _ in self._workers]

    def run(self, outputs: SharedOutputs, chunks: Sequence[tuple[int, int, Any]]) -> list[Any]:
        """Computes chunks `(low, high, task)` into `outputs`; returns their results in order."""
        with self._lock:
            return self.finish(self.start(outputs, chunks))

    def start(self, outputs: SharedOutputs, chunks: Sequence[tuple[int, int, Any]]) -> int:
        """`run`'s sending half: queues the chunks and returns the ticket `finish` collects them by."""
        with self._lock:
            if not self._workers:
                self._start()
            ticket, self._tickets = self._tickets, self._tickets + 1
            where = (outputs.segment.name, outputs.layout, outputs.rows)
            self._jobs[ticket] = ([(low, high) for low, high, _ in chunks], [None] * len(chunks),
                                  list(range(len(chunks))))
            for i, (low, high, task) in enumerate(chunks):
                self._tasks.put((ticket, i, where, low, high, task))
            return ticket

    def finish(self, ticket: int) -> list[Any]:
        """The results of job `ticket`, in chunk order, once every chunk is back (results of other
        jobs arriving meanwhile are kept for their own `finish`)."""
        with self._lock:
            if ticket not in self._jobs:
                raise WorkerCrashError(f"{self.name}: job {ticket} was lost when the worker processes stopped")
            while self._jobs[ticket][2]:
                ready = multiprocessing.connection.wait(
                    [c for _, c in self._workers] + [p.sentinel for p, _ in self._workers])
                for process, conn in list(self._workers):
                    try:
                        while conn.poll():
                            self._receive(*conn.recv())
                    except (EOFError, OSError):  # its end closed: the worker is gone
                        self._crashed(process, ticket)
                    if process.sentinel in ready:
                        self._crashed(process, ticket)
            return self._jobs.pop(ticket)[1]

    def _receive(self, ticket: int, index: int, status: str, value: Any) -> None:
        if status == "error":
            self._shutdown()
            raise RuntimeError(value)
        if ticket in self._jobs:  # else a job dropped when the pool last stopped
            _, results, left = self._jobs[ticket]
            results[index] = value
            left.remove(index)

    def _crashed(self, process: Any, ticket: int) -> None:
        process.join(1)
        code = process.exitcode
        rows = ", ".join(f"{low}-{high - 1}" for i, (low, high) in enumerate(self._jobs[ticket][0])
                         if i in self._jobs[ticket][2])
        self._shutdown()
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        raise WorkerCrashError(
            f"{self.name} worker process {process.pid} died ({how}) while rows {rows} of a batch were not yet "
            "computed; the workers are stopped and a fresh pool starts with the next batch. A crash rather than "
            "an exception is usually a fault in a C extension or the out-of-memory killer: try the function on "
            "those records in this process")

    def _start(self) -> None:
        ctx = context()
        self._tasks = ctx.SimpleQueue()
        for i in range(self.num_workers):
            parent, child = ctx.Pipe(duplex=False)
            process = ctx.Process(target=worker_main, args=(self._tasks, child, self.payload, list(sys.path),
                                                            self.shared), daemon=True, name=f"{self.name}-{i}")
            process.start()
            child.close()
            self._workers.append((process, parent))
        self._finalizer = weakref.finalize(self, stop_workers, self._workers, self._tasks)

    def _shutdown(self) -> None:
        self._jobs.clear()
        workers, self._workers = self._workers, []
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        stop_workers(workers, self._tasks)

    def close(self) -> None:
        """Stops and joins the workers (idempotent; a later `run` starts new ones)."""
        with self._lock:
            self._shutdown()

    def __getstate__(self) -> dict[str, Any]:  # processes, pipes and locks neither copy nor pickle
        if self.shared is not None:
            raise TypeError(f"{self.name}: a WorkerPool with shared state does not copy; build its stage again")
        return {"payload": self.payload, "num_workers": self.num_workers, "name": self.name, "shared": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._workers, self._finalizer, self._tasks = threading.RLock(), [], None, None
        self._jobs, self._tickets = {}, 0


def stop_workers(workers: list[tuple[Any, Any]], tasks: Any) -> None:
    """Asks each worker to stop (after the chunks already queued), then joins them, terminating
    those still running after 5 s in all."""
    for _ in workers:
        try:
            tasks.put(None)
        except (OSError, ValueError):
            break  # the queue is gone
    deadline = time.monotonic() + 5
    for process, _ in workers:
        process.join(max(0.0, deadline - time.monotonic()))
    for process, conn in workers:
        if process.is_alive():
            process.terminate()
            process.join(5)
        conn.close()
    workers.clear()


def worker_main(tasks: Any, conn: Any, payload: bytes, path: list[str], shared: Any = None) -> None:
    """A worker's loop: load the job once, then run one chunk per message off `tasks` until told
    to stop, results back on `conn`; `path` is the parent's current `sys.path`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path[:] = path
    try:
        job = pickle.loads(payload)
        if shared is not None:
            job.attach(shared)
    except BaseException:  # any failure to load the job is reported, then the worker ends
        conn.send((-1, 0, "error", "a worker process could not load the function: " + traceback.format_exc(limit=4)
                   + "Define the function at module level in an importable module (not in a notebook cell or "
                     "under `if __name__ == '__main__':`)"))
        return
    segments: dict[str, shared_memory.SharedMemory] = {}  # the two most recent: a batch and the next
    while (message := tasks.get()) is not None:
        ticket, index, (name, layout, rows), low, high, task = message
        try:
            if name not in segments:
                if len(segments) == 2:
                    segments.pop(next(iter(segments))).close()
                segments[name] = attach(name)
            result = ("ok", job(task, views(segments[name].buf, layout, rows, low, high)))
        except BaseException:  # the parent raises it with the worker's traceback
            result = ("error", f"a worker process failed outside the function: {traceback.format_exc()}")
        try:
            conn.send((ticket, index, *result))
        except OSError:
            break  # the parent has stopped listening
    for segment in segments.values():
        segment.close()


def attach(name: str) -> shared_memory.SharedMemory:
    """Opens the parent's segment. Workers share the parent's resource tracker (spawn and forkserver
    hand it down), so the registration this makes is the parent's own, removed when it unlinks."""
    return shared_memory.SharedMemory(name=name)
