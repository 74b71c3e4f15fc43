"""Callbacks: schedules against a brute-force reference, writers, logger, progress, early stopping, LR."""

from __future__ import annotations

import io
import json
import struct
import sys

import optax
import pytest
from trainer_helpers import METRICS, loss_fn, make_setup

from datarax.monitoring.writers import ConsoleWriter, JsonlWriter
from datarax.train import Trainer
from datarax.train.callbacks import (
    Callback,
    EarlyStopping,
    LearningRateLogger,
    MetricLogger,
    ProgressBar,
    Schedule,
    StepLogs,
)
from datarax.train.callbacks.base import CallbackList
from datarax.train.metrics.writers import TensorBoardWriter, tensorboard_available


def reference_fires(start, steps, every=None, on=()):
    """Brute force: fire at a step if a multiple of `every` or a listed step lies in (previous, step]."""
    fired, prev = [], start
    for step in steps:
        crossed = range(prev + 1, step + 1)
        if (every and any(s % every == 0 for s in crossed)) or any(s in crossed for s in on):
            fired.append(step)
        prev = step
    return fired


SCHEDULE_CASES = [
    # (start, steps seen, every_steps, on_steps)
    (0, list(range(1, 31)), 10, ()),
    (37, list(range(38, 61)), 10, ()),  # resumed mid-interval: next fire at 40, never at 37
    (0, [1, 2, 15, 16, 35, 40, 41], 10, ()),  # jumps over boundaries fire once
    (0, list(range(1, 20)), None, (3, 7, 7, 18)),
    (5, [6, 9, 30], 4, (7, 25)),
    (0, [100], 10, (50,)),
]


@pytest.mark.parametrize("start, steps, every, on", SCHEDULE_CASES)
def test_schedule_matches_brute_force(start, steps, every, on):
    schedule = Schedule(every_steps=every, on_steps=on)
    schedule.reset(start, now=0.0)
    assert [s for s in steps if schedule.due(s, now=0.0)] == reference_fires(start, steps, every, on)


def test_schedule_every_secs():
    schedule = Schedule(every_secs=10)
    schedule.reset(0, now=100.0)
    assert [schedule.due(s, now=t) for s, t in [(1, 105.0), (2, 110.0), (3, 111.0), (4, 125.0)]] == \
        [False, True, False, True]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"every_steps": 0}, ValueError, r"every_steps must be a positive number or None, got 0"),
    ({"every_steps": True}, ValueError, r"every_steps must be a positive number or None, got True"),
    ({"every_secs": -1.0}, ValueError, r"every_secs must be a positive number or None, got -1.0"),
    ({"on_steps": 5}, TypeError, r"on_steps must be a sequence of ints, got 5"),
])
def test_schedule_argument_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        Schedule(**kwargs)


def test_callback_list_orders_and_skips_unimplemented_events():
    calls = []

    class A(Callback):
        order = 5

        def on_step_end(self, trainer, logs):
            calls.append("A")

    class B(Callback):
        order = -5

        def on_step_end(self, trainer, logs):
            calls.append("B")

    callbacks = CallbackList([A(), B(), Callback()])
    callbacks("on_step_end", None, StepLogs(step=1))
    callbacks("on_eval_end", None, 1, {})
    assert calls == ["B", "A"]
    assert len(callbacks._handlers["on_step_end"]) == 2 and callbacks._handlers["on_eval_end"] == []


class FakeTrainer:
    def __init__(self, step=0, target=10):
        self.step, self.target_step, self.stop_reason = step, target, None

    def request_stop(self, reason):
        self.stop_reason = self.stop_reason or reason


class CluStyleWriter:
    """What `clu.metric_writers.MetricWriter` offers: write_scalars(step, scalars)."""

    def __init__(self):
        self.rows = []

    def write_scalars(self, step, scalars):
        self.rows.append((step, dict(scalars)))


def test_metric_logger_writes_late_metrics_eval_and_final(tmp_path):
    clu, console = CluStyleWriter(), io.StringIO()
    logger = MetricLogger([clu, JsonlWriter(tmp_path / "m.jsonl"), ConsoleWriter(console)], every_steps=2)
    trainer = FakeTrainer()
    logger.on_train_begin(trainer)
    logger.on_step_end(trainer, StepLogs(step=1))
    for step in range(2, 6):
        logger.on_step_end(trainer, StepLogs(step=step, metrics={"loss": 1.0 / step}, metrics_step=step - 1))
    logger.on_eval_end(trainer, 5, {"loss": 0.5})
    logger.on_train_end(trainer, StepLogs(step=5, metrics={"loss": 0.2}, metrics_step=5))
    assert clu.rows == [(2, {"train/loss": 1 / 3}), (4, {"train/loss": 1 / 5}), (5, {"eval/loss": 0.5}),
                        (5, {"train/loss": 0.2})]
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [(r["step"], {k: v for k, v in r.items() if "/" in k}) for r in lines] == clu.rows
    assert console.getvalue().splitlines()[0] == "step 2 | train/loss 0.3333"


