"""PipelineMonitor: what a training loop sees of its data pipeline, measured from the loop's side.

Wrap any iterator and the monitor records, per batch, the wait inside `next()`, the loop's own
time between batches, the records in the batch and (host-resident pipelines) the batches the
producer had ready. Pass each step's output to `step_done` to measure exposed device idle, split
into data stall and other idle. See docs/monitoring.md for what the numbers mean.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from datarax.core.checks import check_bool, check_int, check_positive_int, is_number
from datarax.monitoring.ledger import INPUT_BOUND_PCT, diagnose, input_remedies, remedies_text, step_ledger
from datarax.monitoring.watcher import ReadyWatcher

Reporter = Callable[[dict], Any]  # or a writer: its write_summary


def _count_records(batch: Any) -> int:
    leaves = jax.tree.leaves(batch)
    shape = getattr(leaves[0], "shape", ()) if leaves else ()
    return int(shape[0]) if len(shape) else 1




class PipelineMonitor:
    """Records per-batch timings of the iterators it wraps and reports them.

    Args:
        window: batches in the rolling window of `summary()["window"]` (>= 2).
        reporters: writers (`datarax.monitoring.writers`: `ConsoleWriter()`, `JsonlWriter(path)`) or
            callables taking the summary dict.
        report_every_batches / report_every_s: when to call the reporters (either, both or neither;
            `report()` calls them on demand).
        sync: block on every batch inside `next()` so its wait includes the data program's device
            time (diagnosis runs only: it removes the overlap with the training step).
        clock: seconds as a float, `time.perf_counter` by default (tests inject a fake clock).

    Example:
        >>> monitor = PipelineMonitor(reporters=[ConsoleWriter()], report_every_s=30)
        >>> for batch in monitor.wrap(pipeline.epochs(None)):  # doctest: +SKIP
        ...     state = train_step(state, batch)
    """

    def __init__(self, *, window: int = 100, reporters: tuple[Reporter, ...] | list[Reporter] = (),
                 report_every_batches: int | None = None, report_every_s: float | None = None, sync: bool = False,
                 clock: Callable[[], float] = time.perf_counter):
        check_int(window, "window", 2, why=" (batches in the rolling window)")
        check_positive_int(report_every_batches, "report_every_batches", allow_none=True)
        if report_every_s is not None and (not is_number(report_every_s) or report_every_s <= 0):
            raise ValueError(f"report_every_s must be a positive number of seconds or None, got {report_every_s!r}")
        reporters = [getattr(r, "write_summary", r) for r in reporters]
        for reporter in reporters:
            if not callable(reporter):
                raise TypeError(f"each reporter must be a writer (with write_summary) or a callable taking the summary "
                                f"dict, got {reporter!r}; e.g. ConsoleWriter() or JsonlWriter('stats.jsonl')")
        check_bool(sync, "sync")
        self.window = window
        self.reporters = reporters
        self.report_every_batches = report_every_batches
        self.report_every_s = report_every_s
        self.sync = sync
        self.clock = clock
        self.began = array("d")      # when each next() was called (time.perf_counter())
        self.waits = array("d")      # seconds inside next(), per batch
        self.gaps = array("d")       # seconds between the previous next() returning and this one starting
        self.records = array("q")    # records per batch
        # Batches ready when next() was called; -1: device-resident (nothing produced ahead), -2: the
        # wrapped iterator does not say (it has no `buffered()` method).
        self.buffered = array("q")
        self.dispatched = array("d")  # when step_done(output) was called for each step
        self.ready = array("d")       # when each step's output was ready (the watcher, in step order)
        self._watcher: ReadyWatcher | None = None
        self.first_call: float | None = None
        self.last_return: float | None = None
        self._last_report_batch = 0
        self._last_report_time: float | None = None

    def wrap(self, iterator: Any) -> MonitoredIterator:
        """An iterator yielding `iterator`'s batches while recording them (state methods pass through)."""
        if not hasattr(iterator, "__next__"):
            if hasattr(iterator, "__iter__"):
                raise TypeError(f"wrap takes an iterator, got {type(iterator).__name__}; pass iter(x) or "
                                "pipeline.epochs(n)")
            raise TypeError(f"wrap takes an iterator of batches, got {type(iterator).__name__}")
        return MonitoredIterator(iterator, self)

    def record_batch(self, began: float, ended: float, batch: Any, ready: int) -> None:
        """Records one `next()` call (what `MonitoredIterator` does for every batch it returns).

        Args:
            began / ended: `time.perf_counter()` when the call started and returned.
            batch: the batch returned (its leading dimension is the record count).
            ready: batches the producer had ready when the call began; -1 device-resident,
                -2 unknown.
        """
        if self.first_call is None:
            self.first_call = began
            self._last_report_time = began
        self.began.append(began)
        self.gaps.append(0.0 if self.last_return is None else max(began - self.last_return, 0.0))
        self.waits.append(ended - began)
        self.records.append(_count_records(batch))
        self.buffered.append(ready)
        self.last_return = ended
        due = (self.report_every_batches is not None
               and len(self.waits) - self._last_report_batch >= self.report_every_batches)
        due = due or (self.report_every_s is not None and ended - self._last_report_time >= self.report_every_s)
        if due and self.reporters:
            self.report()

    def step_done(self, output: Any) -> None:
        """Marks a training step as dispatched; `output` is anything it returned (e.g. the loss).

        Call it right after dispatching each step. A watcher thread waits on `output` and records
        when the device finished, which is what the summary's exposed-idle figures need. Cheap on
        the calling thread: no synchronisation with the device.
        """
        if self._watcher is None:
            self._watcher = ReadyWatcher(self._set_ready, name="datarax-monitor-watcher", clock=self.clock)
        index = len(self.dispatched)
        self.dispatched.append(self.clock())
        self._watcher.submit(index, output)

    def record_step(self, dispatched: float, ready: float) -> None:
        """Records a step timed by the caller (e.g. with a barrier): when it was dispatched and when
        its result was ready, on this monitor's clock. Use either this or `step_done`, not both."""
        if ready < dispatched:
            raise ValueError(f"ready must not be before dispatched, got dispatched={dispatched!r}, ready={ready!r}")
        self.dispatched.append(dispatched)
        self.ready.append(ready)

    def _set_ready(self, index: int, now: float) -> None:
        self.ready.append(now)  # the watcher waits on steps in submission order

    def close(self) -> None:
        """Waits for the watched steps to finish and stops the watcher thread (idempotent)."""
        if self._watcher is not None:
            self._watcher.close()

    def report(self) -> dict:
        """Calls every reporter with the current summary and returns it."""
        summary = self.summary()
        self._last_report_batch = len(self.waits)
        self._last_report_time = self.clock()
        for reporter in self.reporters:
            reporter(summary)
        return summary

    def summary(self) -> dict:
        """Totals since the first batch, `steady` figures (all batches after the first) and a window."""
        n = len(self.waits)
        out: dict[str, Any] = {"batches": n, "records": int(sum(self.records)), "sync": self.sync}
        if n == 0:
            out["diagnosis"] = "no batches yet"
            return out
        out["first_batch_s"] = self.waits[0]
        out["wall_s"] = self.last_return - self.first_call
        out["steady"] = self._span(1, n)
        out["window"] = self._span(max(1, n - self.window), n)
        device = self._device()
        if device is not None:
            out["device"] = device
        out["diagnosis"] = self._diagnosis(out["steady"], device)
        return out

    def _device(self) -> dict | None:
        """Exposed device idle between watched steps 1.. (step 0 includes compiling the step).

        For step i the device is idle from step i-1's result being ready until step i is
        dispatched, when that comes later; the part of it the loop spent inside `next()` is a
        data stall, the rest is other host work (logging, checkpoints, Python).
        """
        done = len(self.ready)
        if done < 3:
            return None
        ready = np.frombuffer(self.ready, np.float64)[:done]
        dispatched = np.frombuffer(self.dispatched, np.float64)[:done]
        ledger = step_ledger(dispatched, ready, np.frombuffer(self.began, np.float64),
                             np.frombuffer(self.waits, np.float64))
        idle, data = float(ledger["idle_s"].sum()), float(ledger["stall_s"].sum())
        wall = float(ready[-1] - ready[0])
        busy = np.maximum(ledger["busy_s"][1:], 0.0)
        pct = (lambda x: 100.0 * x / wall) if wall > 0 else (lambda x: 0.0)
        return {"steps": done, "wall_s": wall, "exposed_idle_pct": pct(idle), "data_stall_pct": pct(data),
                "other_idle_pct": pct(idle - data), "step_ms_mean": 1e3 * float(busy.mean())}

    def _span(self, start: int, stop: int) -> dict:
        """Figures over batches [start, stop): the first batch (build + compile) stays out."""
        waits = np.frombuffer(self.waits, np.float64)[start:stop]
        gaps = np.frombuffer(self.gaps, np.float64)[start:stop]
        if waits.size == 0:
            return {"batches": 0}
        records = int(np.frombuffer(self.records, np.int64)[start:stop].sum())
        wall = float(waits.sum() + gaps.sum())
        span = {"batches": int(waits.size), "records": records, "wall_s": wall,
                "records_per_s": records / wall if wall > 0 else float("inf"),
                "wait_pct": 100.0 * float(waits.sum()) / wall if wall > 0 else 0.0,
                "wait_ms": {name: 1e3 * float(np.percentile(waits, q))
                            for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))},
                "consumer_ms_mean": 1e3 * float(gaps.mean())}
        buffered = np.frombuffer(self.buffered, np.int64)[start:stop]
        if np.all(buffered >= 0):
            span["buffered_mean"] = float(buffered.mean())
            span["empty_buffer_pct"] = 100.0 * float(np.mean(buffered == 0))
        span["data"] = "host" if np.all(buffered >= 0) else "device" if np.all(buffered == -1) else "unknown"
        return span

    def _diagnosis(self, steady: dict, device: dict | None) -> str:
        if steady.get("batches", 0) == 0:
            return "one batch so far: its time is the pipeline's build and compile (first_batch_s)"
        wait = steady["wait_pct"]
        waited = f"the loop spent {wait:.1f}% of its time in next() (p50 {steady['wait_ms']['p50']:.2f} ms per batch)"
        if device is not None:
            span = (f"of the {device['wall_s']:.2f} s from the first watched step's result to the last "
                    f"({device['steps']} steps)")
            return diagnose(stall_pct=device["data_stall_pct"], idle_pct=device["exposed_idle_pct"],
                            step_s=device["step_ms_mean"] / 1e3, host_next_pct=wait, span=span,
                            input_detail=f"{waited}" + self._stall_cause(steady))
        host = steady["data"] == "host"
        if wait < INPUT_BOUND_PCT:
            return (f"consumer-bound: {waited}, so the pipeline keeps up, delivering "
                    f"{steady['records_per_s']:,.0f} records/s to a loop that takes "
                    f"{steady['consumer_ms_mean']:.2f} ms per batch")
        if host and steady["empty_buffer_pct"] >= 50.0:
            return ("input-bound: the background producer had no batch ready on "
                    f"{steady['empty_buffer_pct']:.0f}% of calls and {waited}; reading and host work are the "
                    f"bottleneck; {remedies_text(input_remedies())} (call monitor.step_done(output) after each step "
                    "to measure the device idle this causes)")
        if host:
            lead = (f"undetermined: no data stall from the producer (batches ready on "
                    f"{100 - steady['empty_buffer_pct']:.0f}% of calls), but {waited}, in the stages' program "
                    "launched from next()")
        elif steady["data"] == "device":
            lead = f"undetermined: device-resident data, next() only dispatches the data program, and {waited}"
        else:
            lead = f"undetermined: {waited}, inside the wrapped iterator"
        return (lead + "; under asynchronous dispatch that time can overlap device work, so it is not by itself a "
                "stall: call monitor.step_done(output) after each step to measure exposed device idle")

    def _stall_cause(self, steady: dict) -> str:
        if steady["data"] != "host":
            return ""
        if steady["empty_buffer_pct"] >= 50.0:
            return (f"; the background producer had no batch ready on {steady['empty_buffer_pct']:.0f}% of calls; "
                    + remedies_text(input_remedies()))
        return "; batches were ready, so the stages' compiled program is what the device waits for: cheaper stages"


