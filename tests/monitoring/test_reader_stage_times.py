"""The background reader's time per part: a fake clock, an injected slow host stage, and the advice it leads to."""

from __future__ import annotations

import threading

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.host.stage import HostStage, HostStageSource
from datarax.monitoring.ledger import REMEDIES, REMEDY_ORDER, input_remedies
from datarax.monitoring.stages import StageTimes, describe_reader, reader_breakdown, since
from datarax.sources import MemorySource
from datarax.train import Trainer
from datarax.train.callbacks import GoodputMonitor
from datarax.train.metrics.goodput import diagnose


class FakeClock:
    """Seconds that move only when told to (thread-safe: the reader thread advances it)."""

    def __init__(self):
        self.now, self._lock = 0.0, threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class Costly(HostStage):
    """A sleep-free host stage whose cost per batch is injected into a fake clock; it doubles `x`."""

    def __init__(self, clock: FakeClock, cost: float, work: str = "other"):
        self.clock, self.cost, self.work = clock, cost, work

    def output_spec(self, input_spec):
        return dict(input_spec)

    def __call__(self, batch, ctx):
        self.clock.advance(self.cost)
        return {**batch, "x": batch["x"] * 2}

    def label(self):
        return f"Costly({self.cost})"


def test_stage_times_on_a_fake_clock():
    clock = FakeClock()
    times = StageTimes(clock)
    for _ in range(3):
        with times.measure("source read", records=8, work="read"):
            clock.advance(0.01)
        times.add("decode", 0.1, records=8, work="image_decode")
    before = times.snapshot()
    with times.measure("source read", records=4, work="read"):
        clock.advance(0.02)
    assert before == [{"name": "source read", "work": "read", "seconds": pytest.approx(0.03), "calls": 3,
                       "records": 24},
                      {"name": "decode", "work": "image_decode", "seconds": pytest.approx(0.3), "calls": 3,
                       "records": 24}]
    assert since(times.snapshot(), before) == [{"name": "source read", "work": "read", "seconds": pytest.approx(0.02),
                                                "calls": 1, "records": 4}]
    breakdown = reader_breakdown(before)
    assert breakdown["slowest"] == "decode" and breakdown["slowest_work"] == "image_decode"
    assert [p["pct"] for p in breakdown["parts"]] == pytest.approx([100 * 0.03 / 0.33, 100 * 0.3 / 0.33])
    assert describe_reader(breakdown) == ("the background reader's slowest part is decode: 91% of its 0.33 s measured "
                                          "(100.0 ms per batch); source read 9%")
    with pytest.raises(ValueError, match=r"work must be one of .*got 'gpu'"):
        times.add("x", 1.0, work="gpu")


def slow_stage_pipeline(clock: FakeClock) -> Pipeline:
    data = {"x": np.arange(64, dtype=np.float32).reshape(16, 4), "y": np.arange(16, dtype=np.int32) % 3}
    source = HostStageSource(MemorySource(shuffle=True, device_resident=False, data=data),
                             [Costly(clock, 0.002), Costly(clock, 0.25, work="python")], clock=clock)
    pipeline = Pipeline(source, batch_size=4, prefetch=1)
    pipeline.reader_times = StageTimes(clock)  # the copy to the device costs nothing on the fake clock
    return pipeline


def test_an_injected_slow_host_stage_is_named_by_the_reader_timings():
    clock = FakeClock()
    pipeline = slow_stage_pipeline(clock)
    batches = list(pipeline)
    np.testing.assert_array_equal(np.sort(np.concatenate([np.asarray(b["x"]) for b in batches]).ravel()),
                                  np.arange(64) * 4)  # both stages ran on every record
    parts = {p["name"]: p for p in pipeline.reader_timings()}
    assert list(parts) == ["source read", "Costly(0.002)", "Costly(0.25)", "copy to device"]
    assert parts["Costly(0.25)"]["seconds"] == pytest.approx(0.25 * 4) and parts["Costly(0.25)"]["calls"] == 4
    assert parts["Costly(0.002)"]["seconds"] == pytest.approx(0.002 * 4)
    assert parts["source read"]["seconds"] == 0.0 and parts["copy to device"]["seconds"] == 0.0
    assert parts["Costly(0.25)"]["work"] == "python"


