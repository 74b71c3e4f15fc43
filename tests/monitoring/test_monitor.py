"""PipelineMonitor: injected stalls are measured, diagnoses follow them, state passes through."""

from __future__ import annotations

import io
import json
import time

import jax
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.core.element import Element
from datarax.monitoring import ConsoleWriter, JsonlWriter, PipelineMonitor, format_summary
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.sources import MemorySource, MemorySourceConfig


class FakeClock:
    """Time that passes only when the code under test 'sleeps': every figure is exact, at any load."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def slow_batches(count: int, produce_s: float, size: int = 4, clock: FakeClock | None = None):
    for i in range(count):
        if clock is not None:
            clock.sleep(produce_s)
        yield {"x": np.full((size, 2), i, np.float32)}


def consume(iterator, consume_s: float, clock: FakeClock | None = None) -> list:
    out = []
    for batch in iterator:
        out.append(batch)
        if clock is not None:
            clock.sleep(consume_s)
        elif consume_s:
            time.sleep(consume_s)
    return out


class FakeHostIterator:
    """Says how many batches its producer has ready, and takes `wait_s` in next()."""

    def __init__(self, count, wait_s, ready, clock):
        self.inner, self.wait_s, self.ready, self.clock = slow_batches(count, 0.0), wait_s, ready, clock

    def buffered(self):
        return self.ready

    def __next__(self):
        self.clock.sleep(self.wait_s)
        return next(self.inner)


def train(monitor, iterator, clock, *, step_s=0.0, host_s=0.0):
    """A loop on a fake accelerator: each dispatched step runs `step_s` after the previous one
    finished (dispatch returns at once), timed with `record_step`; `host_s` of other host work."""
    free_at = -np.inf
    for _ in iterator:
        dispatched = clock()
        free_at = max(dispatched, free_at) + step_s
        monitor.record_step(dispatched, free_at)
        clock.sleep(host_s)


def test_a_slow_producer_is_an_input_stall_of_the_injected_size():
    clock = FakeClock()
    monitor = PipelineMonitor(clock=clock)
    consume(monitor.wrap(slow_batches(12, 0.03, clock=clock)), 0.0, clock)
    summary = monitor.summary()
    steady = summary["steady"]
    assert summary["batches"] == 12 and summary["records"] == 48 and steady["batches"] == 11
    assert steady["wait_ms"]["p50"] == pytest.approx(30.0) and steady["wait_pct"] == pytest.approx(100.0)
    # Without step timings the monitor does not call time in next() a stall.
    assert summary["diagnosis"].startswith("undetermined") and "monitor.step_done(output)" in summary["diagnosis"]
    assert summary["steady"]["data"] == "unknown" and "buffered_mean" not in summary["steady"]
    # The figures are the recorded waits, summarised: check them against numpy on the raw data.
    waits = np.asarray(monitor.waits[1:])
    assert steady["wait_ms"]["p90"] == pytest.approx(1e3 * np.percentile(waits, 90))
    assert steady["records_per_s"] == pytest.approx(44 / (waits.sum() + np.sum(monitor.gaps[1:])))


def test_with_step_timings_a_slow_producer_is_an_exposed_data_stall():
    """30 ms per batch from the producer, 2 ms steps: the device waits 28 of every 30 ms for data."""
    clock = FakeClock()
    monitor = PipelineMonitor(clock=clock)
    train(monitor, monitor.wrap(slow_batches(12, 0.03, clock=clock)), clock, step_s=0.002)
    summary = monitor.summary()
    device = summary["device"]
    assert device["steps"] == 12
    assert device["data_stall_pct"] == pytest.approx(100 * 28 / 30) and device["other_idle_pct"] == pytest.approx(0)
    assert device["exposed_idle_pct"] == pytest.approx(device["data_stall_pct"] + device["other_idle_pct"])
    assert summary["diagnosis"].startswith("input-bound: the device was idle waiting for data 93% of the 0.33 s from "
                                           "the first watched step's result to the last (12 steps)")


def test_time_in_next_that_overlaps_device_work_is_not_a_stall():
    """The trap: the host waits 20 ms in every next() while the device is still busy with 40 ms steps."""
    clock = FakeClock()
    monitor = PipelineMonitor(clock=clock)
    train(monitor, monitor.wrap(FakeHostIterator(12, 0.02, 2, clock)), clock, step_s=0.04)
    summary = monitor.summary()
    assert summary["steady"]["wait_pct"] == pytest.approx(100.0)
    assert summary["device"]["exposed_idle_pct"] == pytest.approx(0.0)
    assert summary["diagnosis"].startswith("compute-bound")
    assert summary["device"]["step_ms_mean"] == pytest.approx(40.0)


def test_host_work_between_steps_is_host_bound():
    clock = FakeClock()
    monitor = PipelineMonitor(clock=clock)
    train(monitor, monitor.wrap(slow_batches(12, 0.0, clock=clock)), clock, step_s=0.002, host_s=0.03)
    summary = monitor.summary()
    assert summary["device"]["other_idle_pct"] == pytest.approx(100 * 28 / 30)
    assert summary["device"]["data_stall_pct"] == pytest.approx(0.0)
    assert summary["diagnosis"].startswith("host-bound")
    assert "device idle" in format_summary(summary)


def test_step_done_times_steps_with_the_watcher_thread():
    """The real path: a watcher thread waits on each step's output (here already computed)."""
    monitor = PipelineMonitor()
    for batch in monitor.wrap(slow_batches(5, 0.0)):
        monitor.step_done(jax.numpy.asarray(batch["x"]).sum())
    monitor.close()
    assert len(monitor.ready) == len(monitor.dispatched) == 5
    assert np.all(np.asarray(monitor.ready) >= np.asarray(monitor.dispatched))
    assert monitor.summary()["device"]["steps"] == 5


