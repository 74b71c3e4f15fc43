"""The one process pool: worker processes that write a batch's rows into shared memory, for
GIL-bound host functions (the thread pool, for work that releases the GIL, is `control.pool`).

Workers start on first use from a `forkserver` (`spawn` where there is none; never `fork`), each
writes its chunk of rows into a `SharedOutputs` segment, and a worker that dies becomes a
`WorkerCrashError` (the next batch starts a fresh pool). A script must start its pipeline under
`if __name__ == "__main__":`; `choose_executor` checks that before it picks processes itself.

One pool per job and worker count serves the whole process (`lease`): a pipeline built again
with the same host stage reuses the workers of the one before it, and the last lease to go
stops them.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.machinery
import inspect
import itertools
import math
import multiprocessing
import multiprocessing.connection
import os
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
MAIN_MODULE_ENV = "DATARAX_MAIN_MODULE"  # read by `datarax.control.main_preload` in the forkserver
Layout = tuple[tuple[str, int, tuple[int, ...], str], ...]  # (field, byte offset, record shape, dtype)
EXECUTORS = ("auto", "threads", "processes")
_ATTACHED = 3  # shared segments a worker keeps open (a batch read out, one decoding, one decoded ahead)
_JOBS_KEPT = 32  # jobs (stage settings) a worker keeps loaded


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
        # A `python -m NAME` main is imported in the server by name (`datarax.control.main_preload`);
        # each process says its own, so a child process never preloads its parent's main module.
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        name = getattr(spec, "name", None) or ""
        os.environ[MAIN_MODULE_ENV] = "" if name == "__main__" or name.endswith(".__main__") else name
        ctx.set_forkserver_preload(["__main__", "datarax.control.main_preload", *preload])
    return ctx


@dataclasses.dataclass(frozen=True)
class ExecutorChoice:
    """The executor a host stage runs on ("threads" or "processes") and why (`describe` shows both)."""

    executor: str
    reason: str

    def __str__(self) -> str:
        return f"{self.executor} ({self.reason})"


def choose_executor(requested: str, stage: str, *, job: Any = None, workers: int | None = None) -> ExecutorChoice:
    """The executor of a host stage asked for `requested` ("auto", "threads" or "processes").

    "auto" picks worker processes, which scaled better than threads on every host measured (the
    2-core CPU and the TPU's 13-core gVisor host: docs/sources.md, "Executors"), unless they
    cannot pay or cannot work here: one core or one worker (`workers`; the reader thread does
    the work itself), a process that is itself a daemonic worker, a script that builds the
    pipeline outside `if __name__ == "__main__":` (the workers would run it again), or a `job`
    that does not pickle (a lambda). Then it picks threads and says why.
    """
    if requested != "auto":
        return ExecutorChoice(requested, "as configured")
    if (os.cpu_count() or 1) < 2:
        return ExecutorChoice("threads", "auto: one core, where worker processes would only add copies")
    if workers == 1:
        return ExecutorChoice("threads", "auto: one worker, so the reader thread does the work itself")
    if multiprocessing.current_process().daemon:
        return ExecutorChoice("threads", "auto: this is a daemonic worker process, which cannot start processes")
    problem = script_guard_problem()
    if problem is not None:
        return ExecutorChoice("threads", f"auto: {problem}; worker processes would run it again")
    if job is not None:
        try:
            pickle.loads(pickle.dumps(job))
        except Exception as exc:  # PicklingError, AttributeError, TypeError: all mean the same
            return ExecutorChoice("threads", f"auto: {stage}'s function cannot be sent to worker processes "
                                  f"({type(exc).__name__}); a module-level `def` can")
        module = getattr(getattr(job, "fn", None), "__module__", None)
        if module is not None and not importable(module):
            return ExecutorChoice("threads", f"auto: {stage}'s module {module!r} was loaded from a file that is not "
                                  "on sys.path, so worker processes could not import it")
    return ExecutorChoice("processes", "auto: worker processes")


def importable(module: str) -> bool:
    """Whether a worker process (with this process's `sys.path`) can import `module` by name."""
    if module == "__main__":
        return getattr(sys.modules.get("__main__"), "__file__", None) is not None  # re-imported as __mp_main__
    top = module.partition(".")[0]
    if top in sys.builtin_module_names or top in sys.stdlib_module_names:
        return True
    return importlib.machinery.PathFinder.find_spec(top, sys.path) is not None


_GUARDS: dict[tuple[str, float], list[tuple[int, int]]] = {}


def main_guards(path: str) -> list[tuple[int, int]] | None:
    """The line spans of the top-level `if __name__ == "__main__":` blocks of the script at `path`
    (None when it cannot be read or parsed)."""
    try:
        key = (path, os.path.getmtime(path))
        if key not in _GUARDS:
            with open(path, "rb") as f:
                tree = ast.parse(f.read(), path)
            _GUARDS[key] = [(node.lineno, node.end_lineno or node.lineno) for node in tree.body
                            if isinstance(node, ast.If) and _is_main_test(node.test)]
        return _GUARDS[key]
    except (OSError, SyntaxError, ValueError):
        return None


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    values = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and values == ["__main__"]


def script_guard_problem() -> str | None:
    """Why worker processes started now would run the user's script again (None: they would not).

    A worker process imports the main module (multiprocessing's rule under spawn and forkserver),
    which runs its top-level code again unless that code is under `if __name__ == "__main__":`.
    An interactive session or `python -c` has no script to import. Otherwise the call is checked
    against the script's guards: the line of the script running now must be inside one (a script
    with no frame on this thread's stack, e.g. a pipeline built on another thread, needs a guard).
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None:
        return None
    guards = main_guards(path)
    if guards is None:
        return f"the script {path} could not be read to check for an `if __name__ == '__main__':` guard"
    frame = inspect.currentframe()
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None if guards else f"the script {path} has no `if __name__ == '__main__':` guard"
    line = frame.f_lineno
    if any(low <= line <= high for low, high in guards):
        return None
    return f"the script {path} builds the pipeline at line {line}, outside `if __name__ == '__main__':`"


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

    `job` (or the pickled job a `submit` names, for a pool that serves several stages) is loaded
    once per worker; `job(task, outputs)` gets a task and its rows of the shared outputs and returns
    a picklable result. `shared` (e.g. a `SharedBudget`, made from `context()`) goes to each worker
    as it starts, and reaches each job as `job.attach(shared)` when it has one.
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
        self._lost: set[int] = set()  # jobs in flight when the workers were stopped, not yet asked for

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids (empty before the first batch and after `close()`)."""
        return [p.pid for p, _ in self._workers]

    @property
    def busy(self) -> bool:
        """Whether a job submitted is not yet collected."""
        return bool(self._jobs)

    def submit(self, outputs: SharedOutputs, chunks: Sequence[tuple[int, int, Any]],
               payload: bytes | None = None) -> int:
        """Queues chunk `i` = `(low, high, task)` of a job writing into `outputs`; returns the job's id.
        `payload` (a pickled job, loaded once per worker) runs the chunks instead of the pool's own.

        The caller keeps `outputs` as they are until `result` has the job back."""
        with self._lock:
            if len(self._workers) < min(self.num_workers, len(chunks)):
                self._start(min(self.num_workers, len(chunks)))
            job_id, where = next(self._ids), (outputs.segment.name, outputs.layout, outputs.rows)
            # Pickled here, so a task that cannot be pickled fails this call (the queue's own thread
            # would drop it, and the job would never finish).
            wanted = None if payload == self.payload else payload
            messages = [pickle.dumps((job_id, i, where, low, high, task, wanted))
                        for i, (low, high, task) in enumerate(chunks)]
            self._jobs[job_id] = _Job([(low, high) for low, high, _ in chunks], [_PENDING] * len(chunks),
                                      len(chunks))
            for message in messages:
                self._tasks.put(message)
            return job_id

    def result(self, job_id: int) -> list[Any]:
        """The results of job `job_id`, in chunk order, once the workers have sent them all."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None and job_id in self._lost:
                self._lost.discard(job_id)
                raise WorkerCrashError(f"{self.name}: job {job_id} was lost when the workers stopped (a worker died "
                                       "on another job's rows, or a wait was interrupted); compute it again", job=-1)
            if job is None:
                raise KeyError(f"{self.name}: no job {job_id} in flight (collected already, or lost when the "
                               "workers stopped)")
            while job.remaining:
                self._receive()
            del self._jobs[job_id]
            if job.error is not None:
                raise RuntimeError(job.error)
            return job.results

    def forget(self, job_id: int) -> None:
        """Drops job `job_id` (its batch is no longer wanted): its results are discarded as they arrive."""
        with self._lock:
            self._jobs.pop(job_id, None)
            self._lost.discard(job_id)

    def _receive(self) -> None:
        """Waits for the next worker messages and files their results; raises for a worker that failed
        outside its job or died (stopping every worker: the jobs in flight are lost)."""
        # A copy: the pool's finalizer (at exit, while this thread waits) takes the workers off the
        # pool's own list as it stops them; worker w of the copy is still worker w of `_holding`.
        workers = list(self._workers)
        if not workers:  # that finalizer ran before this wait: nothing is left to wait on
            self._shutdown()
            raise WorkerCrashError(f"{self.name}: the worker processes were stopped while a batch was in flight (by "
                                   "the pool's finalizer: the interpreter is exiting)", job=None)
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
                if status == "unloadable":  # that job fails; the workers run on for the others
                    if job is not None:
                        job.error = value
                        job.remaining -= 1
                    continue
                if status == "gone" and job is not None:  # only a forgotten job's segment is ever freed early
                    self._shutdown()
                    raise RuntimeError(f"{self.name}: the shared memory {value} of job {job_id} was freed while "
                                       "the job was in flight")
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
        stopped = all(p is not process for p, _ in self._workers)  # by the pool's finalizer, during the wait
        process.join(1)
        code = process.exitcode
        self._shutdown()
        how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        where = (f"while computing rows {job.rows[index][0]}-{job.rows[index][1] - 1} of a batch" if job is not None
                 else "between chunks")
        if stopped:
            raise WorkerCrashError(
                f"{self.name}: the worker processes were stopped {where} (by the pool's finalizer: the interpreter "
                "is exiting)", job=None)  # None: raised, never computed again
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
        if not polite:
            self._lost.update(self._jobs)
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
        self._lock, self._jobs, self._ids, self._lost = threading.RLock(), {}, itertools.count(), set()
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
        self._flights: list[tuple] = []  # (key, segment, rows, job id), oldest first; never rebound
        self._queued: tuple | None = None  # (key, chunks) named ahead, waiting for a free segment
        # Dropped unclosed (a pipeline rebuilt per epoch): its jobs in flight are forgotten, so the
        # workers, which other stages may share, never file results for segments freed with it.
        weakref.finalize(self, forget_jobs, pool, self._flights)

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
        _, segment, count, job = self._flights[0]
        try:
            results = self.pool.result(job)
        except WorkerCrashError as crash:
            self._forget_flights()
            if crash.job is None or crash.job == job:
                raise
            return None
        except BaseException:
            self._abandon()
            raise
        self._flights.pop(0)
        return results, segment, count

    def _drop(self) -> None:
        """Waits out the oldest job in flight (its batch not wanted); a worker dying meanwhile stopped
        the pool, and every job in flight went with it."""
        try:
            self.pool.result(self._flights[0][3])
        except WorkerCrashError:
            self._forget_flights()
            return
        except BaseException:
            self._abandon()
            raise
        self._flights.pop(0)

    def _forget_flights(self) -> None:
        forget_jobs(self.pool, self._flights)

    def _abandon(self) -> None:
        """Gives up the batches in flight (a wait was interrupted, e.g. by Ctrl-C): their jobs are
        forgotten and their segments dropped for new ones, so chunks still queued write only into
        memory no later batch reads. The workers (perhaps shared with other stages) keep running."""
        self._forget_flights()
        for segment in self._segments:  # unlinked here; a worker still writing keeps only its own mapping
            segment.close()
        self._segments = tuple(SharedOutputs(s.spec) for s in self._segments)

    def close(self) -> None:
        """Gives the workers back (`Lease.close`: the last user stops them) and frees the segments (a
        later `read` starts them again)."""
        with self._lock:
            self._forget_flights()
            self.pool.close()
            self._queued = None
            for segment in self._segments:
                segment.close()


class Lease:
    """One user's share of a process-wide `WorkerPool` (see `lease`): the pool's `submit`, `result`,
    `forget` and `pids`; `close()` gives it back once, and the last lease given back (closed, or
    collected unclosed) stops the workers. A lease taken again after `close()` holds the pool anew."""

    def __init__(self, key: tuple, job: Any, num_workers: int, name: str, budget: tuple[int, str] | None):
        self._key, self._args = key, (job, num_workers, name, budget)
        self.payload = pickle.dumps(job)
        self.pool: WorkerPool | None = None
        self.shared: Any = None
        self._release: weakref.finalize | None = None
        self._hold()

    def _hold(self) -> None:
        self.pool, self.shared = _acquire(self._key, *self._args)
        self._release = weakref.finalize(self, _give_back, self._key)

    def submit(self, outputs: SharedOutputs, chunks: Sequence[tuple[int, int, Any]]) -> int:
        if self._release is None or not self._release.alive:
            self._hold()
        return self.pool.submit(outputs, chunks, self.payload)

    def result(self, job_id: int) -> list[Any]:
        return self.pool.result(job_id)

    def forget(self, job_id: int) -> None:
        self.pool.forget(job_id)

    @property
    def pids(self) -> list[int]:
        """The pool's workers (empty once this lease is given back, or before the first batch)."""
        return [] if self._release is None or not self._release.alive else self.pool.pids

    @property
    def name(self) -> str:
        return self.pool.name

    def close(self) -> None:
        """Gives the pool back (idempotent); the last user's close stops its workers."""
        if self._release is not None:
            self._release()


_POOLS: dict[tuple, list] = {}  # key -> [pool, shared budget or None, leases held]
_POOLS_LOCK = threading.Lock()


def lease(job: Callable[[Any, dict[str, np.ndarray]], Any], num_workers: int, name: str,
          budget: tuple[int, str] | None = None) -> Lease:
    """A share of the process's `WorkerPool` named `name` with `num_workers` workers, running `job`:
    every stage of that kind with the same worker count and budget uses the same workers (each
    worker loads a stage's job once, by its pickled bytes), so a pipeline built again, or another
    pipeline of the same kind, starts without starting processes.

    `budget=(limit, label)` gives the workers one `SharedBudget` (the lease's `shared`): stages
    sharing the workers share its limit. A stage with another worker count or budget gets workers
    of its own.
    """
    key = (num_workers, name, budget)
    return Lease(key, job, num_workers, name, budget)


def _acquire(key: tuple, job: Any, num_workers: int, name: str, budget: tuple[int, str] | None) -> tuple:
    from datarax.control.budget import SharedBudget

    with _POOLS_LOCK:
        entry = _POOLS.get(key)
        if entry is None:
            shared = None if budget is None else SharedBudget(budget[0], budget[1], context())
            entry = _POOLS[key] = [WorkerPool(job, num_workers, name, shared), shared, 0]
        entry[2] += 1
        return entry[0], entry[1]


def _give_back(key: tuple) -> None:
    with _POOLS_LOCK:
        entry = _POOLS.get(key)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] > 0:
            return
        del _POOLS[key]
    entry[0].close()


def live_pools() -> int:
    """How many process-wide worker pools are held (for tests and monitoring)."""
    with _POOLS_LOCK:
        return len(_POOLS)


def forget_jobs(pool: Any, flights: list[tuple]) -> None:
    """Forgets the jobs of `flights` (`(key, segment, rows, job id)`) on `pool` and empties the list."""
    for flight in flights:
        pool.forget(flight[3])
    flights.clear()


_PENDING = object()  # a chunk whose result has not come back


@dataclasses.dataclass
class _Job:
    rows: list[tuple[int, int]]  # each chunk's (low, high)
    results: list[Any]
    remaining: int
    error: str | None = None  # a worker could not load the job


def stop_workers(workers: list[tuple[Any, Any]], tasks: Any, polite: bool) -> None:
    """Stops the workers: `polite` queues a stop for each and joins it (terminating one that does not
    stop); otherwise (a worker died, or chunks are still queued) each is terminated at once.

    Safe to call on the same list from two threads at once (at exit, a pool's finalizer and a thread
    still collecting its results can both stop it), and from a finalizer the garbage collector runs
    inside another stop: each worker is taken off the list by one `list.pop` (atomic), so its pipe is
    closed by one caller. There is no lock, which a finalizer run in the thread holding it would wait on
    forever. Two closes of one pipe would close whatever file took its number in between.
    """
    if polite and tasks is not None:
        for _ in range(len(workers)):
            tasks.put(None)
    while True:
        try:
            process, conn = workers.pop(0)
        except IndexError:
            break
        if polite:
            process.join(5)
        if process.is_alive():
            process.terminate()
        process.join(5)
        conn.close()
    if tasks is not None:
        tasks.close()


def worker_main(conn: Any, tasks: Any, holding: Any, w: int, payload: bytes, path: list[str],
                shared: Any = None) -> None:
    """Worker `w`'s loop: run the chunks it takes from `tasks` until it takes None, each with the job
    its message names (loaded once per worker, `payload` first); `holding[2w:2w+2]` says which (job,
    chunk) it computes; `path` is the parent's `sys.path`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path[:] = path
    jobs: dict[bytes, Any] = {}  # payload -> its job, the latest few
    segments: dict[str, shared_memory.SharedMemory] = {}  # the latest few, newest last
    while True:
        message = tasks.get()
        if message is None:
            break
        job_id, index, (name, layout, rows), low, high, task, wanted = pickle.loads(message)
        wanted = wanted or payload
        holding[2 * w], holding[2 * w + 1] = job_id, index
        job = jobs.get(wanted)
        if job is None:
            try:
                job = pickle.loads(wanted)
                if shared is not None and hasattr(job, "attach"):
                    job.attach(shared)
            except BaseException:  # the job's stage fails with it; the worker goes on for the others
                conn.send((job_id, index, "unloadable", "a worker process could not load the function: "
                           + traceback.format_exc(limit=4) + "Define the function at module level in an importable "
                           "module (not in a notebook cell or under `if __name__ == '__main__':`)"))
                holding[2 * w] = -1
                continue
            if len(jobs) >= _JOBS_KEPT:
                jobs.pop(next(iter(jobs)))
            jobs[wanted] = job
        if name not in segments:
            if len(segments) >= _ATTACHED:
                segments.pop(next(iter(segments))).close()
            try:
                segments[name] = attach(name)
            except FileNotFoundError:  # its batch was given up (`BatchesAhead._abandon`) and its segment freed
                conn.send((job_id, index, "gone", name))
                holding[2 * w] = -1
                continue
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