def test_the_goodput_report_attributes_the_reader_time_of_its_own_run(tmp_path):
    clock = FakeClock()
    pipeline = slow_stage_pipeline(clock)
    list(pipeline)  # reads before the run are not the run's
    monitor = GoodputMonitor(tmp_path, plot=False, verbose=False)
    trainer = Trainer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), pipeline,
                      lambda model, batch: optax.softmax_cross_entropy_with_integer_labels(
                          model(batch["x"]), batch["y"]).mean(), callbacks=[monitor], compilation_cache=False)
    trainer.fit(num_steps=6)
    reader = monitor.report["reader"]
    calls = {p["name"]: p["calls"] for p in reader["parts"]}
    assert reader["slowest"] == "Costly(0.25)" and reader["slowest_work"] == "python"
    assert calls["Costly(0.25)"] >= 6  # the run's batches, and any it read ahead
    slow = next(p for p in reader["parts"] if p["name"] == "Costly(0.25)")
    assert slow["seconds"] == pytest.approx(0.25 * slow["calls"])
    assert slow["pct"] == pytest.approx(100 * 0.25 / 0.252)


STEADY = {"data_stall_pct": 60.0, "exposed_idle_pct": 62.0, "host_next_pct": 70.0, "step_time_s": 0.004,
          "step_consumes_el_s": 2000.0, "pipeline_delivers_el_s": 800.0, "checkpoint_idle_pct": 0.0,
          "eval_idle_pct": 0.0, "compile_idle_pct": 0.0, "loop_idle_pct": 2.0, "span_s": 5.0,
          "first_step": 2, "last_step": 500}


@pytest.mark.parametrize("work, first", [
    ("image_decode", "decode_once"), ("read", "threads"), ("python", "threads"), ("copy", "device_resident"),
    (None, "decode_once"),
])
def test_an_input_bound_verdict_names_the_slowest_part_and_the_remedies_in_order(work, first):
    parts = [{"name": "source read", "work": "read", "seconds": 1.0, "calls": 100, "records": 800},
             {"name": "Slow", "work": work or "other", "seconds": 9.0, "calls": 100, "records": 800}]
    reader = reader_breakdown(parts) if work else None
    text = diagnose(STEADY, {"goodput": 2.0, "data_stall": 3.0, "other": 0.5}, 6.0, reader=reader)
    assert text.startswith("input-bound: the device was idle waiting for data 60% of the 5.00 s of steady training")
    if work:
        assert "the background reader's slowest part is Slow: 90% of its 10.00 s measured (90.0 ms per batch)" in text
    remedies = input_remedies(work)
    assert remedies[0] == REMEDIES[first] and len(remedies) == len(REMEDY_ORDER.get(work, REMEDY_ORDER[None]))
    assert "remedies, in order: " + "; ".join(f"{i}) {r}" for i, r in enumerate(remedies, 1)) in text


def test_the_pipeline_monitor_gives_the_same_remedies():
    """One list of remedies: PipelineMonitor's input-bound advice is the shared one."""
    from datarax.monitoring import PipelineMonitor

    monitor = PipelineMonitor()
    batch = {"x": np.zeros((4, 2), np.float32)}
    for i in range(10):  # the producer never had a batch ready, and the loop waited 90% of the time
        monitor.record_batch(float(i), i + 0.9, batch, 0)
    text = monitor.summary()["diagnosis"]
    assert text.startswith("input-bound: the background producer had no batch ready on 100% of calls")
    assert ("remedies, in order: " + "; ".join(f"{i}) {r}" for i, r in enumerate(input_remedies(), 1))) in text


def test_stage_times_copy_and_pickle_with_their_totals():
    import copy
    import pickle

    times = StageTimes()
    times.add("a", 1.5, records=2)
    for clone in (copy.deepcopy(times), pickle.loads(pickle.dumps(times))):
        assert clone.snapshot() == times.snapshot()
        clone.add("a", 1.0)
        assert times.snapshot()[0]["seconds"] == 1.5


def test_a_device_resident_pipeline_has_no_reader_parts():
    pipeline = Pipeline(MemorySource(device_resident=True, data={"x": np.zeros((8, 2), np.float32)}), batch_size=4)
    jax.block_until_ready(list(pipeline))
    assert pipeline.reader_timings() == []
