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
from xla_flags import one_device_env

from datarax import Pipeline
from datarax.samplers.base import Sampler
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer
from datarax.train.callbacks import GoodputMonitor
from datarax.train.metrics.goodput import GoodputLedger, diagnose

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


def hand_ledger() -> GoodputLedger:
    ledger = GoodputLedger(window=2)
    ledger.start(0.0)
    ledger.set_ready(ledger.add_step(1, 8, 0.0, 1.0, 1.6, 0.5), 2.0)
    ledger.set_ready(ledger.add_step(2, 8, 1.7, 2.5, 2.6, 0.0), 3.0)
    ledger.set_ready(ledger.add_step(3, 4, 2.7, 2.8, 2.85, 0.0), 3.5)
    ledger.add_interval("checkpoint_save", 2.52, 2.58)
    ledger.add_interval("checkpoint_save", 3.6, 4.0)
    ledger.finish(4.2)
    return ledger


def lane_total(lanes, name) -> float:
    return float(sum(duration for _, duration in lanes[name]))


def test_the_plot_shows_the_reports_numbers(tmp_path):
    """The picture's title is the report's headline and its lanes add up to the report's buckets."""
    from datarax.train.metrics.timeline import plot_timeline, timeline_data

    ledger = hand_ledger()
    summary = ledger.summary()
    data = timeline_data(ledger, summary)
    assert data["title"] == summary["headline"] and data["diagnosis"] == summary["diagnosis"]
    buckets = summary["buckets_s"]
    assert lane_total(data["lanes"], "device busy") == pytest.approx(buckets["goodput"])
    assert lane_total(data["lanes"], "data stall") == pytest.approx(buckets["data_stall"])
    assert lane_total(data["lanes"], "compile") == pytest.approx(buckets["compile"])
    assert lane_total(data["lanes"], "checkpoint_save") == pytest.approx(buckets["checkpoint_save"])
    # The headline's percentages are of the same wall time the buckets split.
    assert f"goodput {100 * buckets['goodput'] / summary['wall_s']:.1f}% of the run's 4.2 s wall time" in data["title"]
    np.testing.assert_allclose(data["step_ms"], [400.0, 400.0, 500.0])
    np.testing.assert_allclose(data["idle_ms"], [0.0, 600.0, 0.0])
    if HAS_MATPLOTLIB:
        assert plot_timeline(ledger, tmp_path / "t.png", summary=summary).read_bytes()[:4] == b"\x89PNG"


def test_a_real_runs_plot_data_equals_its_report(tmp_path):
    from datarax.train.metrics.timeline import timeline_data

    source = SlowSource(points(64), delay_s=0.01)
    monitor = GoodputMonitor(tmp_path, verbose=False, plot=False)
    trainer = Trainer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), Pipeline(source, batch_size=8), loss_fn,
                      callbacks=[monitor], compilation_cache=False)
    trainer.fit(num_steps=10)
    report = monitor.report
    data = timeline_data(monitor.ledger, report)
    assert data["title"] == report["headline"]
    assert lane_total(data["lanes"], "device busy") == pytest.approx(report["buckets_s"]["goodput"])
    assert lane_total(data["lanes"], "data stall") == pytest.approx(report["buckets_s"]["data_stall"])
    written = json.loads((tmp_path / "goodput.json").read_text())
    assert written["headline"] == report["headline"] and written["diagnosis"] == report["diagnosis"]


def test_evaluation_gets_its_own_verdict():
    from datarax.train.metrics.goodput import eval_goodput

    ledger = GoodputLedger()
    ledger.start(0.0)
    # first eval batch: next() 0-0.5, compiles 0.5-0.6, runs to 0.8; second: next() 0.6-0.9, runs 0.9-1.1
    ledger.set_ready(ledger.add_step(1, 4, 0.0, 0.5, 0.6, 0.1, "the first evaluation batch"), 0.8)
    ledger.set_ready(ledger.add_step(2, 4, 0.6, 0.9, 0.9, 0.0), 1.1)
    ledger.finish(1.2)
    s = eval_goodput([ledger])
    assert s["wall_s"] == pytest.approx(1.2)
    assert s["buckets_s"] == pytest.approx({"busy": 0.4, "data_wait": 0.5 + 0.1, "compile": 0.1, "other": 0.1})
    assert s["verdict"].startswith("evaluation: input-bound: the device was idle waiting for data 50% of the "
                                   "evaluation's 1.20 s; the pipeline delivers 8 el/s, the step consumes 20 el/s")
    assert eval_goodput([ledger, ledger])["verdict"].startswith(
        "evaluation: input-bound: the device was idle waiting for data 50% of the 2 evaluations' 2.40 s")


