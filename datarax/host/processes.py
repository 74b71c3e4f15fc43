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
    """`num_workers` daemon processes running `job(task, outputs)` on one task each per batch.

    `job` is pickled once per worker; `job(task, outputs)` gets a task and its rows of the shared
    outputs and returns a picklable result. `shared` (e.g. a `SharedBudget`, made from `context()`)
    goes to each worker as it starts, and reaches the job as `job.attach(shared)`.
    """

    def __init__(self, job: Callable[[Any, dict[str, np.ndarray]], Any], num_workers: int, name: str,
                 shared: Any = None):
        self.payload = pickle.dumps(job)
        self.num_workers, self.name, self.shared = num_workers, name, shared
        self._lock = threading.RLock()
        self._pending: dict | None = None
        self._results: list[Any] = []
        self._workers: list[tuple[Any, Any]] = []  # (process, connection)
        self._finalizer: weakref.finalize | None = None

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids (empty before the first batch and after `close()`)."""
        return [p.pid for p, _ in self._workers]

    def run(self, outputs: SharedOutputs, chunks: Sequence[tuple[int, int, Any]]) -> list[Any]:
        """Sends chunk `i` = `(low, high, task)` to worker `i`; returns the results in order."""
        with self._lock:
            self.start(outputs, chunks)
            return self.finish()

    def start(self, outputs: SharedOutputs, chunks: Sequence[tuple[int, int, Any]]) -> None:
        """`run`'s sending half: the workers start on the chunks, and `finish` collects their results
        (one job in flight at a time)."""
        with self._lock:
            if self._pending is not None:
                raise RuntimeError(f"{self.name}: a job is already in flight; finish() it first")
            if len(self._workers) < len(chunks):
                self._start(len(chunks))
            where = (outputs.segment.name, outputs.layout, outputs.rows)
            pending = {}
            for i, (low, high, task) in enumerate(chunks):
                process, conn = self._workers[i]
                conn.send((where, low, high, task))
                pending[i] = (process, conn, low, high)
            self._pending, self._results = pending, [None] * len(chunks)

    @property
    def busy(self) -> bool:
        """Whether a job `start`ed is not yet `finish`ed."""
        return self._pending is not None

    def finish(self) -> list[Any]:
        """The results of the job in flight, in chunk order, once every worker has sent its own."""
        with self._lock:
            pending, results = self._pending or {}, self._results
            self._pending = None
            while pending:
                ready = multiprocessing.connection.wait(
                    [c for _, c, _, _ in pending.values()] + [p.sentinel for p, _, _, _ in pending.values()])
                for i, (process, conn, low, high) in list(pending.items()):
                    if conn in ready:
                        try:
                            status, value = conn.recv()
                        except (EOFError, OSError):
                            status, value = "died", None
                    elif process.sentinel in ready:
                        status, value = "died", None
                    else:
                        continue
                    if status == "died":
                        process.join(1)
                        code = process.exitcode
                        self._shutdown()
                        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                        raise WorkerCrashError(
                            f"{self.name} worker process {process.pid} died ({how}) while computing rows {low}-"
                            f"{high - 1} of a batch; the workers are stopped and a fresh pool starts with the next "
                            "batch. A crash rather than an exception is usually a fault in a C extension or the "
                            "out-of-memory killer: try the function on those records in this process")
                    if status == "error":
                        self._shutdown()
                        raise RuntimeError(value)
                    results[i] = value
                    del pending[i]
            return results

    def _start(self, count: int) -> None:
        ctx = context()
        while len(self._workers) < count:
            parent, child = ctx.Pipe()
            process = ctx.Process(target=worker_main, args=(child, self.payload, list(sys.path), self.shared),
                                  daemon=True, name=f"{self.name}-{len(self._workers)}")
            process.start()
            child.close()
            self._workers.append((process, parent))
        if self._finalizer is None:
            self._finalizer = weakref.finalize(self, stop_workers, self._workers)

    def _shutdown(self) -> None:
        self._pending = None
        workers, self._workers = self._workers, []
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        stop_workers(workers)

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
        self._lock, self._workers, self._finalizer = threading.RLock(), [], None
        self._pending, self._results = None, []


def stop_workers(workers: list[tuple[Any, Any]]) -> None:
    """Asks each worker to stop, then joins it (terminating one that does not stop)."""
    for _, conn in workers:
        try:
            conn.send(None)
        except (OSError, ValueError):
            pass  # already gone
    for process, conn in workers:
        process.join(5)
        if process.is_alive():
            process.terminate()
            process.join(5)
        conn.close()
    workers.clear()


def worker_main(conn: Any, payload: bytes, path: list[str], shared: Any = None) -> None:
    """A worker's loop: load the job once, then run one task per message until told to stop; `path`
    is the parent's current `sys.path`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path[:] = path
    try:
        job = pickle.loads(payload)
        if shared is not None:
            job.attach(shared)
    except BaseException:  # any failure to load the job is reported, then the worker ends
        conn.send(("error", "a worker process could not load the function: " + traceback.format_exc(limit=4)
                   + "Define the function at module level in an importable module (not in a notebook cell or "
                     "under `if __name__ == '__main__':`)"))
        return
    segments: dict[str, shared_memory.SharedMemory] = {}
    while True:
        message = conn.recv()
        if message is None:
            break
        (name, layout, rows), low, high, task = message
        if name not in segments:
            for old in segments.values():
                old.close()
            segments = {name: attach(name)}
        try:
            result = ("ok", job(task, views(segments[name].buf, layout, rows, low, high)))
        except BaseException:  # the parent raises it with the worker's traceback
            result = ("error", f"a worker process failed outside the function: {traceback.format_exc()}")
        conn.send(result)
    for segment in segments.values():
        segment.close()


def attach(name: str) -> shared_memory.SharedMemory:
    """Opens the parent's segment. Workers share the parent's resource tracker (spawn and forkserver
    hand it down), so the registration this makes is the parent's own, removed when it unlinks."""
    return shared_memory.SharedMemory(name=name)
