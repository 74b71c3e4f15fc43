"""FSDP-style parameter sharding (`Trainer(param_sharding="fsdp")`) on 8 fake CPU devices.

References: the same training replicated on the same mesh (the loss curve and final parameters
within float tolerance: only the order of XLA's reductions differs), and for a resume, an
uninterrupted 8-device run (the records trained on after the resume are the same, exactly; the
parameters within tolerance, since 4 or 1 devices sum gradients in another order).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from datarax import Pipeline
from datarax.sharding import DataSharding
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer
from datarax.train.callbacks import Callback, CheckpointCallback
from datarax.train.loop.param_sharding import fsdp_spec, sharding_summary, state_shardings

NUM_RECORDS, BATCH = 96, 16  # 6 steps an epoch


def data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM_RECORDS, 8)).astype(np.float32)
    return {"x": x, "y": (x @ rng.normal(size=(8, 8)) + 0.1).astype(np.float32),
            "rid": np.arange(NUM_RECORDS, dtype=np.int32)}


def make_model() -> nnx.Module:
    # kernels (8, 32), (32, 32), (32, 8) and biases (32,), (32,), (8,): all divisible by 8 and 4
    return nnx.Sequential(nnx.Linear(8, 32, rngs=nnx.Rngs(0)), nnx.tanh, nnx.Linear(32, 32, rngs=nnx.Rngs(1)),
                          nnx.tanh, nnx.Linear(32, 8, rngs=nnx.Rngs(2)))


def loss_fn(model, batch):
    err = jnp.sum((model(batch["x"]) - batch["y"]) ** 2, axis=-1)
    return jnp.mean(err)


class Record(Callback):
    """Each step's loss and the sum of the record ids it trained on."""

    def __init__(self):
        self.losses, self.rids = {}, {}

    def on_step_end(self, trainer, logs):
        if logs.metrics:
            self.losses[logs.metrics_step] = logs.metrics["loss"]
            self.rids[logs.metrics_step] = logs.metrics["rid_sum"]

    def on_train_end(self, trainer, logs):
        self.losses[logs.metrics_step] = logs.metrics["loss"]
        self.rids[logs.metrics_step] = logs.metrics["rid_sum"]


def trainer(devices: int, mode: str | None, callbacks=(), steps_per_execution: int = 1) -> Trainer:
    sharding = DataSharding.data_parallel(jax.devices()[:devices])
    pipeline = Pipeline(MemorySource(MemorySourceConfig(shuffle=True, seed=3), data=data()), [], batch_size=BATCH,
                        sharding=sharding)
    return Trainer(make_model(), optax.adam(0.02), pipeline, loss_fn, callbacks=callbacks, param_sharding=mode,
                   metrics={"rid_sum": lambda batch, aux: jnp.sum(batch["rid"]).astype(jnp.float32)},
                   compilation_cache=False, steps_per_execution=steps_per_execution)


@pytest.mark.parametrize("shape, size, spec", [
    ((16, 32), 8, P(None, "data")), ((32, 16), 8, P("data")), ((32, 32), 8, P("data")), ((10,), 8, P()),
    ((), 8, P()), ((3, 5), 2, P()), ((6, 4), 2, P("data")), ((8, 16), 1, P()), ((4, 4), 8, P())])
def test_the_largest_dimension_the_axis_divides_is_cut(shape, size, spec):
    assert fsdp_spec(shape, "data", size) == spec


