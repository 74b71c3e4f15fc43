"""A sharded pipeline in one process over the 8 fake CPU devices, against the unsharded pipeline.

The unsharded pipeline is the reference: a sharded one must hold the same records, with the same
augmentation, in the same global rows, laid out as `DataSharding.batch_sharding` says.
"""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from datarax import Pipeline
from datarax.batching import chunk_schedule
from datarax.core.operator import OperatorConfig, OperatorModule
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.sharding import DataSharding
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.typing import Element

# The per-record maths is the same whatever the layout, but XLA may vectorise a batch of 2 rows
# differently from one of 8: bitwise equal on some machines, 1 ulp apart on others (seen on a 16-core x86 box).
AUGMENT_TOL = dict(rtol=1e-6, atol=1e-6)


def noisy(element: Element, key: jax.Array) -> Element:
    return element.update_data({"x": element.data["x"] + jax.random.normal(key, element.data["x"].shape)})


def build(n=37, batch_size=8, resident=True, sharding=None, **kw) -> Pipeline:
    data = {"id": np.arange(n, dtype=np.int32), "x": np.arange(n * 3, dtype=np.float32).reshape(n, 3)}
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=4, device_resident=resident), data=data)
    op = ElementOperator(ElementOperatorConfig(stochastic=True), fn=noisy, rngs=nnx.Rngs(2))
    return Pipeline(source, [op], batch_size=batch_size, sharding=sharding, **kw)


def mesh(shape, names) -> Mesh:
    return Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), names)


CASES = {
    "1d-8dev-resident": dict(shape=(8,), names=("data",), axes="data", resident=True, n=37, batch_size=8),
    "2d-data-axis-host": dict(shape=(4, 2), names=("data", "model"), axes="data", resident=False, n=21, batch_size=8),
    "2d-both-axes-resident": dict(shape=(4, 2), names=("data", "model"), axes=("data", "model"), resident=True,
                                  n=21, batch_size=8),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_sharded_batches_are_the_unsharded_batches_as_global_arrays(case):
    sharding = DataSharding(mesh(case["shape"], case["names"]), case["axes"])
    n, batch_size = case["n"], case["batch_size"]
    pipeline = build(n, batch_size, case["resident"], sharding)
    reference = build(n, batch_size, case["resident"])
    assert len(pipeline) == len(reference)
    for _ in range(2):  # two epochs: new order, new augmentation
        want, got = list(reference), list(pipeline)
        assert len(got) == len(want)
        for ref, batch in zip(want, got):
            assert set(batch) == {"id", "x", "mask"}
            for leaf in batch.values():
                assert leaf.shape[0] == batch_size and leaf.sharding == sharding.batch_sharding
            valid = len(ref["id"])
            mask = np.asarray(batch["mask"])
            np.testing.assert_array_equal(mask, np.arange(batch_size) < valid)
            ids, x = np.asarray(batch["id"]), np.asarray(batch["x"])
            np.testing.assert_array_equal(ids[:valid], ref["id"])
            np.testing.assert_allclose(x[:valid], ref["x"], **AUGMENT_TOL)
            # Padding rows repeat the epoch's last record (positions are clipped to the epoch's end).
            np.testing.assert_array_equal(ids[valid:], np.full(batch_size - valid, ref["id"][-1]))
    if case["resident"]:  # the padded final batch reuses the compiled step
        assert pipeline.compiled.expand_gather_and_run._cache_size() == 1


def test_each_device_transforms_only_its_rows():
    sharding = DataSharding(mesh((4, 2), ("data", "model")), "data")
    batch = next(iter(build(sharding=sharding)))
    shards = batch["x"].addressable_shards
    assert len(shards) == 8 and {s.data.shape for s in shards} == {(2, 3)}
    for s in shards:  # the model axis holds replicas of the data axis's slice
        assert s.index[0] == slice(2 * (s.device.id // 2), 2 * (s.device.id // 2) + 2)


COLLECTIVES = re.compile(r"all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter")


def test_the_sharded_data_step_has_no_cross_device_collectives():
    """Each device samples, gathers and augments its rows alone: nothing waits on another device."""
    meta, ids = np.array([0, 0, 8], np.int32), np.arange(8, dtype=np.int32)
    resident = build(sharding=DataSharding.data_parallel())
    compiled, arrays = resident.compiled, resident.placement.device_arrays(resident.source.device_arrays())
    params = resident.sampler.device_params(0)
    metas = chunk_schedule(len(resident.sampler), resident.batch_size, compiled.chunk_batches,
                           drop_remainder=resident.drop_remainder, epoch=0, position=0)
    rows = compiled.sample_chunk(params, metas)
    programs = {
        "sample": compiled.sample_chunk.lower(params, metas),
        "expand+gather+stages": compiled.expand_gather_and_run.lower(compiled.values(), arrays, params, rows[0]),
        "gather+stages": compiled.gather_and_run.lower(compiled.values(), arrays, ids, meta),
    }
    host = build(resident=False, sharding=DataSharding.data_parallel())
    batch = host.placement.put(host.source.get_batch(ids))
    programs["stages"] = host.compiled.run.lower(host.compiled.values(), batch, ids, meta)
    for name, lowered in programs.items():
        assert COLLECTIVES.findall(lowered.compile().as_text()) == [], name


def test_drop_remainder_gives_full_batches_without_a_mask():
    sharding = DataSharding.data_parallel(mask_key=None)
    got = list(build(sharding=sharding, drop_remainder=True))
    want = list(build(drop_remainder=True))
    assert len(got) == len(want) == 37 // 8
    for batch, ref in zip(got, want):
        assert set(batch) == {"id", "x"}
        np.testing.assert_allclose(np.asarray(batch["x"]), ref["x"], **AUGMENT_TOL)


def test_output_spec_is_the_global_batch():
    sharding = DataSharding(mesh((4, 2), ("data", "model")), "data")
    pipeline = build(sharding=sharding)
    batch = next(iter(pipeline))
    spec = pipeline.output_spec()
    assert set(spec) == set(batch)
    for key, leaf in batch.items():
        assert (spec[key].shape, spec[key].dtype, spec[key].sharding) == (leaf.shape, leaf.dtype, leaf.sharding)


def test_state_is_layout_free_and_resumes_across_device_counts():
    one_device = build()
    eight = build(sharding=DataSharding.data_parallel())
    two = build(sharding=DataSharding(mesh((2,), ("data",)), "data"))
    assert one_device.fingerprint == eight.fingerprint == two.fingerprint
    full = [np.asarray(b["id"]) for b in one_device.epochs(2)]

    it = eight.epochs(2)
    for _ in range(6):  # into the second epoch
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    it.close()
    plain = build().epochs(2)
    for _ in range(6):
        next(plain)
    assert plain.get_state() == state  # so an unsharded pipeline's state resumes on a mesh as well
    for resumed in (plain, two.epochs(2)):  # 8 devices -> 1, and 8 -> 2
        resumed.set_state(state)
        rest = []
        for batch in resumed:
            mask = np.asarray(batch.get("mask", np.ones(len(batch["id"]), bool)))
            rest.append(np.asarray(batch["id"])[mask])
        assert len(rest) == len(full) - 6
        for got, want in zip(rest, full[6:]):
            np.testing.assert_array_equal(got, want)


class Centre(OperatorModule):
    """A batch-level stage: subtracts the batch mean."""

    def __init__(self):
        self.config = OperatorConfig()

    def apply_batch(self, elements: Element, ctx) -> Element:
        return elements.update_data({"x": elements.data["x"] - elements.data["x"].mean(axis=0)})


def test_a_batch_level_stage_sees_the_whole_global_batch_in_one_process():
    def pipeline(sharding=None):
        source = MemorySource(MemorySourceConfig(shuffle=True, seed=4), data={"x": np.arange(96.0).reshape(32, 3)})
        return Pipeline(source, [Centre()], batch_size=8, sharding=sharding)

    pairs = list(zip(pipeline(), pipeline(DataSharding.data_parallel())))
    assert len(pairs) == 4
    for a, b in pairs:
        np.testing.assert_allclose(np.asarray(b["x"]), np.asarray(a["x"]), atol=1e-5)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(batch_size=12, sharding=DataSharding.data_parallel()), ValueError,
     r"batch_size=12 does not split evenly over the 8 shards"),
    (dict(sharding=DataSharding.data_parallel(mask_key=None)), ValueError,
     r"DataSharding\(mask_key=None\) with drop_remainder=False: .* pass drop_remainder=True"),
    (dict(sharding=DataSharding.data_parallel(mask_key="id")), ValueError,
     r"already has a field 'id', the name DataSharding gives its padding mask; pass DataSharding\(mask_key="),
    (dict(sharding=NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))),
     TypeError, r"sharding must be a datarax.sharding.DataSharding, got NamedSharding; wrap your mesh"),
])
def test_bad_sharding_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        build(**kwargs)


