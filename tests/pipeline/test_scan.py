"""ScanRunner against the per-step Python loop it replaces."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.core.operator import BatchContext, OperatorConfig, PerRecordOperator
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.pipeline.scan import ScanBatch, ScanRunner, scan_epoch
from datarax.sources import MemorySource, MemorySourceConfig


def noisy(element, key):
    return element.update_data({"x": element.data["x"] + 0.1 * jax.random.normal(key, element.data["x"].shape)})


class Gain(PerRecordOperator):
    """A learnable pipeline stage: x -> x * gain."""

    def __init__(self):
        self._init_rng(OperatorConfig(), None)
        self.gain = nnx.Param(jnp.ones((4,)))

    def apply_element(self, element, key):
        return element.update_data({"x": element.data["x"] * self.gain[...]})


def make_pipeline(n=37, drop_remainder=False, resident=True, learnable=False):
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(n, 4)).astype(np.float32), "y": rng.integers(0, 3, n).astype(np.int32),
            "id": np.arange(n, dtype=np.int32)}
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=1, device_resident=resident), data=data)
    stages = [ElementOperator(ElementOperatorConfig(stochastic=True), fn=noisy, rngs=nnx.Rngs(2))]
    if learnable:
        stages.append(Gain())
    return Pipeline(source, stages=stages, batch_size=8, drop_remainder=drop_remainder)


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(4, 8, rngs=rngs)
        self.out = nnx.Linear(8, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))


def model_and_optimizer():
    model = MLP(nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.adam(0.05), wrt=nnx.Param)


def loss_of(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def train_step(model, optimizer, batch):
    loss, grads = nnx.value_and_grad(loss_of)(model, batch)
    optimizer.update(model, grads)
    return loss


def params(model):
    return jax.tree.leaves(nnx.state(model, nnx.Param))


def assert_params_close(a, b):
    for x, y in zip(params(a), params(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def loop(iterator, model, optimizer, step=train_step):
    jitted = nnx.jit(step)
    return np.array([jitted(model, optimizer, batch) for batch in iterator])


@pytest.mark.parametrize("steps_per_call", [2, 5])
def test_scanned_epochs_match_the_per_step_loop(steps_per_call):
    # 37 records, batch 8: four full batches and a short one per epoch; two epochs in one iterator.
    ref_model, ref_opt = model_and_optimizer()
    want = loop(make_pipeline().epochs(2), ref_model, ref_opt)
    model, opt = model_and_optimizer()
    it = make_pipeline().epochs(2)
    got = ScanRunner(train_step, steps_per_call=steps_per_call).run(it, model, opt)
    assert got.shape == (10,)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert_params_close(model, ref_model)
    assert it.get_state() == dict(it.get_state(), epoch=1, position=37)
    with pytest.raises(StopIteration):
        next(it)


def test_scan_sees_exactly_the_batches_of_the_loop():
    def capture(model, optimizer, batch):
        train_step(model, optimizer, batch)
        return batch

    want = list(make_pipeline(drop_remainder=True))
    got = scan_epoch(make_pipeline(drop_remainder=True), capture, *model_and_optimizer())
    assert got["x"].shape == (4, 8, 4)
    for i, batch in enumerate(want):
        np.testing.assert_array_equal(got["id"][i], batch["id"])
        np.testing.assert_array_equal(got["y"][i], batch["y"])
        np.testing.assert_allclose(got["x"][i], batch["x"], rtol=1e-6, atol=1e-7)


def test_iterator_state_after_a_chunk_equals_the_loop_and_iteration_continues():
    scanned, stepped = make_pipeline().epochs(1), make_pipeline().epochs(1)
    ScanRunner(train_step, steps_per_call=2).run(scanned, *model_and_optimizer(), num_steps=3)
    for _ in range(3):
        next(stepped)
    assert scanned.get_state() == stepped.get_state()
    for a, b in zip(scanned, stepped, strict=True):
        np.testing.assert_array_equal(a["id"], b["id"])


def joint_setup(learnable=True):
    pipeline = make_pipeline(n=32, learnable=learnable)
    model = MLP(nnx.Rngs(0))
    joint = nnx.Dict(program=pipeline.program, model=model)
    optimizer = nnx.Optimizer(joint, optax.sgd(0.5), wrt=nnx.Param)
    return pipeline, joint, optimizer


def joint_step(joint, optimizer, batch: ScanBatch):
    def loss_fn(joint):
        return loss_of(joint["model"], batch.transform(joint["program"]))

    loss, grads = nnx.value_and_grad(loss_fn)(joint)
    optimizer.update(joint, grads)
    return loss


def test_gradients_reach_model_and_pipeline_parameters_in_the_scan():
    pipeline, joint, optimizer = joint_setup()
    losses = ScanRunner(joint_step, steps_per_call=4, raw=True).run(iter(pipeline), joint, optimizer)

    # The same steps by hand: sampler indices, host gather, pipeline.transform semantics.
    ref_pipeline, ref_joint, ref_opt = joint_setup()
    step = nnx.jit(joint_step)
    sampler, source = ref_pipeline.sampler, ref_pipeline.source
    want = []
    for start in range(0, 32, 8):
        ids = sampler.indices(np.arange(start, start + 8), 0).astype(np.int32)
        batch = ScanBatch({k: jnp.asarray(v) for k, v in source.get_batch(ids).items()},
                          BatchContext.for_batch(8, epoch=0, record_ids=ids))
        want.append(step(ref_joint, ref_opt, batch))
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    gain = pipeline.program.stages[1].gain[...]
    assert not np.allclose(gain, 1.0)  # the pipeline's parameter was trained
    np.testing.assert_allclose(gain, ref_pipeline.program.stages[1].gain[...], rtol=1e-5, atol=1e-6)
    assert_params_close(joint["model"], ref_joint["model"])


def test_runner_reuses_its_compiled_scan_across_epochs():
    pipeline = make_pipeline(n=32)
    runner = ScanRunner(train_step, steps_per_call=4)
    model, opt = model_and_optimizer()
    runner.run(iter(pipeline), model, opt)
    runner.run(iter(pipeline), model, opt)
    assert len(runner._compiled) == 1


ERRORS = [
    (lambda: ScanRunner(train_step, steps_per_call=0), ValueError, r"steps_per_call must be an int >= 1, got 0"),
    (lambda: ScanRunner(train_step, steps_per_call=2, raw="yes"), TypeError, r"raw must be True or False"),
    (lambda: ScanRunner("step", steps_per_call=2), TypeError, r"train_step must be callable"),
    (lambda: ScanRunner(train_step, steps_per_call=2).run(iter(make_pipeline(resident=False)), *model_and_optimizer()),
     ValueError, r"ScanRunner needs a device-resident source .* MemorySourceConfig\(device_resident=True\)"),
    (lambda: ScanRunner(train_step, steps_per_call=2).run(make_pipeline().epochs(None), *model_and_optimizer()),
     ValueError, r"this iterator is endless \(pipeline.epochs\(None\)\), so run\(\) needs num_steps"),
    (lambda: ScanRunner(train_step, steps_per_call=2).run(iter(make_pipeline()), *model_and_optimizer(), num_steps=-1),
     ValueError, r"num_steps must be an int >= 0 or None"),
    (lambda: ScanRunner(train_step, steps_per_call=2).run([1, 2], *model_and_optimizer()),
     TypeError, r"iterator must be a PipelineIterator"),
    (lambda: ScanRunner(train_step, steps_per_call=2).run(iter(make_pipeline()), MLP(nnx.Rngs(0)), 0.1),
     TypeError, r"modules\[1\] must be an nnx.Module"),
]


@pytest.mark.parametrize("make,error,message", ERRORS)
def test_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_outputs_with_batch_shaped_values_and_a_short_batch_are_a_clear_error():
    def capture(model, optimizer, batch):
        return batch["x"]

    with pytest.raises(ValueError, match=r"train_step outputs change shape between steps .* drop_remainder=True"):
        scan_epoch(make_pipeline(n=12), capture, *model_and_optimizer())