def test_fsdp_trains_like_the_replicated_run_with_each_array_cut_eight_ways():
    replicated_log, fsdp_log = Record(), Record()
    replicated, fsdp = trainer(8, "replicated", [replicated_log]), trainer(8, "fsdp", [fsdp_log])
    layout = sharding_summary(fsdp._binding.values(), fsdp.state_shardings)
    replicated.fit(num_steps=12)
    fsdp.fit(num_steps=12)
    assert sorted(fsdp_log.losses) == list(range(1, 13))
    for step, loss in replicated_log.losses.items():
        np.testing.assert_allclose(fsdp_log.losses[step], loss, rtol=2e-5, err_msg=f"step {step}")
    assert fsdp_log.rids == replicated_log.rids
    for a, b in zip(jax.tree.leaves(nnx.state(replicated.model, nnx.Param)),
                    jax.tree.leaves(nnx.state(fsdp.model, nnx.Param))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-6)
    # After training, each parameter and each of Adam's moments is still cut over the 8 devices.
    for value in jax.tree.leaves(nnx.state(fsdp.model, nnx.Param)) + jax.tree.leaves(nnx.state(fsdp.optimizer)):
        if value.ndim:  # the step count is a scalar: replicated
            assert value.sharding.spec != P() and len(value.sharding.device_set) == 8, value.shape
            assert value.addressable_shards[0].data.size * 8 == value.size
    # params (8*32+32+32*32+32+32*8+8) and Adam's mu and nu cut 8 ways; the step count and the
    # optimizer's own counters replicated
    assert layout["sharded"] == 18 and layout["bytes_per_device"] < layout["bytes"] / 7


def test_a_checkpoint_written_on_eight_devices_resumes_on_four_and_on_one(tmp_path):
    reference = Record()
    trainer(8, "fsdp", [reference]).fit(num_steps=10)
    first = Record()
    trainer(8, "fsdp", [first, CheckpointCallback(tmp_path / "ckpt", every_steps=4)]).fit(num_steps=4)
    for devices, mode in ((4, "fsdp"), (1, None)):
        folder = tmp_path / f"on-{devices}"
        import shutil

        shutil.copytree(tmp_path / "ckpt", folder)
        log, checkpoints = Record(), CheckpointCallback(folder, every_steps=100)
        resumed = trainer(devices, mode, [log, checkpoints])
        resumed.fit(num_steps=10)
        assert checkpoints.restored.step == 4
        # the same records after the resume, exactly; the same loss curve within float tolerance
        assert {s: log.rids[s] for s in range(5, 11)} == {s: reference.rids[s] for s in range(5, 11)}
        for step in range(5, 11):
            np.testing.assert_allclose(log.losses[step], reference.losses[step], rtol=1e-4, err_msg=f"{devices}")
        kernel = resumed.model.layers[0].kernel.get_value()
        assert len(kernel.sharding.device_set) == devices


@pytest.mark.parametrize("mode", ["fsdp", "replicated"])
def test_calls_of_three_steps_train_as_single_steps_and_keep_the_layout(mode):
    single, many = Record(), Record()
    reference, trainer3 = trainer(8, mode, [single]), trainer(8, mode, [many], steps_per_execution=3)
    reference.fit(num_steps=11)
    trainer3.fit(num_steps=11)
    assert sorted(many.rids) == [3, 6, 9, 11]  # the last step of each call (11: two single steps)
    assert many.rids == {step: single.rids[step] for step in many.rids}
    for a, b in zip(jax.tree.leaves(nnx.state(reference.model)), jax.tree.leaves(nnx.state(trainer3.model))):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
        assert b.sharding == a.sharding


def test_an_annotated_variable_keeps_its_own_spec():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    with jax.set_mesh(mesh):
        model = nnx.Linear(32, 16, rngs=nnx.Rngs(0),
                           kernel_init=nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "data")))
    shardings = dict(zip([path for path, _ in nnx.to_flat_state(nnx.state(model))],
                         state_shardings(model, mesh, "data", "fsdp")))
    # the annotation, not the rule's P("data") (32 is the larger dimension of the (32, 16) kernel)
    assert shardings[("kernel",)].spec == P(None, "data")
    assert shardings[("bias",)].spec == P("data")


def test_param_sharding_needs_a_sharded_pipeline_and_a_known_mode():
    pipeline = Pipeline(MemorySource(MemorySourceConfig(shuffle=True), data=data()), [], batch_size=BATCH)
    with pytest.raises(ValueError, match=r"param_sharding='fsdp' lays the training state out over the training "
                                         r"pipeline's mesh, but train_pipeline has no sharding"):
        Trainer(make_model(), optax.adam(0.01), pipeline, loss_fn, param_sharding="fsdp")
    with pytest.raises(ValueError,
                       match=r"param_sharding must be one of \('replicated', 'fsdp'\) or None, got 'zero3'"):
        Trainer(make_model(), optax.adam(0.01), pipeline, loss_fn, param_sharding="zero3")