def test_metric_logger_rejects_a_writer_without_write_scalars():
    with pytest.raises(TypeError, match=r"writers\[1\] must have write_scalars\(step, scalars\).*got list"):
        MetricLogger([ConsoleWriter(), []])


def read_tensorboard_scalars(logdir):
    """Parses the TFRecord event files by hand: [len u64][crc u32][event][crc u32]..."""
    from tensorboardX.proto.event_pb2 import Event

    scalars = []
    for path in sorted(logdir.iterdir()):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            event = Event.FromString(data[offset + 12:offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.append((event.step, value.tag, round(value.simple_value, 6)))
    return scalars


@pytest.mark.skipif(not tensorboard_available(), reason="needs tensorboardX")
def test_tensorboard_writer_writes_readable_events(tmp_path):
    pytest.importorskip("tensorboardX")
    writer = TensorBoardWriter(tmp_path)
    writer.write_scalars(3, {"train/loss": 0.25, "eval/accuracy": 0.5})
    writer.close()
    assert sorted(read_tensorboard_scalars(tmp_path)) == [(3, "eval/accuracy", 0.5), (3, "train/loss", 0.25)]


def test_progress_bar_shows_steps_and_throughput():
    pytest.importorskip("tqdm")
    stream = io.StringIO()
    bar = ProgressBar(mode="bar", file=stream, mininterval=0)
    trainer = FakeTrainer(step=4, target=8)
    bar.on_train_begin(trainer)
    for i, step in enumerate(range(5, 9)):
        bar.on_step_end(trainer, StepLogs(step=step, batch_size=10, dispatched_at=100.0 + i,
                                          metrics={"loss": 0.5}, metrics_step=step - 1))
    assert bar.throughput() == pytest.approx(30 / 3)  # the first logged time opens the window
    bar.on_train_end(trainer, StepLogs(step=8))
    text = stream.getvalue()
    assert "8/8" in text and "loss=0.5" in text and "el/s" in text


@pytest.mark.parametrize("mode, values, stop_at", [
    ("min", [3.0, 2.0, 2.5, 2.1, 1.0], None),
    ("min", [3.0, 2.0, 2.5, 2.1, 2.2], 5),
    ("max", [0.1, 0.2, 0.2, 0.19, 0.15], 5),
])
def test_early_stopping(mode, values, stop_at):
    stopper = EarlyStopping("eval/loss", mode=mode, patience=3)
    trainer = FakeTrainer()
    for step, value in enumerate(values, start=1):
        stopper.on_eval_end(trainer, step, {"loss": value})
    assert stopper.stopped_at == stop_at
    assert (trainer.stop_reason is not None) == (stop_at is not None)
    restored = EarlyStopping("eval/loss", mode=mode, patience=3)
    restored.set_state(json.loads(json.dumps(stopper.get_state())))
    assert (restored.best, restored.wait) == (stopper.best, stopper.wait)


def test_early_stopping_errors():
    with pytest.raises(ValueError, match=r"monitor must be 'eval/<metric>' or 'train/<metric>', got 'loss'"):
        EarlyStopping("loss")
    with pytest.raises(ValueError, match=r"mode must be 'min' or 'max', got 'up'"):
        EarlyStopping(mode="up")
    with pytest.raises(ValueError, match=r"patience must be an int >= 1, got 0"):
        EarlyStopping(patience=0)
    with pytest.raises(ValueError, match=r"min_delta must be a number >= 0, got -0.1"):
        EarlyStopping(min_delta=-0.1)
    with pytest.raises(KeyError, match=r"monitors 'eval/acc' but the eval metrics are \['loss'\]"):
        EarlyStopping("eval/acc").on_eval_end(FakeTrainer(), 1, {"loss": 1.0})


class LrRecorder(Callback):
    order = 50

    def __init__(self):
        self.rates = {}

    def on_step_end(self, trainer, logs):
        if "learning_rate" in logs.metrics:
            self.rates[logs.metrics_step] = logs.metrics["learning_rate"]

    def on_train_end(self, trainer, logs):
        self.rates[logs.metrics_step] = logs.metrics["learning_rate"]


@pytest.mark.parametrize("injected", [False, True], ids=["schedule", "inject_hyperparams"])
def test_learning_rate_logger_matches_the_schedule(injected):
    schedule = optax.linear_schedule(0.1, 0.0, 10)
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=schedule) if injected else optax.sgd(schedule)
    setup = make_setup()
    recorder = LrRecorder()
    trainer = Trainer(setup.model, tx, setup.pipeline, loss_fn, metrics=METRICS,
                      callbacks=[LearningRateLogger(None if injected else schedule), recorder])
    trainer.fit(num_steps=5)
    assert sorted(recorder.rates) == [1, 2, 3, 4, 5]
    for step, rate in recorder.rates.items():
        assert rate == pytest.approx(float(schedule(step - 1)), rel=1e-6)


def test_learning_rate_logger_rejects_a_non_callable_schedule():
    with pytest.raises(TypeError, match=r"schedule must be an optax schedule \(callable on the step count\), got 0.1"):
        LearningRateLogger(0.1)


@pytest.mark.parametrize("blocked, make, match", [
    (("tqdm",), lambda tmp: ProgressBar(mode="bar"), r"ProgressBar\(mode='bar'\) needs tqdm: pip install tqdm"),
    (("tensorboardX", "torch"), lambda tmp: TensorBoardWriter(tmp),
     r"TensorBoardWriter needs a TensorBoard event writer: pip install tensorboardX"),
])
def test_missing_optional_packages_are_named(tmp_path, monkeypatch, blocked, make, match):
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    with pytest.raises(ImportError, match=match):
        make(tmp_path)


def test_timeline_without_matplotlib_says_how_to_fix(monkeypatch, tmp_path):
    from datarax.train.metrics.goodput import GoodputLedger
    from datarax.train.metrics.timeline import plot_timeline

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r"the goodput timeline needs matplotlib: pip install matplotlib "
                                          r"\(or pass plot=False to GoodputMonitor\)"):
        plot_timeline(GoodputLedger(), tmp_path / "x.png")