@pytest.mark.parametrize("ready, says", [(0, "input-bound: the background producer had no batch ready on 100%"),
                                         (2, "undetermined: no data stall from the producer (batches ready on 100%"),
                                         (None, "undetermined: device-resident data, next() only dispatches")])
def test_the_diagnosis_of_a_stall_says_where_the_wait_comes_from(ready, says):
    clock = FakeClock()
    monitor = PipelineMonitor(clock=clock)
    consume(monitor.wrap(FakeHostIterator(6, 0.02, ready, clock)), 0.0, clock)
    summary = monitor.summary()
    assert summary["steady"]["data"] == {0: "host", 2: "host", None: "device"}[ready]
    assert summary["diagnosis"].startswith(says)
    if ready is not None:
        assert summary["steady"]["buffered_mean"] == ready


def test_a_slow_consumer_with_a_fast_producer_is_consumer_bound():
    clock = FakeClock()
    monitor = PipelineMonitor(clock=clock)
    consume(monitor.wrap(slow_batches(12, 0.0, clock=clock)), 0.03, clock)
    steady = monitor.summary()["steady"]
    assert steady["wait_pct"] == pytest.approx(0.0)
    assert steady["consumer_ms_mean"] == pytest.approx(30.0)
    assert monitor.summary()["diagnosis"].startswith("consumer-bound")


def host_pipeline(n=64, batch_size=8, resident=False, seed=0):
    data = {"x": np.arange(n * 3, dtype=np.float32).reshape(n, 3), "id": np.arange(n, dtype=np.int32)}
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed, device_resident=resident), data=data)
    op = ElementOperator(ElementOperatorConfig(stochastic=True),
                         fn=lambda el, key: el.update_data({"x": el.data["x"] + jax.random.uniform(key)}),
                         rngs=nnx.Rngs(seed))
    return Pipeline(source, [op], batch_size=batch_size)


@pytest.mark.parametrize("resident", [False, True], ids=["host", "device"])
def test_a_wrapped_pipeline_iterator_resumes_exactly_and_reports_its_buffer(resident):
    monitor = PipelineMonitor()
    it = monitor.wrap(host_pipeline(resident=resident).epochs(2))
    for _ in range(5):
        next(it)
    state = it.get_state()
    rest = [np.asarray(b["id"]) for b in it]
    fresh = PipelineMonitor().wrap(host_pipeline(resident=resident).epochs(2))
    fresh.set_state(state)
    np.testing.assert_array_equal(np.concatenate([np.asarray(b["id"]) for b in fresh]), np.concatenate(rest))
    steady = monitor.summary()["steady"]
    assert steady["records"] == 2 * 64 - 8
    if resident:  # nothing is produced ahead: the buffer figures do not apply
        assert "buffered_mean" not in steady
    else:
        assert 0.0 <= steady["buffered_mean"] <= host_pipeline().prefetch
        assert 0.0 <= steady["empty_buffer_pct"] <= 100.0


def test_the_buffer_count_shows_a_producer_that_is_ahead():
    """A consumer slower than the host producer finds batches ready: each call after the first waits
    until the producer has one (an event, not a guessed sleep), and the monitor counts them."""
    pipeline = host_pipeline(n=96)
    monitor = PipelineMonitor()
    it = iter(pipeline)
    wrapped = monitor.wrap(it)
    for i in range(len(pipeline)):
        for _ in range(6000):  # a 60 s hang guard
            if i == 0 or it.buffered() >= 1:
                break
            time.sleep(0.01)
        next(wrapped)
    steady = monitor.summary()["steady"]
    assert steady["batches"] == len(pipeline) - 1
    assert steady["buffered_mean"] >= 1.0 and steady["empty_buffer_pct"] == 0.0


