"""The precision policy: bf16 and f16 train within a stated tolerance of f32; f16's dynamic loss
scale skips an overflowing step, halves, grows back, and is checkpointed."""

from __future__ import annotations

import shutil

import jax.numpy as jnp
import numpy as np
import optax
import pytest
from trainer_helpers import assert_bitwise_equal, leaves, loss_fn, make_setup, points

from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer
from datarax.train.callbacks import CheckpointCallback
from datarax.train.loop.precision import GROWTH_INTERVAL, INITIAL_SCALE, LossScale, next_scale

STEPS = 30
# Measured on this model (a 4 -> 3 linear classifier, adam(1e-2), batch 16, 30 steps): the largest
# parameter difference from f32 was 4.5e-4 under bf16 and 8.8e-5 under f16 (parameters up to ~1).
TOLERANCE = {"bf16": 2e-3, "f16": 5e-4}


def train(precision: str, steps: int = STEPS, source=None, callbacks=()):
    setup = make_setup(batch_size=16, num_records=64, source=source)
    trainer = Trainer(setup.model, optax.adam(1e-2), setup.pipeline, loss_fn, eval_pipeline=setup.eval_pipeline,
                      precision=precision, callbacks=callbacks)
    result = trainer.fit(num_steps=steps)
    return trainer, setup, result


@pytest.fixture(scope="module")
def f32():
    _, setup, result = train("f32")
    return leaves(setup.model), result.metrics


@pytest.mark.parametrize("precision", ["bf16", "f16"])
def test_low_precision_trains_within_the_stated_tolerance_of_f32(precision, f32):
    params, metrics = f32
    trainer, setup, result = train(precision)
    for low, full in zip(leaves(setup.model), params):
        assert low.dtype == np.float32  # master parameters stay float32
        np.testing.assert_allclose(low, full, atol=TOLERANCE[precision])
    assert result.metrics["loss"] == pytest.approx(metrics["loss"], rel=1e-2)
    assert trainer.optimizer.step[...] == STEPS


@pytest.mark.parametrize("scale, good, finite, expected", [
    (2.0**15, 0, True, (2.0**15, 1)),
    (2.0**15, GROWTH_INTERVAL - 1, True, (2.0**16, 0)),   # grows after GROWTH_INTERVAL finite steps
    (2.0**15, 17, False, (2.0**14, 0)),                   # halves on an overflow and starts counting again
    (1.0, 0, False, (1.0, 0)),                            # never below 1
])
def test_next_scale(scale, good, finite, expected):
    new, count = next_scale(jnp.float32(scale), jnp.int32(good), jnp.asarray(finite))
    assert (float(new), int(count)) == expected


def test_f16_skips_an_overflowing_step_halves_the_scale_and_recovers():
    """One record's x is 1e5, past float16's largest value (65504): every step whose batch holds it
    has non-finite gradients, is skipped (parameters and optimizer state unchanged), and halves the
    scale; the steps around it train normally."""
    data = points(64)
    bad = 5
    data["x"][bad] = 1e5
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=5), data=data)
    setup = make_setup(batch_size=16, num_records=64, source=source)
    seen = {"bad": lambda batch, _: (batch["rid"] == bad).any().astype(jnp.float32)}
    trainer = Trainer(setup.model, optax.adam(1e-2), setup.pipeline, loss_fn, precision="f16", metrics=seen)
    skipped, expected_scale = [], INITIAL_SCALE
    for step in range(1, 10):
        before, count = leaves(setup.model), int(trainer.optimizer.step[...])
        metrics = trainer.fit(num_steps=step).metrics
        after = leaves(setup.model)
        assert metrics["loss_scale"] == expected_scale
        if metrics["bad"]:
            skipped.append(step)
            assert not np.isfinite(metrics["loss"])
            assert all(np.array_equal(a, b) for a, b in zip(after, before))
            assert int(trainer.optimizer.step[...]) == count
            expected_scale /= 2
        else:
            assert np.isfinite(metrics["loss"])
            assert any(not np.array_equal(a, b) for a, b in zip(after, before))
            assert int(trainer.optimizer.step[...]) == count + 1
        assert float(trainer.loss_scale.scale[...]) == expected_scale
    # Once per epoch of 4 steps: steps 1-4, 5-8 and 9 are three epochs.
    assert sorted((step - 1) // 4 for step in skipped) == [0, 1, 2]
    assert all(np.isfinite(x).all() for x in leaves(setup.model))


def test_f16_resume_restores_the_loss_scale_bitwise(tmp_path):
    full, full_setup, _ = train("f16", steps=8)
    train("f16", steps=7, callbacks=[CheckpointCallback(tmp_path, every_steps=3)])
    shutil.rmtree(tmp_path / "7")
    ckpt = CheckpointCallback(tmp_path, every_steps=3)
    resumed, resumed_setup, _ = train("f16", steps=8, callbacks=[ckpt])
    assert ckpt.restored.step == 6 and (tmp_path / "6" / "loss_scale").is_dir()
    assert_bitwise_equal(full_setup.model, resumed_setup.model)
    assert_bitwise_equal(full.loss_scale, resumed.loss_scale)
    assert int(resumed.loss_scale.good_steps[...]) == 8


def test_a_bad_precision_is_refused():
    setup = make_setup()
    with pytest.raises(ValueError, match=r"precision must be one of .*'f32', 'bf16', 'f16'.*got 'fp8'"):
        Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn, precision="fp8")
    assert LossScale().scale[...] == INITIAL_SCALE


@pytest.mark.parametrize("precision, dtype", [("bf16", jnp.bfloat16), ("f16", jnp.float16)])
def test_the_loss_is_computed_in_float32_from_the_low_precision_outputs(precision, dtype):
    """The reported loss is a float32 mean over the model's low-precision logits (cast up first),
    not a mean rounded to bfloat16/float16: against optax in float32 on the same logits."""
    from flax import nnx

    from datarax import Pipeline

    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(64, 8)).astype(np.float32), "y": rng.integers(0, 5, 64).astype(np.int32)}
    model = nnx.Linear(8, 5, rngs=nnx.Rngs(0))

    def xent(model, batch):
        return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()

    params = {"kernel": model.kernel[...], "bias": model.bias[...]}  # before the step (it donates them)
    pipeline = Pipeline(MemorySource(data=data), [], batch_size=64)
    reported = Trainer(model, optax.sgd(0.0), pipeline, xent, precision=precision).fit(num_steps=1).metrics["loss"]
    logits = jnp.asarray(data["x"], dtype) @ params["kernel"].astype(dtype) + params["bias"].astype(dtype)
    reference = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), data["y"]).mean()
    assert reported == pytest.approx(float(reference), rel=1e-6)
    in_low = float(optax.softmax_cross_entropy_with_integer_labels(logits, data["y"]).mean())
    assert in_low != pytest.approx(float(reference), rel=1e-6)  # what a loss computed in `dtype` reports
    assert float(jnp.asarray(reported, dtype)) != reported  # a float32 value, not one rounded to `dtype`