def test_learning_rate_logger_needs_a_schedule_or_injected_hyperparams():
    setup = make_setup()
    trainer = Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn, callbacks=[LearningRateLogger()])
    with pytest.raises(ValueError, match=r"found no learning_rate in the optimizer state; pass schedule="):
        trainer.fit(num_steps=1)


def test_real_clu_writers_through_a_real_fit(tmp_path):
    """clu.metric_writers needs TensorFlow in clu 0.0.12 (its package __init__ imports the summary
    writer), and TensorFlow is not in the test extra: this runs where TensorFlow is installed
    (the [bench] extra) and is skipped elsewhere."""
    try:
        from clu import metric_writers
    except ImportError as exc:
        pytest.skip(f"clu.metric_writers needs TensorFlow (pip install 'datarax[bench]'): {exc}")
    import optax
    from trainer_helpers import loss_fn, make_setup

    from datarax.train import Trainer

    seen = []

    class Recording(metric_writers.LoggingWriter):
        def write_scalars(self, step, scalars):
            seen.append((step, dict(scalars)))
            super().write_scalars(step, scalars)

    summary = metric_writers.SummaryWriter(str(tmp_path / "tb"))
    setup = make_setup()
    trainer = Trainer(setup.model, optax.adam(5e-2), setup.pipeline, loss_fn,
                      callbacks=[MetricLogger([Recording(), summary], every_steps=2)])
    result = trainer.fit(num_steps=5)
    summary.flush()
    assert [step for step, _ in seen] == [2, 4, 5]  # every 2 steps, metrics one step late, and the final ones
    assert seen[-1][1]["train/loss"] == pytest.approx(result.metrics["loss"])
    assert list((tmp_path / "tb").iterdir())  # the TensorBoard event file


class Terminal(io.StringIO):
    """A stream that says it is a terminal, and shows what a terminal would: `\\r` returns to column 0."""

    def isatty(self):
        return True

    def screen(self) -> list[str]:
        lines, current = [], []
        col = 0
        for ch in self.getvalue():
            if ch == "\r":
                col = 0
            elif ch == "\n":
                lines.append("".join(current).rstrip())
                current, col = [], 0
            else:
                if col < len(current):
                    current[col] = ch
                else:
                    current.append(ch)
                col += 1
        return lines + (["".join(current).rstrip()] if current else [])


class FakeRun:
    def __init__(self, target=10):
        self.step, self.target_step, self.target_epoch, self.resumed_from = 0, target, None, None


