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
from datarax.samplers import SlidingWindowSampler
from datarax.samplers.base import Sampler
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


TEMPLATE = None


def model_and_optimizer():
    """A fresh copy of one initial model and optimizer (initialising eagerly once keeps tests fast)."""
    global TEMPLATE
    if TEMPLATE is None:
        model = MLP(nnx.Rngs(0))
        TEMPLATE = (model, nnx.Optimizer(model, optax.sgd(0.2, momentum=0.9), wrt=nnx.Param))
    return nnx.clone(TEMPLATE[0]), nnx.clone(TEMPLATE[1])


def loss_of(model, batch):
    logits = model(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


STEP_TRACES = []  # one entry per trace of train_step (Python runs only while JAX traces it)


def train_step(model, optimizer, batch):
    STEP_TRACES.append(1)
    loss, grads = nnx.value_and_grad(loss_of)(model, batch)
    optimizer.update(model, grads)
    return loss


def params(model):
    return jax.tree.leaves(nnx.state(model, nnx.Param))


def assert_params_close(a, b):
    for x, y in zip(params(a), b, strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def reference():
    """The per-step Python loop over two epochs: losses, batches, states after each step, final params."""
    model, optimizer = model_and_optimizer()
    step = nnx.jit(train_step)
    it = make_pipeline().epochs(2)
    out = {"loss": [], "batches": [], "states": []}
    for batch in it:
        out["loss"].append(float(step(model, optimizer, batch)))
        out["batches"].append(jax.device_get(batch))
        out["states"].append(it.get_state())
    out["params"] = [np.asarray(x) for x in params(model)]
    return out


RUNNERS = {k: ScanRunner(train_step, steps_per_call=k) for k in (2, 5)}  # shared: one compile per K


@pytest.mark.parametrize("steps_per_call", [2, 5])
def test_scanned_epochs_match_the_per_step_loop(reference, steps_per_call):
    # 37 records, batch 8: four full batches and a short one per epoch; two epochs in one iterator.
    model, opt = model_and_optimizer()
    it = make_pipeline().epochs(2)
    runner = RUNNERS[steps_per_call]
    first = runner.run(it, model, opt, num_steps=7)  # stops mid-epoch 1, then picks up there
    assert it.get_state() == reference["states"][6]
    rest = runner.run(it, model, opt)
    assert first.shape == (7,) and rest.shape == (3,)
    np.testing.assert_allclose(np.concatenate([first, rest]), reference["loss"], rtol=1e-5)
    assert_params_close(model, reference["params"])
    assert it.get_state() == reference["states"][-1]
    traced = len(STEP_TRACES)  # a new runner over a new pipeline of the same structure reuses the compiled scan
    ScanRunner(train_step, steps_per_call=steps_per_call).run(make_pipeline().epochs(1), *model_and_optimizer())
    assert len(STEP_TRACES) == traced
    with pytest.raises(StopIteration):
        next(it)


def test_a_runner_keeps_its_own_scan_for_modules_no_shared_key_may_stand_for():
    model, opt = model_and_optimizer()
    model.tag = object()  # state of its own: the program cache shares nothing keyed by it
    runner = ScanRunner(train_step, steps_per_call=2)
    runner.run(make_pipeline().epochs(1), model, opt)
    traced = len(STEP_TRACES)
    runner.run(make_pipeline().epochs(1), model, opt)
    assert len(STEP_TRACES) == traced
    ScanRunner(train_step, steps_per_call=2).run(make_pipeline().epochs(1), model, opt)
    assert len(STEP_TRACES) > traced


def test_scan_sees_exactly_the_batches_of_the_loop(reference):
    def capture(model, optimizer, batch):
        train_step(model, optimizer, batch)
        return batch

    got = scan_epoch(make_pipeline(drop_remainder=True), capture, *model_and_optimizer())
    assert got["x"].shape == (4, 8, 4)
    for i, batch in enumerate(reference["batches"][:4]):  # epoch 0's full batches
        np.testing.assert_array_equal(got["id"][i], batch["id"])
        np.testing.assert_array_equal(got["y"][i], batch["y"])
        np.testing.assert_allclose(got["x"][i], batch["x"], rtol=1e-6, atol=1e-7)


def test_iteration_continues_per_step_after_a_scan_chunk(reference):
    it = make_pipeline().epochs(2)
    RUNNERS[2].run(it, *model_and_optimizer(), num_steps=3)
    assert it.get_state() == reference["states"][2]
    for want in reference["batches"][3:6]:
        np.testing.assert_array_equal(next(it)["id"], want["id"])


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
    assert_params_close(joint["model"], params(ref_joint["model"]))


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
     TypeError, r"modules\[1\] must be an NNX object \(an nnx.Module or nnx.Optimizer\), got float"),
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


class ReverseSampler(Sampler):
    """A user sampler with host indices only: records in reverse order."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def indices(self, positions, epoch):
        return self.n - 1 - np.asarray(positions, np.int64)


def test_any_sampler_can_be_scanned():
    source = MemorySource(data={"id": np.arange(24, dtype=np.int32)})
    pipeline = Pipeline(source, batch_size=8, sampler=ReverseSampler(24))
    ids = ScanRunner(lambda batch: batch["id"], steps_per_call=2).run(iter(pipeline))
    np.testing.assert_array_equal(ids, np.arange(24)[::-1].reshape(3, 8))


def test_a_window_sampler_can_be_scanned():
    """Its items are windows of records: the batch has a window axis after the batch axis."""
    source = MemorySource(data={"id": np.arange(24, dtype=np.int32)})
    pipeline = Pipeline(source, batch_size=4, sampler=SlidingWindowSampler(24, window=3, stride=2),
                        drop_remainder=True)
    ids = ScanRunner(lambda batch: batch["id"], steps_per_call=2).run(iter(pipeline))
    loop = np.stack([np.asarray(batch["id"]) for batch in pipeline])
    starts = 2 * np.arange(8).reshape(2, 4)  # window i covers records 2i, 2i + 1, 2i + 2
    np.testing.assert_array_equal(loop, starts[..., None] + np.arange(3))
    np.testing.assert_array_equal(ids, loop)


def test_nothing_to_run_returns_none_and_leaves_the_iterator():
    # An exhausted one-epoch iterator has nothing left to run.
    it = iter(Pipeline(MemorySource(data={"id": np.arange(5, dtype=np.int32)}), batch_size=4))
    list(it)
    state = it.get_state()
    assert ScanRunner(lambda batch: batch["id"], steps_per_call=2).run(it, num_steps=3) is None
    assert it.get_state() == state
    assert ScanRunner(train_step, steps_per_call=2).run(iter(make_pipeline()), *model_and_optimizer(),
                                                        num_steps=0) is None
