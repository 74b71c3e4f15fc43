"""Goodput accounting: hand-computed arithmetic, and real runs with an injected slow or fast input."""

from __future__ import annotations

import importlib.util
import json
import time

import numpy as np
import optax
import pytest
from flax import nnx
from trainer_helpers import loss_fn, points

from datarax import Pipeline
from datarax.samplers.base import Sampler
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer
from datarax.train.callbacks import GoodputMonitor
from datarax.train.goodput import GoodputLedger, diagnose

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def test_ledger_arithmetic_matches_a_hand_computation():
    """Three steps on a made-up timeline; every bucket below is worked out by hand."""
    ledger = GoodputLedger(window=2)
    ledger.start(0.0)
    # step 1: first batch 0-1.0, compile 1.1-1.6, result ready at 2.0
    ledger.set_ready(ledger.add_step(1, 8, 0.0, 1.0, 1.6, 0.5), 2.0)
    # step 2: waits in next() 1.7-2.5, dispatched 2.6 -> device idle 2.0-2.6, of which 0.5 waiting for data
    ledger.set_ready(ledger.add_step(2, 8, 1.7, 2.5, 2.6, 0.0), 3.0)
    # step 3: dispatched at 2.85 while step 2 still runs -> no idle; busy 3.0-3.5
    ledger.set_ready(ledger.add_step(3, 4, 2.7, 2.8, 2.85, 0.0), 3.5)
    ledger.add_interval("checkpoint_save", 2.52, 2.58)  # inside step 2's idle, after next() returned
    ledger.add_interval("checkpoint_save", 3.6, 4.0)
    ledger.finish(4.2)
    s = ledger.summary()
    expected = {"goodput": 0.4 + 0.4 + 0.5, "data_stall": 0.5, "first_batch": 1.0, "compile": 0.5,
                "checkpoint_save": 0.06 + 0.4, "checkpoint_restore": 0.0, "eval": 0.0,
                "other": 0.1 + 0.04 + 0.3}  # start-up, step 2's idle outside next() and the save, tail
    assert s["wall_s"] == pytest.approx(4.2)
    for name, value in expected.items():
        assert s["buckets_s"][name] == pytest.approx(value, abs=1e-9), name
    assert sum(s["buckets_pct"].values()) == pytest.approx(100.0)
    np.testing.assert_allclose(s["per_step"]["exposed_idle_s"], [0.0, 0.6, 0.0], atol=1e-9)
    np.testing.assert_allclose(s["per_step"]["data_stall_s"], [0.0, 0.5, 0.0], atol=1e-9)
    np.testing.assert_allclose(s["per_step"]["step_time_s"], [0.4, 0.4, 0.5], atol=1e-9)
    steady = s["steady"]  # steps 2 and 3: from 2.0 to 3.5
    assert steady["span_s"] == pytest.approx(1.5)
    assert steady["data_stall_pct"] == pytest.approx(100 * 0.5 / 1.5)
    assert steady["exposed_idle_pct"] == pytest.approx(100 * 0.6 / 1.5)
    assert steady["host_next_pct"] == pytest.approx(100 * 0.9 / 1.5)
    assert steady["checkpoint_idle_pct"] == pytest.approx(100 * 0.06 / 1.5)  # the tail save is not steady
    assert steady["loop_idle_pct"] == pytest.approx(100 * 0.04 / 1.5)
    assert steady["step_consumes_el_s"] == pytest.approx(12 / 0.9)
    assert steady["pipeline_delivers_el_s"] == pytest.approx(12 / 1.4)
    assert s["window"]["steps"] == 2
    # Each sentence names its denominator: the headline the whole wall, the verdict the steady steps.
    assert s["headline"] == ("goodput 31.0% of the run's 4.2 s wall time (3 steps; device busy with training steps); "
                             "badput: first batch 23.8%, data stall 11.9%, compile 11.9%, checkpoint saves 11.0%, "
                             "other 10.5%")
    assert s["diagnosis"].startswith("input-bound: the device was idle waiting for data 33% of the 1.50 s of steady "
                                     "training (steps 2-3, timed from step 1's result; 36% of the run's 4.20 s wall "
                                     "time); the pipeline delivers 9 el/s, the step consumes 13 el/s; remedies, in "
                                     "order: 1) decode once: `datarax materialize")
    assert "largest other badput: first batch 24% of the run's wall time" in s["diagnosis"]
    assert s["compiles"] == [{"step": 1, "seconds": 0.5, "batch_size": 8, "cause": "the first step"}]
    assert "recompiles" not in s["diagnosis"]  # the first step's compile is expected, not a recompile


def test_steps_still_in_flight_are_left_out():
    ledger = GoodputLedger()
    ledger.start(0.0)
    ledger.set_ready(ledger.add_step(1, 8, 0.0, 0.1, 0.2, 0.0), 0.3)
    ledger.add_step(2, 8, 0.3, 0.4, 0.5, 0.0)  # not ready yet
    assert ledger.summary()["steps"] == 1


SPAN = "of the 8.00 s of steady training (steps 2-41, timed from step 1's result; 80% of the run's 10.00 s wall time)"
DIAGNOSIS_CASES = [
    # (data stall %, exposed idle %, host in next() %, expected start)
    (37.0, 40.0, 50.0, f"input-bound: the device was idle waiting for data 37% {SPAN}; the pipeline "
                       "delivers 2,100 el/s, the step consumes 3,400 el/s; remedies, in order: 1) decode once"),
    (12.0, 60.0, 15.0, f"host-bound: the device was idle between steps 48% {SPAN} while the host did other "
                       "work (checkpoint saves 30%, loop overhead (callbacks, logging, dispatch) 18%), and waited "
                       "for data 12%; the step takes 2.50 ms"),
    (0.4, 3.0, 60.0, f"compute-bound: exposed data stall 0.4% {SPAN}; the step consumes 3,400 el/s and the pipeline "
                     "keeps up (the host waited in next() 60% of that time, overlapped with device work"),
    (4.0, 9.0, 5.0, f"compute-bound: exposed data stall 4.0% {SPAN}; the step consumes 3,400 el/s and the pipeline "
                    "keeps up"),
]