def test_on_a_terminal_metric_lines_and_warnings_go_above_the_bar_not_into_it():
    pytest.importorskip("tqdm")
    import warnings

    terminal = Terminal()
    bar, writer, run = ProgressBar(file=terminal, mininterval=0), ConsoleWriter(terminal), FakeRun(target=4)
    assert bar.uses_bar()
    bar.on_train_begin(run)
    for step in range(1, 5):
        run.step = step
        bar.on_step_end(run, StepLogs(step=step, batch_size=8, dispatched_at=float(step), metrics={"loss": 0.5},
                                      metrics_step=step - 1))
        writer.write_scalars(step, {"train/loss": 0.5})
    warnings.warn("a warning while the bar is shown", UserWarning)
    bar.on_train_end(run, StepLogs(step=4))
    screen = terminal.screen()
    assert [line for line in screen if "train/loss" in line] == [f"step {s} | train/loss 0.5" for s in range(1, 5)]
    assert any(line.endswith("UserWarning: a warning while the bar is shown") for line in screen)
    assert screen[-1].startswith("100%|") and "4/4" in screen[-1]
    assert showwarning_restored()


def showwarning_restored() -> bool:
    import warnings

    return warnings.showwarning.__module__ == "warnings"


class StepClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_off_a_terminal_plain_lines_come_on_a_schedule():
    clock, stream, run = StepClock(), io.StringIO(), FakeRun(target=10)
    bar = ProgressBar(file=stream, every_secs=10, clock=clock)
    assert not bar.uses_bar()
    bar.on_train_begin(run)
    for step in range(1, 11):
        clock.now += 3.0
        run.step = step
        metrics = {"loss": 1.0 - 0.1 * (step - 2)} if step > 1 else {}
        bar.on_step_end(run, StepLogs(step=step, batch_size=8, dispatched_at=clock.now, metrics=metrics,
                                      metrics_step=step - 1 if metrics else None))
    bar.on_train_end(run, StepLogs(step=10, metrics={"loss": 0.1}, metrics_step=10))
    assert stream.getvalue().splitlines() == [
        "training from step 0 to step 10; the first step compiles",
        "step 1/10 (10%) | 0:00:03 elapsed | eta 0:00:27",      # the first step always shows
        "step 4/10 (40%) | 3 el/s | loss 0.8 | 0:00:12 elapsed | eta 0:00:18",  # 10 s after the start
        "step 8/10 (80%) | 3 el/s | loss 0.4 | 0:00:24 elapsed | eta 0:00:06",  # 10 s after that
        "step 10/10 (100%) | 3 el/s | loss 0.1 | 0:00:30 elapsed",  # the end
    ]


def test_lines_every_n_steps_and_a_resumed_start():
    clock, stream, run = StepClock(), io.StringIO(), FakeRun(target=6)
    run.step, run.resumed_from = 2, 2
    bar = ProgressBar(mode="lines", file=stream, every_steps=2, clock=clock)
    bar.on_train_begin(run)
    for step in range(3, 7):
        clock.now += 1.0
        run.step = step
        bar.on_step_end(run, StepLogs(step=step, batch_size=4, dispatched_at=clock.now))
    bar.on_train_end(run, StepLogs(step=6))
    assert [line.split(" | ")[0] for line in stream.getvalue().splitlines()] == [
        "training from step 2 to step 6 (resumed from the checkpoint at step 2); the first step compiles",
        "step 3/6 (50%)", "step 4/6 (67%)", "step 6/6 (100%)"]


def test_progress_counts_the_steps_of_calls_and_shows_the_first_call():
    clock, stream, run = StepClock(), io.StringIO(), FakeRun(target=12)
    bar = ProgressBar(mode="lines", file=stream, every_steps=8, clock=clock)
    bar.on_train_begin(run)
    for step in (4, 8, 12):  # calls of 4 steps (steps_per_execution=4)
        clock.now += 1.0
        run.step = step
        bar.on_step_end(run, StepLogs(step=step, steps=4, batch_size=32, dispatched_at=clock.now))
    bar.on_train_end(run, StepLogs(step=12))
    assert [line.split(" | ")[0] for line in stream.getvalue().splitlines()] == [
        "training from step 0 to step 12; the first step compiles", "step 4/12 (33%)", "step 8/12 (67%)",
        "step 12/12 (100%)"]
    pytest.importorskip("tqdm")
    terminal = Terminal()
    bar, run = ProgressBar(file=terminal, mininterval=0), FakeRun(target=12)
    bar.on_train_begin(run)
    for step in (4, 8, 12):
        run.step = step
        bar.on_step_end(run, StepLogs(step=step, steps=4, batch_size=32, dispatched_at=float(step)))
    bar.on_train_end(run, StepLogs(step=12))
    assert "12/12" in terminal.screen()[-1]
