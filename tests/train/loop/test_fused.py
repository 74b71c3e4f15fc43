"""FusedSteps: with steps_per_execution=K over a device-resident pipeline, the Trainer gathers and
transforms each batch inside its K-step call, and trains bitwise as K single steps over the
batches the iterator hands out."""

from __future__ import annotations

import numpy as np
import optax
import pytest
from flax import nnx
from trainer_helpers import RECORD_METRICS, Jitter, assert_bitwise_equal, loss_fn, make_setup, points

from datarax import Pipeline
from datarax.pipeline.iterator import PipelineIterator
from datarax.samplers import Sampler, SequentialSampler, ShuffleSampler, SlidingWindowSampler
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer
from datarax.train.callbacks import Callback
from datarax.train.loop.fused import FusedSteps


class Calls(Callback):
    """(step, steps, records) of every call."""

    def __init__(self):
        self.calls, self.causes = [], []

    def on_step_end(self, trainer, logs):
        self.calls.append((logs.step, logs.steps, logs.batch_size))
        self.causes.append(logs.compile_cause)


def run(monkeypatch, k: int, *, resident: bool = True, drop_remainder: bool = True, num_steps: int = 23):
    """Trains the helpers' jittered linear model for `num_steps` on 60 shuffled records in batches of 8;
    returns the trainer, its set-up, its calls, the fused calls' step counts and the iterator's `next()`s."""
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=5, device_resident=resident), data=points(60))
    setup = make_setup(source=source, drop_remainder=drop_remainder)
    seen = {"fused": [], "next": 0}
    fused_call, next_batch = FusedSteps.__call__, PipelineIterator.__next__

    def count_fused(self, values, call, iterator):
        seen["fused"].append(call.steps)
        return fused_call(self, values, call, iterator)

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
    seen["causes"] = calls.causes
    return trainer, setup, calls.calls, seen


def test_a_call_of_k_steps_makes_its_batches_inside_and_trains_bitwise_like_single_steps(monkeypatch):
    """7 batches an epoch, so calls of 4 cross epoch boundaries; the last call (3 steps) is not fused."""
    single, single_setup, _, single_seen = run(monkeypatch, 1)
    fused, fused_setup, calls, seen = run(monkeypatch, 4)
    assert single._fused is None and (single_seen["fused"], single_seen["next"]) == ([], 23)
    assert (seen["fused"], seen["next"]) == ([4] * 5, 3)  # the iterator handed out only the last call's batches
    # Compiled twice: the first fused call, and the last call's single step (3 steps, fewer than K).
    assert seen["causes"] == ["the first call of 4 steps, the pipeline inside", None, None, None, None,
                              "the first single step (a call of fewer than 4 steps, or of batches of different "
                              "shapes)"]
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
    assert (seen["fused"], seen["next"]) == ([], 8)
    assert_bitwise_equal(single_setup.model, many_setup.model)


@pytest.mark.parametrize("resident", [True, False])
def test_supports_names_the_pipelines_whose_batches_can_be_made_inside(resident):
    source = MemorySource(MemorySourceConfig(device_resident=resident), data={"x": np.zeros((8, 4), np.float32)})
    assert FusedSteps.supports(make_setup(source=source).pipeline) is resident


class Rotation(Sampler):
    """A host-only sampler (no `device_params`): epoch e starts at record 7 * e, backwards."""

    def __init__(self, num_records: int):
        self.num_records = num_records

    def __len__(self) -> int:
        return self.num_records

    def indices(self, positions, epoch):
        return (7 * epoch - np.asarray(positions, np.int64)) % self.num_records


class HostWindows(SlidingWindowSampler):
    """Shuffled windows of 3 records, from the host only."""

    def device_params(self, epoch):
        return None


@pytest.mark.filterwarnings("ignore::datarax.train.UnshuffledTrainingWarning")  # the sequential sampler
@pytest.mark.parametrize("sampler", [
    Rotation(60), SequentialSampler(60), ShuffleSampler(60, seed=3),
    SlidingWindowSampler(60, window=3, shuffle=True, seed=2), HostWindows(60, window=3, shuffle=True, seed=2)],
    ids=["host_only", "sequential", "shuffle", "windows", "host_only_windows"])
def test_every_sampler_gives_a_fused_call_the_iterators_batches(sampler):
    """The call samples on the device (one walk for its K batches) or takes host indices; a window
    sampler's batches are windows of records (x: (8, 3, 4))."""
    trained = []
    for k in (1, 4):
        setup = make_setup(source=MemorySource(data=points(60)))
        pipeline = Pipeline(setup.pipeline.source, [Jitter(rngs=nnx.Rngs(1))], batch_size=8, sampler=sampler,
                            drop_remainder=True)
        trainer = Trainer(setup.model, optax.sgd(0.1), pipeline, loss_fn, metrics=RECORD_METRICS,
                          steps_per_execution=k)
        trained.append((trainer, trainer.fit(num_steps=20), setup.model))
    (single, single_result, single_model), (fused, fused_result, fused_model) = trained
    assert fused._fused is not None
    # The same records (an integer metric of their ids, exact), jittered the same way; the reported
    # float metrics may differ in their last bit: XLA fuses the batch's making into the loss and the
    # metrics' sums in one program and may order a sum differently (seen for the loss on the CPU
    # and for `x_sum` on the TPU, 1.5e-7 relative). The parameters must not differ.
    assert fused_result.metrics["rid_sq"] == single_result.metrics["rid_sq"]
    assert fused_result.metrics == pytest.approx(single_result.metrics, rel=1e-6)
    assert_bitwise_equal(single_model, fused_model)
    assert fused.iterator.get_state() == single.iterator.get_state()


class Refusing(Jitter):
    """Jitter that fails while its program is traced, while `refuse` is set."""

    refuse = True

    def apply_element(self, element, key):
        if Refusing.refuse:
            raise ValueError("the stage refused")
        return super().apply_element(element, key)


def test_a_call_that_fails_to_trace_leaves_the_iterator_where_it_was(monkeypatch):
    """As `next()` leaves it when the pipeline's program fails: nothing is skipped on a retry."""
    trained = []
    for refuse_first in (True, False):
        monkeypatch.setattr(Refusing, "refuse", False)
        setup = make_setup()
        pipeline = Pipeline(setup.pipeline.source, [Refusing(rngs=nnx.Rngs(1))], batch_size=8, drop_remainder=True)
        trainer = Trainer(setup.model, optax.sgd(0.1), pipeline, loss_fn, metrics=RECORD_METRICS,
                          steps_per_execution=4)
        if refuse_first:
            before = trainer.iterator.get_state()
            monkeypatch.setattr(Refusing, "refuse", True)
            with pytest.raises(ValueError, match="the stage refused"):
                trainer.fit(num_steps=8)
            assert trainer.iterator.get_state() == before and trainer.step == 0
            monkeypatch.setattr(Refusing, "refuse", False)
        trained.append((trainer.fit(num_steps=8), setup.model))
    (retried, retried_model), (fresh, fresh_model) = trained
    assert retried.metrics == fresh.metrics
    assert_bitwise_equal(retried_model, fresh_model)
