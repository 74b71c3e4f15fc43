"""FusedSteps: with steps_per_execution=K over a device-resident pipeline, the Trainer gathers and
transforms each batch inside its K-step call, and trains bitwise as K single steps over the
batches the iterator hands out."""

from __future__ import annotations

import numpy as np
import optax
import pytest
from trainer_helpers import RECORD_METRICS, assert_bitwise_equal, loss_fn, make_setup, points

from datarax.pipeline.iterator import PipelineIterator
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer
from datarax.train.callbacks import Callback
from datarax.train.loop.fused import FusedSteps


class Calls(Callback):
    """(step, steps, records) of every call."""

    def __init__(self):
        self.calls = []

    def on_step_end(self, trainer, logs):
        self.calls.append((logs.step, logs.steps, logs.batch_size))


def run(monkeypatch, k: int, *, resident: bool = True, drop_remainder: bool = True, num_steps: int = 23):
    """Trains the helpers' jittered linear model for `num_steps` on 60 shuffled records in batches of 8;
    returns the trainer, its set-up, its calls, the fused calls' step counts and the iterator's `next()`s."""
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=5, device_resident=resident), data=points(60))
    setup = make_setup(source=source, drop_remainder=drop_remainder)
    seen = {"fused": [], "next": 0}
    fused_call, next_batch = FusedSteps.__call__, PipelineIterator.__next__

    def count_fused(self, values, call):
        seen["fused"].append(call.steps)
        return fused_call(self, values, call)

    def count_next(self):
        seen["next"] += 1
        return next_batch(self)

    monkeypatch.setattr(FusedSteps, "__call__", count_fused)
    monkeypatch.setattr(PipelineIterator, "__next__", count_next)
    calls = Calls()
    trainer = Trainer(setup.model, optax.adam(0.05), setup.pipeline, loss_fn, metrics=RECORD_METRICS,
                      callbacks=[calls], steps_per_execution=k)
    trainer.fit(num_steps=num_steps)
    monkeypatch.undo()
    return trainer, setup, calls.calls, seen


def test_a_call_of_k_steps_makes_its_batches_inside_and_trains_bitwise_like_single_steps(monkeypatch):
    """7 batches an epoch, so calls of 4 cross epoch boundaries; the last call (3 steps) is not fused."""
    single, single_setup, _, single_seen = run(monkeypatch, 1)
    fused, fused_setup, calls, seen = run(monkeypatch, 4)
    assert single._fused is None and single_seen == {"fused": [], "next": 23}
    assert seen == {"fused": [4] * 5, "next": 3}  # the iterator handed out only the last call's batches
    assert calls == [(4, 4, 32), (8, 4, 32), (12, 4, 32), (16, 4, 32), (20, 4, 32), (23, 3, 24)]
    assert_bitwise_equal(single_setup.model, fused_setup.model)
    assert_bitwise_equal(single.optimizer, fused.optimizer)
    assert fused.iterator.get_state() == single.iterator.get_state() == {**fused.iterator.get_state(), "epoch": 3,
                                                                          "position": 16}
    assert fused.last_metrics == single.last_metrics  # the same records, jittered the same way


@pytest.mark.filterwarnings("ignore::datarax.train.ShortFinalBatchWarning")
def test_a_call_holding_a_short_final_batch_runs_unfused(monkeypatch):
    """60 records in batches of 8 without drop_remainder: every eighth batch has 4 records."""
    single, single_setup, _, _ = run(monkeypatch, 1, drop_remainder=False, num_steps=16)
    fused, fused_setup, calls, seen = run(monkeypatch, 4, drop_remainder=False, num_steps=16)
    # Steps 5-8 hold epoch 0's short batch (step 8) and 13-16 none (epoch 1 ends at step 16).
    assert [step for step, _, _ in calls] == [4, 8, 12, 16]
    assert seen["fused"] == [4, 4] and seen["next"] == 8
    assert [rows for _, _, rows in calls] == [32, 28, 32, 28]
    assert_bitwise_equal(single_setup.model, fused_setup.model)
    assert fused.iterator.get_state() == single.iterator.get_state()


def test_a_host_resident_source_is_not_fused(monkeypatch):
    single, single_setup, _, _ = run(monkeypatch, 1, resident=False, num_steps=8)
    many, many_setup, _, seen = run(monkeypatch, 4, resident=False, num_steps=8)
    assert many._fused is None and not FusedSteps.supports(many_setup.pipeline)
    assert seen == {"fused": [], "next": 8}
    assert_bitwise_equal(single_setup.model, many_setup.model)


@pytest.mark.parametrize("resident", [True, False])
def test_supports_names_the_pipelines_whose_batches_can_be_made_inside(resident):
    source = MemorySource(MemorySourceConfig(device_resident=resident), data={"x": np.zeros((8, 4), np.float32)})
    assert FusedSteps.supports(make_setup(source=source).pipeline) is resident
