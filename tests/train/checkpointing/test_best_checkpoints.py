"""Best-k retention: the steps Orbax lists are exactly the k best by the metric plus the newest;
`restore_best` / `load_best` restore the best one; a save carries its own step's evaluation."""

from __future__ import annotations

import random

import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from test_trainer_checkpointing import advance, build
from trainer_helpers import assert_bitwise_equal, leaves, loss_fn, make_setup

from datarax.checkpoint.hashing import state_sha256
from datarax.train import Trainer
from datarax.train.callbacks import Callback, CheckpointCallback
from datarax.train.checkpointing.checkpointer import Checkpointer

CASES = [  # (best_mode, keep_best, max_to_keep, seed)
    ("min", 3, 1, 0),
    ("max", 3, 1, 1),
    ("min", 2, 2, 2),
    ("max", 1, 3, 3),
]


def best(metrics: dict[int, float | None], steps, mode: str, k: int) -> set[int]:
    ranked = sorted((s for s in steps if metrics[s] is not None), key=lambda s: metrics[s], reverse=mode == "max")
    return set(ranked[:k])


def expected_steps(metrics: dict[int, float | None], mode: str, keep_best: int, max_to_keep: int) -> list[int]:
    """The rule, replayed save by save: the `max_to_keep` newest and the `keep_best` best by value
    (a step without a value never ranks), except that while at most `keep_best` steps are on disk
    Orbax's BestN keeps them all."""
    present: list[int] = []
    for step in sorted(metrics):
        present.append(step)
        ranked = set(present) if len(present) <= keep_best else best(metrics, present, mode, keep_best)
        present = sorted(ranked | set(present[-max_to_keep:]))
    return present


@pytest.mark.parametrize("mode, keep_best, max_to_keep, seed", CASES)
def test_kept_steps_are_the_best_k_plus_the_newest_as_orbax_lists_them(tmp_path, mode, keep_best, max_to_keep, seed):
    rng = random.Random(seed)
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path, max_to_keep=max_to_keep, keep_best=keep_best, best_metric="eval/loss",
                        best_mode=mode, asynchronous=False)
    metrics, states = {}, {}
    for step in range(1, 13):
        advance(model, optimizer, iterator, steps=1)
        # The first two saves come before any evaluation: no value, kept only while newest.
        value = None if step <= 2 else rng.uniform(0, 10)
        metrics[step], states[step] = value, leaves(model)
        assert ckpt.save(step, model=model, optimizer=optimizer, iterator=iterator, metadata={},
                         metrics={} if value is None else {"eval/loss": value, "train/loss": 1.0})
        ckpt.wait()
        assert ckpt.steps() == expected_steps(metrics, mode, keep_best, max_to_keep), step
    (best_step,) = best(metrics, metrics, mode, 1)
    assert ckpt.best_step() == best_step
    assert ckpt.step_metrics(best_step) == {"eval/loss": metrics[best_step]}
    ckpt.close()
    listing = ocp.CheckpointManager(tmp_path, options=ocp.CheckpointManagerOptions(read_only=True))
    assert sorted(listing.all_steps()) == expected_steps(metrics, mode, keep_best, max_to_keep)
    listing.close()

    fresh_model, fresh_opt, fresh_it = build(seed=1)
    reopened = Checkpointer(tmp_path, max_to_keep=max_to_keep, keep_best=keep_best, best_metric="eval/loss",
                            best_mode=mode)
    restored = reopened.restore_best(model=fresh_model, optimizer=fresh_opt, iterator=fresh_it)
    reopened.close()
    assert restored.step == best_step and restored.metadata["best_metric"] == {"eval/loss": metrics[best_step]}
    for x, y in zip(leaves(fresh_model), states[best_step]):
        np.testing.assert_array_equal(x, y)


def test_a_non_finite_metric_never_ranks(tmp_path):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path, max_to_keep=1, keep_best=1, best_metric="train/loss")
    for step, value in enumerate([float("nan"), 2.0, float("inf"), 3.0], 1):
        ckpt.save(step, model=model, optimizer=optimizer, iterator=iterator, metadata={},
                  metrics={"train/loss": value})
        ckpt.wait()
    assert ckpt.steps() == [2, 4] and ckpt.best_step() == 2
    ckpt.close()


@pytest.mark.parametrize("kwargs, error", [
    ({"keep_best": 2}, r"keep_best and best_metric go together, got keep_best=2, best_metric=None"),
    ({"best_metric": "eval/loss"}, r"keep_best and best_metric go together"),
    ({"keep_best": 0, "best_metric": "eval/loss"}, r"keep_best must be an int >= 1"),
    ({"keep_best": 2, "best_metric": "loss"}, r"best_metric must be 'eval/<metric>' or 'train/<metric>', got 'loss'"),
    ({"keep_best": 2, "best_metric": "eval/loss", "best_mode": "lowest"}, r"best_mode must be 'min' or 'max'"),
])
def test_bad_retention_arguments_are_refused(tmp_path, kwargs, error):
    with pytest.raises(ValueError, match=error):
        CheckpointCallback(tmp_path, **kwargs)
    with pytest.raises(ValueError, match=error):
        Checkpointer(tmp_path, **kwargs)


class EvalRecorder(Callback):
    order = 50

    def __init__(self):
        self.evals = {}

    def on_eval_end(self, trainer, step, metrics):
        self.evals[step] = (metrics["loss"], state_sha256(trainer.model))


def test_the_trainer_saves_carry_their_own_steps_evaluation_and_load_best_restores_it(tmp_path):
    """Saves every 3 steps, evaluations every 2: a save due at step 6 waits for step 6's evaluation;
    one at step 3 (no evaluation there) carries step 2's."""

    def make(callbacks):
        setup = make_setup(batch_size=8)
        return Trainer(setup.model, optax.adam(0.02), setup.pipeline, loss_fn, eval_pipeline=setup.eval_pipeline,
                       eval_every_steps=2, callbacks=callbacks, ema_decay=0.5, accumulate_steps=2), setup

    recorder = EvalRecorder()
    ckpt = CheckpointCallback(tmp_path, every_steps=3, max_to_keep=1, keep_best=2, best_metric="eval/loss")
    trainer, setup = make([ckpt, recorder])
    trainer.fit(num_steps=16)
    saved = [3, 6, 9, 12, 15, 16]
    carried = {step: recorder.evals[step if step % 2 == 0 else step - 1][0] for step in saved}
    listing = ocp.CheckpointManager(tmp_path, options=ocp.CheckpointManagerOptions(read_only=True))
    kept = sorted(listing.all_steps())
    listing.close()
    assert kept == expected_steps(carried, "min", 2, 1)
    reopened = Checkpointer(tmp_path)
    for step in kept:
        assert reopened.read_metadata(step)[0]["best_metric"] == {"eval/loss": carried[step]}
    reopened.close()
    best = min(carried, key=carried.get)

    other, other_setup = make([CheckpointCallback(tmp_path, keep_best=2, best_metric="eval/loss", restore=False)])
    restored = other.callbacks.callbacks[0].load_best(other)
    assert restored.step == best == other.step
    if best == 16:  # the final step: the averages the run ended with
        assert_bitwise_equal(other.ema, trainer.ema)
    if best % 2 == 0:  # saved right after its own evaluation: the weights that evaluation saw
        assert state_sha256(other_setup.model) == recorder.evals[best][1]
        assert other.evaluate()["loss"] == pytest.approx(carried[best], rel=1e-6)