def test_a_fit_with_evaluations_reports_them_apart(tmp_path):
    setup_pipeline = Pipeline(MemorySource(MemorySourceConfig(shuffle=True, seed=1), data=points(64)), batch_size=8)
    eval_pipeline = Pipeline(MemorySource(data=points(24, 3)), batch_size=8)
    monitor = GoodputMonitor(tmp_path, verbose=False, plot=False)
    trainer = Trainer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), setup_pipeline, loss_fn,
                      eval_pipeline=eval_pipeline, eval_every_steps=4, callbacks=[monitor], compilation_cache=False)
    trainer.fit(num_steps=8)
    ev = monitor.report["eval"]
    assert ev["evaluations"] == 2 and ev["steps"] == 6  # two evaluations of three batches
    assert ev["compiles"][0]["cause"] == "the first evaluation batch" and len(ev["compiles"]) == 1
    assert sum(ev["buckets_s"].values()) == pytest.approx(ev["wall_s"])
    assert ev["verdict"].startswith("evaluation: ") and "of the 2 evaluations' " in ev["verdict"]
    assert monitor.report["buckets_s"]["eval"] > 0
    assert ev["verdict"] in monitor.report["text"]


def test_a_rerun_that_trains_no_step_keeps_the_last_report(tmp_path):
    from datarax.train.callbacks import CheckpointCallback

    def run():
        monitor = GoodputMonitor(tmp_path / "run", verbose=False, plot=HAS_MATPLOTLIB)
        pipeline = Pipeline(MemorySource(MemorySourceConfig(shuffle=True, seed=1), data=points(64)), batch_size=8)
        trainer = Trainer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), pipeline, loss_fn,
                          callbacks=[CheckpointCallback(tmp_path / "ckpt", every_steps=2), monitor],
                          compilation_cache=False)
        return trainer.fit(num_steps=4), monitor

    run()
    files = {name: (tmp_path / "run" / name).read_bytes() for name in ("goodput.json", "goodput_history.json")}
    if HAS_MATPLOTLIB:
        files["goodput.png"] = (tmp_path / "run" / "goodput.png").read_bytes()
    first = json.loads(files["goodput.json"])
    assert first["steps"] == 4
    result, monitor = run()
    assert result.resumed_from == 4 and result.step == 4
    for name, content in files.items():
        assert (tmp_path / "run" / name).read_bytes() == content, name
    assert monitor.report["steps"] == 0
    assert monitor.report["diagnosis"] == (
        f"this run trained no steps (it began at step 4, the target); {tmp_path / 'run' / 'goodput.json'} keeps the "
        f"report of the last run that trained (4 steps): {first['diagnosis']}")


def test_cumulative_goodput_counts_the_work_a_kill_lost():
    from datarax.train.metrics.goodput_history import cumulative

    segments = [
        {"began_at": 100.0, "start_step": 0, "resumed_from": None, "last_step": 14, "wall_s": 9.0, "busy_s": 6.0,
         "finished": False, "checkpoints": [[5, 3.0, 2.0], [10, 6.0, 4.0]]},
        {"began_at": 110.0, "start_step": 10, "resumed_from": 10, "last_step": 20, "wall_s": 5.0, "busy_s": 4.0,
         "finished": True, "checkpoints": [[15, 2.5, 2.0], [20, 5.0, 4.0]]},
    ]
    c = cumulative(segments)
    # Steps 11-14 of the first run, and the 3 s (2 s on the device) it spent after saving step 10.
    assert (c["lost_steps"], c["lost_s"], c["lost_busy_s"]) == (4, 3.0, 2.0)
    assert c["wall_s"] == 14.0 and c["between_runs_s"] == 1.0
    assert c["goodput_pct"] == pytest.approx(100 * (6.0 + 4.0 - 2.0) / 14.0)
    assert c["text"] == ("across 2 runs (14.0 s inside fit, plus 1.0 s between runs): goodput 57.1% of the runs' time "
                         "inside fit; 4 steps (at least; 3.0 s, 21.4% of that time) were trained again after a "
                         "restart: the work done since the last checkpoint before a kill, and what a killed run did "
                         "after its last record is unknown (up to 1.0 s before the next run began; its record is "
                         "rewritten every history_every_secs)")
    assert c["lost_known"] is False and c["unrecorded_s"] == 1.0
    # Killed before any checkpoint: the whole first run is lost.
    c = cumulative([{**segments[0], "checkpoints": []}, {**segments[1], "resumed_from": None, "start_step": 0}])
    assert (c["lost_steps"], c["lost_s"], c["lost_busy_s"]) == (14, 9.0, 6.0)