def test_sync_mode_blocks_on_every_batch():
    monitor = PipelineMonitor(sync=True)
    batches = consume(monitor.wrap(iter(host_pipeline(resident=True))), 0.0)
    assert len(batches) == 8 and monitor.summary()["sync"] is True


def test_reporters_run_on_schedule_and_write_what_summary_says(tmp_path):
    path = tmp_path / "logs" / "monitor.jsonl"
    stream = io.StringIO()
    monitor = PipelineMonitor(reporters=[JsonlWriter(path), ConsoleWriter(stream)], report_every_batches=4,
                              window=3)
    consume(monitor.wrap(slow_batches(10, 0.0)), 0.0)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["batches"] for line in lines] == [4, 8]
    assert lines[-1]["window"]["batches"] == 3 and lines[-1]["steady"]["batches"] == 7
    assert stream.getvalue().count("datarax monitor: ") == 2
    final = monitor.report()
    assert final["batches"] == 10 and len(path.read_text().splitlines()) == 3
    assert format_summary(final).splitlines()[0] in stream.getvalue().splitlines()[-2]


def test_time_based_reports():
    clock = FakeClock()
    seen = []
    monitor = PipelineMonitor(reporters=[seen.append], report_every_s=0.05, clock=clock)
    consume(monitor.wrap(slow_batches(8, 0.02, clock=clock)), 0.0, clock)
    walls = [summary["wall_s"] for summary in seen]
    # 20 ms batches from t = 0: a report once 50 ms have passed since the last one (at 60 and 120 ms).
    assert [summary["batches"] for summary in seen] == [3, 6]
    assert walls == pytest.approx([0.06, 0.12])


def test_summaries_before_and_after_the_first_batch():
    monitor = PipelineMonitor()
    assert monitor.summary() == {"batches": 0, "records": 0, "sync": False, "diagnosis": "no batches yet"}
    assert format_summary(monitor.summary()) == "datarax monitor: no batches yet"
    it = monitor.wrap(slow_batches(3, 0.0))
    next(it)
    summary = monitor.summary()
    assert summary["steady"] == {"batches": 0} and "build and compile" in summary["diagnosis"]
    assert format_summary(summary).startswith("datarax monitor: first batch")


def test_batches_that_are_not_dicts_count_their_leading_axis():
    monitor = PipelineMonitor()
    list(monitor.wrap(iter([np.zeros((5, 2)), (np.zeros(3), np.zeros(3)), Element({"a": np.zeros((2, 1))}, {})])))
    assert list(monitor.records) == [5, 3, 2]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"window": 1}, ValueError, r"window must be an int >= 2 \(batches in the rolling window\), got 1"),
    ({"report_every_batches": 0}, ValueError, r"report_every_batches must be a positive int or None, got 0"),
    ({"report_every_batches": 2.5}, ValueError, r"report_every_batches must be a positive int or None, got 2.5"),
    ({"report_every_s": -1}, ValueError, r"report_every_s must be a positive number of seconds or None, got -1"),
    ({"reporters": ["stats.jsonl"]}, TypeError, r"each reporter must be a writer .* got 'stats.jsonl'; e.g. "
                                                r"ConsoleWriter\(\)"),
    ({"sync": 1}, TypeError, r"sync must be True or False, got 1"),
])
def test_argument_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        PipelineMonitor(**kwargs)


def test_wrap_and_reporter_errors(tmp_path):
    with pytest.raises(TypeError, match=r"wrap takes an iterator, got Pipeline; pass iter\(x\) or pipeline.epochs"):
        PipelineMonitor().wrap(host_pipeline())
    with pytest.raises(TypeError, match=r"wrap takes an iterator of batches, got int"):
        PipelineMonitor().wrap(3)
    with pytest.raises(IsADirectoryError, match=r"is a directory; pass a file path"):
        JsonlWriter(tmp_path)


def test_the_monitor_example_names_the_slow_source(capsys):
    import runpy
    from pathlib import Path

    runpy.run_path(str(Path(__file__).parents[2] / "examples" / "monitor.py"), run_name="__main__")
    out = capsys.readouterr().out
    slow = out[out.index("slow source:"):]
    assert "input-bound: the device was idle" in slow and "no batch ready" in slow