def test_unsharded_pipeline_is_unchanged_by_the_hook():
    pipeline = build()
    assert pipeline.placement is None
    batches = list(pipeline)
    assert [len(b["id"]) for b in batches] == [8, 8, 8, 8, 5]
    assert all(isinstance(b["x"], jax.Array) and len(b["x"].devices()) == 1 for b in batches)
    assert jnp.issubdtype(batches[0]["x"].dtype, jnp.floating)


@pytest.mark.parametrize("resident", [True, False], ids=["device", "host"])
def test_a_warp_operator_computed_separately_gives_the_unsharded_batches(resident):
    """RotationOperator runs its warp as a separate computation (a conditional) on CPU; under the
    data sharding's partitioned program it still gives the unsharded pipeline's images."""
    from datarax.operators.image import RotationConfig, RotationOperator

    data = {"image": np.random.default_rng(3).random((20, 8, 8, 3)).astype(np.float32),
            "id": np.arange(20, dtype=np.int32)}

    def make(sharding=None):
        source = MemorySource(MemorySourceConfig(shuffle=True, seed=2, device_resident=resident), data=data)
        rotate = RotationOperator(RotationConfig(degrees=40.0), rngs=nnx.Rngs(5))
        return Pipeline(source, [rotate], batch_size=8, sharding=sharding, drop_remainder=True)

    plain = [np.asarray(b["image"]) for b in make()]
    sharded = [np.asarray(b["image"]) for b in make(DataSharding(mesh((4, 2), ("data", "model")), "data"))]
    assert len(plain) == len(sharded) == 2
    for a, b in zip(plain, sharded):
        np.testing.assert_allclose(b, a, atol=1e-6)