# (the first run's last record, finished, then what the report must say of the lost work): a kill
# whose run recorded nothing past the checkpoint the next resumed from lost an unknown amount
# (it may have trained up to the kill), never "none"; only a clean end loses nothing.
RESTARTS = [
    (10, False, "the work lost at a restart is unknown: the run killed at step 10 had recorded nothing past the "
                "checkpoint the next resumed from, and what a killed run did after its last record is unknown (up to "
                "12.0 s before the next run began"),
    (10, True, "no work was lost at a restart"),
    (12, False, "2 steps (at least; "),
]


@pytest.mark.parametrize("last_step, finished, words", RESTARTS)
def test_lost_work_is_measured_or_unknown_never_none_after_a_kill(last_step, finished, words):
    from datarax.train.metrics.goodput_history import cumulative

    first = {"began_at": 100.0, "start_step": 0, "resumed_from": None, "last_step": last_step, "wall_s": 8.0,
             "busy_s": 6.0, "finished": finished, "checkpoints": [[10, 6.0, 4.0]]}
    second = {"began_at": 120.0, "start_step": 10, "resumed_from": 10, "last_step": 20, "wall_s": 5.0,
              "busy_s": 4.0, "finished": True, "checkpoints": [[20, 5.0, 4.0]]}
    c = cumulative([first, second])
    assert words in c["text"]
    assert ("no work was lost" in c["text"]) == finished and c["lost_known"] == finished
    assert c["restarts"][0]["unrecorded_s"] == (0.0 if finished else 12.0)


CHILD = """
import sys, time
import optax
from flax import nnx
sys.path.insert(0, {helpers!r})
from trainer_helpers import loss_fn, points
from datarax import Pipeline
from datarax.sources import MemorySource
from datarax.train import Trainer
from datarax.train.callbacks import Callback, CheckpointCallback, GoodputMonitor

class Announce(Callback):
    order = 50
    def on_step_end(self, trainer, logs):
        print(f"step {{logs.step}}", flush=True)
        time.sleep(0.2)

pipeline = Pipeline(MemorySource(shuffle=True, seed=1, data=points(64)), batch_size=8)
trainer = Trainer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), pipeline, loss_fn, compilation_cache=False,
                  callbacks=[CheckpointCallback({ckpt!r}, every_steps=4, asynchronous=False),
                             GoodputMonitor({run!r}, plot=False, verbose=False, history_every_steps=1), Announce()])
result = trainer.fit(num_steps=16)
print("done", result.step, result.resumed_from, flush=True)
"""