@pytest.mark.parametrize("stall, idle, host, expected", DIAGNOSIS_CASES)
def test_diagnosis_table(stall, idle, host, expected):
    steady = {"data_stall_pct": stall, "exposed_idle_pct": idle, "host_next_pct": host, "step_time_s": 0.0025,
              "step_consumes_el_s": 3400.0, "pipeline_delivers_el_s": 2100.0, "checkpoint_idle_pct": 30.0,
              "eval_idle_pct": 0.0, "compile_idle_pct": 0.0, "loop_idle_pct": idle - stall - 30.0,
              "span_s": 8.0, "first_step": 2, "last_step": 41}
    text = diagnose(steady, {"goodput": 9.0, "data_stall": 0.0, "compile": 0.5, "other": 0.5}, 10.0)
    assert text.startswith(expected)
    assert "largest other badput" not in text
    assert diagnose(steady, {"goodput": 5.0, "compile": 3.0}, 10.0).endswith(
        "largest other badput: compile 30% of the run's wall time")


def test_ledger_arguments_are_validated():
    with pytest.raises(ValueError, match=r"window must be an int >= 2 .*got 1"):
        GoodputLedger(window=1)
    with pytest.raises(ValueError, match=r"interval kind must be one of .*got 'nap'"):
        GoodputLedger().add_interval("nap", 0.0, 1.0)


class SlowSource(MemorySource):
    """A host-resident source whose batch reads sleep (on the prefetch thread); it notes when each ends."""

    def __init__(self, data, delay_s):
        super().__init__(MemorySourceConfig(shuffle=True, seed=1, device_resident=False), data=data)
        self.delay_s = delay_s
        self.finished_at = []

    def get_batch(self, indices, out=None):
        time.sleep(self.delay_s)
        out = super().get_batch(indices, out)
        self.finished_at.append(time.perf_counter())
        return out


class SlowSampler(Sampler):
    """A host-only sampler that sleeps inside next() on the main thread, while the device computes."""

    def __init__(self, num_records, delay_s):
        self.num_records = num_records
        self.delay_s = delay_s

    def __len__(self):
        return self.num_records

    def indices(self, positions, epoch):
        time.sleep(self.delay_s)
        return np.asarray(positions, np.int64)


class DeepMLP(nnx.Module):
    """Enough arithmetic per step (tens of ms on CPU) to keep the device busy while the host waits."""

    def __init__(self, width=384, depth=6):
        rngs = nnx.Rngs(0)
        self.inp = nnx.Linear(4, width, rngs=rngs)
        self.hidden = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])
        self.out = nnx.Linear(width, 3, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.inp(x))
        for layer in self.hidden:
            x = nnx.tanh(layer(x))
        return self.out(x)


def test_slow_host_pipeline_reports_the_injected_idle(tmp_path):
    source = SlowSource(points(256), delay_s=0.08)
    pipeline = Pipeline(source, batch_size=8, drop_remainder=True, prefetch=2)
    monitor = GoodputMonitor(tmp_path, window=8, verbose=False, plot=HAS_MATPLOTLIB)
    trainer = Trainer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), pipeline, loss_fn, callbacks=[monitor])
    trainer.fit(num_steps=16)
    # The first steps eat the batches prefetched while the step compiled; the rolling window of
    # the last 8 steps sees the steady state. There the device waits for each batch: the injected
    # idle per step is the source's own period (measured in the source, sleep overshoot included)
    # less the step, which overlaps it.
    window = monitor.report["window"]
    period = (source.finished_at[15] - source.finished_at[7]) / 8  # batches 9..16 fed steps 9..16
    injected = period - window["step_time_s"]
    assert window["exposed_idle_s"] == pytest.approx(injected, rel=0.10)
    assert window["data_stall_s"] == pytest.approx(injected, rel=0.10)
    assert window["data_stall_pct"] > 80
    assert monitor.report["diagnosis"].startswith("input-bound")
    written = json.loads((tmp_path / "goodput.json").read_text())
    assert written["steps"] == 16 and len(written["per_step_last"]["step"]) == 16
    if monitor.plot:
        assert (tmp_path / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fast_pipeline_reports_no_stall_although_the_host_waits_in_next():
    """The host sleeps in next() on the main thread for a quarter of a step while the device computes."""
    sampler = SlowSampler(2048, delay_s=0.0)
    source = MemorySource(MemorySourceConfig(device_resident=True), data=points(2048))
    pipeline = Pipeline(source, batch_size=512, drop_remainder=True, sampler=sampler)
    monitor = GoodputMonitor(verbose=False)
    trainer = Trainer(DeepMLP(), optax.sgd(1e-3), pipeline, loss_fn, callbacks=[monitor])
    trainer.fit(num_steps=4)  # calibrates: how long does a step take on this machine?
    sampler.delay_s = max(monitor.report["steady"]["step_time_s"] / 4, 0.002)
    trainer.fit(num_steps=16)
    steady = monitor.report["steady"]
    assert steady["host_next_s"] >= sampler.delay_s
    assert steady["host_next_pct"] > 10
    assert steady["exposed_idle_pct"] < 5
    assert steady["data_stall_pct"] < 5
    assert monitor.report["diagnosis"].startswith("compute-bound")
