"""The parameters' moving average: a hand-written numpy EMA over the recorded parameters, evaluation
with it, and a bitwise resume from its own checkpoint item."""

from __future__ import annotations

import shutil

import numpy as np
import optax
import pytest
from flax import nnx
from trainer_helpers import METRICS, assert_bitwise_equal, leaves, loss_fn, make_setup

from datarax.checkpoint import CheckpointMismatchError
from datarax.train import Trainer
from datarax.train.callbacks import CheckpointCallback
from datarax.train.loop.ema import param_values

DECAY = 0.9


def make_trainer(callbacks=(), *, ema_decay=DECAY, accumulate_steps=1):
    setup = make_setup(batch_size=8)
    trainer = Trainer(setup.model, optax.adam(5e-2), setup.pipeline, loss_fn, eval_pipeline=setup.eval_pipeline,
                      metrics=METRICS, callbacks=callbacks, ema_decay=ema_decay, accumulate_steps=accumulate_steps)
    return trainer, setup


def host_params(model) -> list[np.ndarray]:
    return [np.array(v) for v in param_values(model)]


@pytest.mark.parametrize("decay", [0.5, DECAY, 0.999])
def test_the_average_is_a_hand_written_ema_over_the_recorded_parameters(decay):
    trainer, setup = make_trainer(ema_decay=decay)
    sequence = [host_params(setup.model)]
    for step in range(1, 7):
        trainer.fit(num_steps=step)
        sequence.append(host_params(setup.model))
    expected = [p.copy() for p in sequence[0]]
    d = np.float32(decay)
    for params in sequence[1:]:
        expected = [(d * e + (np.float32(1) - d) * p).astype(np.float32) for e, p in zip(expected, params)]
    got = [np.asarray(v) for v in trainer.ema.values()]
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)
    assert not np.allclose(got[0], sequence[-1][0])  # an average, not the parameters


def test_evaluate_with_ema_is_the_model_with_averaged_parameters():
    trainer, setup = make_trainer()
    trainer.fit(num_steps=5)
    before = host_params(setup.model)
    with_ema = trainer.evaluate(ema=True)
    assert all(np.array_equal(a, b) for a, b in zip(host_params(setup.model), before))  # the model is untouched
    # Reference: a copy of the model holding the averages, evaluated by a plain trainer.
    copy = nnx.clone(setup.model)
    params = nnx.state(copy, nnx.Param)
    flat = nnx.to_flat_state(params)
    nnx.update(copy, nnx.from_flat_state([(path, v.replace(a)) for (path, v), a in zip(flat, trainer.ema.values())]))
    reference = Trainer(copy, optax.adam(5e-2), make_setup().pipeline, loss_fn, eval_pipeline=setup.eval_pipeline,
                        metrics=METRICS).evaluate()
    assert with_ema == pytest.approx(reference, rel=1e-6)
    assert with_ema != trainer.evaluate()


def test_evaluate_with_ema_needs_ema_decay():
    trainer, _ = make_trainer(ema_decay=None)
    with pytest.raises(ValueError, match=r"evaluate\(ema=True\) needs .* ema_decay="):
        trainer.evaluate(ema=True)


@pytest.mark.parametrize("decay, error", [(1.0, "ema_decay must be < 1"), (0.0, r"ema_decay must be in \(0.0, 1.0\]"),
                                          ("0.9", "ema_decay must be a number")])
def test_bad_decays_are_refused(decay, error):
    with pytest.raises((ValueError, TypeError), match=error):
        make_trainer(ema_decay=decay)


def test_resume_restores_the_average_bitwise(tmp_path):
    full, full_setup = make_trainer(accumulate_steps=2)
    full.fit(num_steps=10)
    part, _ = make_trainer([CheckpointCallback(tmp_path, every_steps=4)], accumulate_steps=2)
    part.fit(num_steps=9)
    shutil.rmtree(tmp_path / "9")  # a crash after step 9: the last checkpoint is step 8
    ckpt = CheckpointCallback(tmp_path, every_steps=4)
    resumed, resumed_setup = make_trainer([ckpt], accumulate_steps=2)
    resumed.fit(num_steps=10)
    assert ckpt.restored.step == 8
    assert (tmp_path / "8" / "ema").is_dir()
    assert_bitwise_equal(full_setup.model, resumed_setup.model)
    assert_bitwise_equal(full.ema, resumed.ema)
    assert_bitwise_equal(full.optimizer, resumed.optimizer)


def test_a_checkpoint_without_the_average_is_refused_naming_it(tmp_path):
    plain, _ = make_trainer([CheckpointCallback(tmp_path)], ema_decay=None)
    plain.fit(num_steps=2)
    with_ema, _ = make_trainer([CheckpointCallback(tmp_path)], accumulate_steps=1)
    with pytest.raises(CheckpointMismatchError, match=r"step.ema_decay: saved \(not set\), this run 0.9"):
        with_ema.fit(num_steps=3)
    # Resumed anyway with allow_config_change, the missing item is still named.
    setup = make_setup(batch_size=8)
    anyway = Trainer(setup.model, optax.adam(5e-2), setup.pipeline, loss_fn, ema_decay=DECAY,
                     allow_config_change=True, callbacks=[CheckpointCallback(tmp_path)])
    with pytest.raises(CheckpointMismatchError,
                       match=r"holds the optional training state \[\], this run has \['ema'\]"):
        anyway.fit(num_steps=3)
    assert leaves(setup.model)  # untouched objects remain usable
