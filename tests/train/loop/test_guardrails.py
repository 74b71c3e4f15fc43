"""The Trainer's construction-time warnings, each with its fix, and compile events named with their cause."""

from __future__ import annotations

import warnings

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from trainer_helpers import loss_fn, points

from datarax import Pipeline
from datarax.samplers import RangeSampler, ShuffleSampler
from datarax.sources import MemorySource
from datarax.sources.stream import RecordReader, StreamSourceModule, check_stream_state
from datarax.train import (
    ShortFinalBatchWarning,
    Trainer,
    TrainerWarning,
    UnknownEpochLengthWarning,
    UnshuffledTrainingWarning,
)
from datarax.train.callbacks import Callback, GoodputMonitor


def build(pipeline, **kwargs) -> Trainer:
    return Trainer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.1), pipeline, loss_fn, compilation_cache=False,
                   **kwargs)


def trainer_warnings(pipeline) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(pipeline)
    return [w for w in caught if issubclass(w.category, TrainerWarning)]


SHUFFLE_CASES = [  # (pipeline, warns)
    (lambda: Pipeline(MemorySource(shuffle=True, data=points(32)), batch_size=8), False),
    (lambda: Pipeline(MemorySource(data=points(32)), batch_size=8, sampler=ShuffleSampler(32, seed=1)), False),
    (lambda: Pipeline(MemorySource(data=points(32)), batch_size=8), True),
    (lambda: Pipeline(MemorySource(shuffle=True, data=points(32)), batch_size=8, sampler=RangeSampler(32)), True),
]


@pytest.mark.parametrize("make, warns", SHUFFLE_CASES)
def test_an_unshuffled_training_pipeline_warns_with_the_fix(make, warns):
    caught = [w for w in trainer_warnings(make()) if w.category is UnshuffledTrainingWarning]
    assert len(caught) == int(warns)
    if warns:
        text = str(caught[0].message)
        assert text.startswith("train_pipeline reads MemorySource in the same order every epoch (its sampler, ")
        assert "Fix: build the source with shuffle=True (e.g. MemorySource(shuffle=True, seed=0, ...), or" in text


@pytest.mark.parametrize("records, batch_size, drop, short", [
    (20, 8, False, 4), (20, 8, True, 0), (20, 5, False, 0), (7, 8, False, 0),  # 7 < 8: one shape
])
def test_a_short_final_batch_warns_with_the_fix(records, batch_size, drop, short):
    pipeline = Pipeline(MemorySource(shuffle=True, data=points(records)), batch_size=batch_size, drop_remainder=drop)
    caught = [w for w in trainer_warnings(pipeline) if w.category is ShortFinalBatchWarning]
    assert len(caught) == int(short > 0)
    if short:
        text = str(caught[0].message)
        assert text.startswith(f"train_pipeline's epoch of {records} records ends in a short batch of {short} "
                               f"(batch_size={batch_size}): its new shape compiles the train step a second time")
        assert f"Fix: Pipeline(..., drop_remainder=True) (drops {short} records per epoch" in text
    if short and (records, batch_size) == (20, 8):
        assert text.endswith("or a batch_size that divides 20 (e.g. 4, 5, 10)")


class Recorder(Callback):
    def __init__(self):
        self.compiles = []

    def on_step_end(self, trainer, logs):
        if logs.compile_seconds:
            self.compiles.append((logs.step, logs.batch_size, logs.compile_cause))


def test_the_short_batch_compile_is_named_in_the_goodput_report(tmp_path):
    pipeline = Pipeline(MemorySource(shuffle=True, data=points(20)), batch_size=8)
    recorder, monitor = Recorder(), GoodputMonitor(tmp_path, plot=False, verbose=False)
    with pytest.warns(ShortFinalBatchWarning):
        trainer = build(pipeline, callbacks=[recorder, monitor])
    trainer.fit(num_epochs=3)  # steps 3, 6 and 9 are short; only the first of them compiles
    assert recorder.compiles == [(1, 8, "the first step"), (3, 4, "the epoch's short final batch")]
    report = monitor.report
    assert [(c["step"], c["batch_size"], c["cause"]) for c in report["compiles"]] == recorder.compiles
    seconds = report["compiles"][1]["seconds"]
    assert (f"recompiles: step 3: compiled for a batch of 4 (the epoch's short final batch), {seconds:.2f} s "
            "(Pipeline(drop_remainder=True) or a batch_size that divides the epoch avoids the short batch's compile)"
            ) in report["diagnosis"]


class CountingStream(StreamSourceModule):
    """Epoch e yields records e*1000 + [0, n) in order, with no declared length."""

    def __init__(self, n: int):
        self.n = n

    def element_spec(self):
        return {"x": jax.ShapeDtypeStruct((4,), np.float32), "y": jax.ShapeDtypeStruct((), np.int32)}

    def open(self, epoch, state):
        start = 0 if state is None else check_stream_state(state, ("read",), "CountingStream")["read"]
        return CountingReader(self.n, epoch, start)


class CountingReader(RecordReader):
    def __init__(self, n, epoch, start):
        self.n, self.epoch, self.pos = n, epoch, start

    def read(self, out, start, count):
        take = max(0, min(count, self.n - self.pos))
        values = self.epoch * 1000 + np.arange(self.pos, self.pos + take)
        out["x"][start:start + take] = values[:, None]
        out["y"][start:start + take] = values % 3
        self.pos += take
        return take

    def get_state(self):
        return {"read": self.pos}


class FirstRecords(Callback):
    """The first record of every step's batch (from the one-step-late metrics)."""

    def __init__(self):
        self.by_step = {}

    def on_step_end(self, trainer, logs):
        if logs.metrics:
            self.by_step[logs.metrics_step] = logs.metrics["first"]

    def on_train_end(self, trainer, logs):
        if logs.metrics:
            self.by_step[logs.metrics_step] = logs.metrics["first"]


@pytest.mark.parametrize("k", [1, 2])
def test_num_epochs_on_a_stream_of_unknown_length_warns_and_stops_at_the_epoch_edge(k):
    """With steps_per_execution=2 a call that reads the next epoch's first batch puts it back and
    trains the batches before it (or none)."""
    firsts = FirstRecords()
    trainer = Trainer(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), optax.sgd(0.0), Pipeline(CountingStream(10), batch_size=4),
                      loss_fn, metrics={"first": lambda batch, aux: batch["x"][0, 0]}, callbacks=[firsts],
                      compilation_cache=False, steps_per_execution=k)
    with pytest.warns(UnknownEpochLengthWarning, match=r"fit\(num_epochs=2\) on CountingStream, a stream whose epoch "
                                                       r"length is unknown: the trainer stops when epoch 2 would "
                                                       r"begin.*Fix: fit\(num_steps=N\)"):
        result = trainer.fit(num_epochs=2)
    assert result.step == 6 and trainer.target_step is None
    state = trainer.iterator.get_state()
    assert (state["epoch"], state["position"]) == (1, 10)  # the batch of epoch 2 it read was put back
    with pytest.warns(UnknownEpochLengthWarning):
        trainer.fit(num_epochs=3)
    assert trainer.step == 9
    # Every epoch's batches start at records 0, 4 and 8 (of 10): nothing skipped or trained twice
    # (with k = 2 the metrics of each call's last step: steps 2, 4, 6, 8 and 9).
    assert firsts.by_step == {step: 1000.0 * ((step - 1) // 3) + 4 * ((step - 1) % 3)
                              for step in ([2, 4, 6, 8, 9] if k == 2 else range(1, 10))}