class MonitoredIterator(Iterator[Any]):
    """An iterator wrapped by `PipelineMonitor.wrap`; `get_state`, `set_state`, `close`, `save`, `load`
    and every other attribute are the wrapped iterator's, so it checkpoints and resumes like it."""

    def __init__(self, iterator: Any, monitor: PipelineMonitor):
        self._iterator = iterator
        self.monitor = monitor

    def __next__(self) -> Any:
        buffered = getattr(self._iterator, "buffered", None)
        ready = -2 if not callable(buffered) else buffered()
        ready = -1 if ready is None else ready
        clock = self.monitor.clock
        began = clock()
        batch = next(self._iterator)
        if self.monitor.sync:
            jax.block_until_ready(batch)
        self.monitor.record_batch(began, clock(), batch, ready)
        return batch

    def __iter__(self) -> MonitoredIterator:
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterator, name)

    def __enter__(self) -> MonitoredIterator:
        return self

    def __exit__(self, *exc) -> None:
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()


def format_summary(summary: dict) -> str:
    """One line for a console: batches, delivered rate, wait share and percentiles, diagnosis."""
    if summary.get("batches", 0) == 0:
        return "datarax monitor: no batches yet"
    steady = summary["steady"]
    if steady.get("batches", 0) == 0:
        return f"datarax monitor: first batch {summary['first_batch_s']:.2f} s (build + compile)"
    window = summary["window"]
    parts = [f"datarax monitor: {summary['batches']} batches",
             f"{window['records_per_s']:,.0f} records/s (last {window['batches']})",
             f"waited in next() {window['wait_pct']:.1f}% (p50 {window['wait_ms']['p50']:.2f} ms, "
             f"p99 {window['wait_ms']['p99']:.2f} ms)"]
    if "buffered_mean" in window:
        parts.append(f"{window['buffered_mean']:.1f} batches ready on average")
    if "device" in summary:
        device = summary["device"]
        parts.append(f"device idle {device['exposed_idle_pct']:.1f}% (data {device['data_stall_pct']:.1f}%)")
    return " | ".join(parts) + "\n  " + summary["diagnosis"]
