"""The train step's gradient accumulation: k micro-batches in one jitted step equal one big batch."""

from __future__ import annotations

import numpy as np
import optax
import pytest
from trainer_helpers import METRICS, leaves, loss_fn, make_setup

from datarax.train import PerClassAccuracy, Trainer

# A Metric (sums over the batch) is added over the micro-batches; a metric function (a per-record
# mean) and the loss are averaged over them.
STEP_METRICS = {**METRICS, "per_class": PerClassAccuracy(3, labels="y")}
CASES = [  # (optimizer, accumulate_steps, joint)
    ("sgd", 4, False),
    ("adam", 2, False),
    ("adam", 4, True),
]


def optimizer(name: str):
    return optax.sgd(0.1) if name == "sgd" else optax.adam(1e-2)


def run(accumulate_steps: int, name: str, joint: bool, steps: int = 4):
    setup = make_setup(batch_size=32, num_records=64)
    trainer = Trainer(setup.model, optimizer(name), setup.pipeline, loss_fn, metrics=STEP_METRICS,
                      train_pipeline_params=joint, accumulate_steps=accumulate_steps)
    metrics = [trainer.fit(num_steps=step).metrics for step in range(1, steps + 1)]
    return trainer, setup, metrics


@pytest.mark.parametrize("name, k, joint", CASES)
def test_k_micro_batches_equal_one_big_batch(name, k, joint):
    big, big_setup, big_metrics = run(1, name, joint)
    acc, acc_setup, acc_metrics = run(k, name, joint)
    assert acc.step == big.step == 4
    for x, y in zip(leaves(acc_setup.model), leaves(big_setup.model)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    if joint:
        for x, y in zip(leaves(acc_setup.pipeline), leaves(big_setup.pipeline)):
            if np.issubdtype(x.dtype, np.floating):
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    assert int(acc.optimizer.step[...]) == int(big.optimizer.step[...]) == 4  # one update per step, not per micro
    for m_acc, m_big in zip(acc_metrics, big_metrics):
        assert m_acc.keys() == m_big.keys()
        for key in m_big:
            assert m_acc[key] == pytest.approx(m_big[key], rel=1e-5, abs=1e-6), key


def test_a_batch_size_that_does_not_divide_is_refused_naming_both():
    setup = make_setup(batch_size=30, num_records=60)
    with pytest.raises(ValueError, match=r"accumulate_steps=4 must divide the training pipeline's batch_size=30"):
        Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn, accumulate_steps=4)
    with pytest.raises(ValueError, match=r"accumulate_steps must be an int >= 1 \(micro-batches per step\), got 0"):
        Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn, accumulate_steps=0)


def test_the_batch_is_really_split_a_non_mean_loss_differs():
    """Control: a loss that is no per-record mean (the worst record's) is not the big batch's."""

    def worst(model, batch):
        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).max()

    results = []
    for k in (1, 4):
        setup = make_setup(batch_size=32, num_records=64)
        Trainer(setup.model, optax.sgd(0.1), setup.pipeline, worst, accumulate_steps=k).fit(num_steps=1)
        results.append(leaves(setup.model))
    assert any(not np.allclose(x, y, rtol=1e-3) for x, y in zip(*results))


@pytest.mark.parametrize("accumulate_steps", [1, 2])
def test_batch_norm_statistics_train_and_match_a_numpy_running_average(accumulate_steps):
    """A BatchNorm in train mode updates its running statistics inside the step (as flax's own
    training loop would), once per micro-batch, equal to the running average computed by hand."""
    import jax.numpy as jnp
    from flax import nnx

    from datarax import Pipeline
    from datarax.sources import MemorySource, MemorySourceConfig

    class Net(nnx.Module):
        def __init__(self):
            self.norm = nnx.BatchNorm(4, momentum=0.9, rngs=nnx.Rngs(0))
            self.head = nnx.Linear(4, 3, rngs=nnx.Rngs(1))

        def __call__(self, x):
            return self.head(self.norm(x))

    rng = np.random.default_rng(0)
    data = {"x": (rng.normal(size=(64, 4)) * [1, 2, 3, 4] + [5, -1, 0, 2]).astype(np.float32),
            "y": rng.integers(0, 3, 64).astype(np.int32)}

    def pipeline():
        return Pipeline(MemorySource(MemorySourceConfig(shuffle=True, seed=0), data=data), batch_size=16)

    def xent(model, batch):
        return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()

    model = Net()
    model.train()
    trainer = Trainer(model, optax.adam(1e-2), pipeline(), xent, compilation_cache=False,
                      accumulate_steps=accumulate_steps)
    trainer.fit(num_steps=6)
    trainer.close()
    mean, var = np.zeros(4), np.ones(4)
    for batch in list(pipeline().epochs(2))[:6]:  # 4 batches an epoch
        for micro in np.split(np.asarray(batch["x"], np.float64), accumulate_steps):
            mean = 0.9 * mean + 0.1 * micro.mean(0)
            var = 0.9 * var + 0.1 * micro.var(0)
    np.testing.assert_allclose(np.asarray(model.norm.mean[...]), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(model.norm.var[...]), var, rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(model.head.kernel[...]), np.asarray(Net().head.kernel[...]))  # it trained
    assert jnp.isfinite(trainer.evaluate(pipeline())["loss"])


@pytest.mark.parametrize("k", [1, 3, 17])  # traced one after the other up to 16 on the CPU, a scan past it
def test_accumulate_is_lax_scan(k):
    import jax
    import jax.numpy as jnp

    from datarax.train.loop.step import accumulate

    def micro_step(carry, micro):
        total, count = carry
        return (total + micro["x"].sum(0), count + 1), {"mean": micro["x"].mean(), "row": micro["x"][0]}

    xs = {"x": jnp.arange(k * 4 * 2, dtype=jnp.float32).reshape(k, 4, 2)}
    carry = (jnp.zeros(2), jnp.asarray(0))
    want = jax.lax.scan(micro_step, carry, xs)
    got = jax.jit(lambda c, m: accumulate(micro_step, c, m, k))(carry, xs)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_loss_of_one_value_per_record_trains_as_its_mean():
    """`loss_fn` may return shape (batch,): the step trains on the mean, bitwise as `.mean()` in the loss."""
    def per_record(model, batch):
        logits = model(batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]), logits

    states = []
    for fn in (per_record, loss_fn):
        setup = make_setup()
        trainer = Trainer(setup.model, optax.sgd(0.1), setup.pipeline, fn, accumulate_steps=2)
        trainer.fit(num_steps=3)
        states.append(leaves(setup.model))
    for got, want in zip(*states):
        np.testing.assert_array_equal(got, want)