def test_cumulative_goodput_after_a_real_sigkill(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(helpers=str(Path(__file__).resolve().parents[2]), ckpt=str(tmp_path / "ckpt"),
                                   run=str(tmp_path / "run")))
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(repo), PYTHONUNBUFFERED="1")
    one_device_env(env)  # one CPU device, compiled as the suite compiles
    proc = subprocess.Popen([sys.executable, str(script)], cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            if line.strip() == "step 10":  # checkpoint 8 is on disk (a synchronous save); step 10 sleeps
                os.killpg(proc.pid, signal.SIGKILL)
                break
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "run" / "goodput.json").exists()  # the killed run never reached its end
    done = subprocess.run([sys.executable, str(script)], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "done 16 8"
    report = json.loads((tmp_path / "run" / "goodput.json").read_text())
    assert report["steps"] == 8  # this run's own steps: 9..16
    c = report["cumulative"]
    assert c["runs"] == 2
    assert c["restarts"] == [{"resumed_from": 8, "lost_steps": 2, "lost_s": c["lost_s"], "killed_at_step": 10,
                              "finished": False, "unrecorded_s": c["restarts"][0]["unrecorded_s"]}]
    assert c["lost_known"] is False and c["restarts"][0]["unrecorded_s"] > 0
    assert c["lost_steps"] == 2  # steps 9 and 10 were trained twice
    assert c["lost_s"] >= 0.4  # at least the two injected 0.2 s pauses after step 8's save (steps 8 and 9)
    assert "2 steps (at least; " in c["text"] and c["text"] in report["text"]


def test_calls_of_several_steps_are_counted_by_their_steps():
    """Three calls of steps_per_execution=4 (the last one 2 steps) on a made-up timeline, worked out by hand."""
    from datarax.train.metrics.timeline import timeline_data

    ledger = GoodputLedger(window=2)
    ledger.start(0.0)
    # call 1 (steps 1-4, 32 records): compiles 0.5 s, ready at 2.0
    ledger.set_ready(ledger.add_step(4, 32, 0.0, 1.0, 1.6, 0.5, steps=4), 2.0)
    # call 2 (steps 5-8): next() 1.7-2.5, dispatched 2.6 -> idle 2.0-2.6 (0.5 of it waiting for data), busy 0.4
    ledger.set_ready(ledger.add_step(8, 32, 1.7, 2.5, 2.6, 0.0, steps=4), 3.0)
    # call 3 (steps 9-10, 16 records): dispatched while call 2 runs, busy 3.0-3.5
    ledger.set_ready(ledger.add_step(10, 16, 2.7, 2.8, 2.85, 0.0, steps=2), 3.5)
    ledger.finish(3.5)
    s = ledger.summary()
    assert (s["steps"], s["calls"]) == (10, 3)
    steady = s["steady"]  # calls 2 and 3: steps 5-10, from 2.0 to 3.5
    assert (steady["steps"], steady["calls"], steady["elements"]) == (6, 2, 48)
    assert (steady["first_step"], steady["last_step"]) == (5, 10)
    assert steady["goodput_pct"] == pytest.approx(100 * 0.9 / 1.5)
    assert steady["step_time_s"] == pytest.approx(0.9 / 6)
    assert steady["exposed_idle_s"] == pytest.approx(0.6 / 6) and steady["data_stall_s"] == pytest.approx(0.5 / 6)
    assert steady["step_consumes_el_s"] == pytest.approx(48 / 0.9)
    assert "(10 steps;" in s["headline"] and "steps 5-10, timed from step 4's result" in s["diagnosis"]
    assert ledger.busy_so_far() == (10, 10, pytest.approx(0.4 + 0.4 + 0.5))
    data = timeline_data(ledger, s)  # one bar per call, as wide as its steps, in ms per step
    np.testing.assert_allclose(data["steps"], [2.5, 6.5, 9.5])
    np.testing.assert_allclose(data["widths"], [4, 4, 2])
    np.testing.assert_allclose(data["step_ms"], [100.0, 100.0, 250.0])
    np.testing.assert_allclose(data["idle_ms"], [0.0, 150.0, 0.0])


def test_a_real_run_of_calls_of_four_steps_is_counted_by_its_steps(tmp_path):
    monitor = GoodputMonitor(tmp_path, verbose=False, plot=False)
    pipeline = Pipeline(MemorySource(MemorySourceConfig(shuffle=True), data=points(64)), batch_size=8)
    trainer = Trainer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), pipeline, loss_fn, callbacks=[monitor],
                      compilation_cache=False, steps_per_execution=4)
    trainer.fit(num_steps=14)
    report = monitor.report
    assert (report["steps"], report["calls"]) == (14, 4)
    assert list(report["per_step"]["steps"]) == [4, 4, 4, 2]
    assert list(report["per_step"]["batch_size"]) == [32, 32, 32, 16]
    assert (report["steady"]["steps"], report["steady"]["elements"], report["steady"]["first_step"]) == (10, 80, 5)
    history = json.loads((tmp_path / "goodput_history.json").read_text())["segments"][-1]
    assert (history["start_step"], history["last_step"]) == (0, 14)


def test_the_checkpoint_bucket_holds_only_the_time_the_loop_was_blocked(tmp_path, monkeypatch):
    """The write of checkpoint 4 is held inside Orbax until step 6 has been dispatched: the save
    returned at once, and the monitor's checkpoint interval for it ends before step 5 was dispatched."""
    import threading

    import orbax.checkpoint as ocp

    from datarax.train.callbacks import Callback, CheckpointCallback

    release = threading.Event()
    original = ocp.StandardCheckpointHandler.async_save

    async def held(self, directory, *args, **kwargs):
        if "/4.orbax-checkpoint-tmp" in str(directory):
            assert release.wait(timeout=120), "the loop never reached step 6 while checkpoint 4 was being written"
        return await original(self, directory, *args, **kwargs)

    class Release(Callback):
        def on_step_end(self, trainer, logs):
            if logs.step == 6:
                release.set()

    monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save", held)
    monitor = GoodputMonitor(verbose=False, plot=False)
    pipeline = Pipeline(MemorySource(MemorySourceConfig(shuffle=True), data=points(64)), batch_size=8)
    trainer = Trainer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), pipeline, loss_fn, compilation_cache=False,
                      callbacks=[monitor, CheckpointCallback(tmp_path, every_steps=4), Release()])
    trainer.fit(num_steps=8)
    saves = [(begin, end) for kind, begin, end in monitor.ledger.intervals if kind == "checkpoint_save"]
    dispatched = dict(zip(monitor.ledger.steps["step"], monitor.ledger.steps["dispatched"]))
    assert len(saves) == 2  # steps 4 and 8
    assert saves[0][1] < dispatched[5]
    assert sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()) == [4, 8]
