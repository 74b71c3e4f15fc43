"""Device storage layout: records stored lane-dense (as on a TPU) give the same batches, specs and
states as records stored in their own shape, through every program that gathers them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.core import layout
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.pipeline.caching import CachingIterator
from datarax.pipeline.scan import ScanRunner
from datarax.sources import MemorySource, MemorySourceConfig


@pytest.mark.parametrize("shape, backend, expected", [
    ((32, 32, 3), "tpu", True), ((28, 28), "tpu", True), ((8, 128), "tpu", False), ((4, 256), "tpu", False),
    ((3072,), "tpu", False), ((), "tpu", False), ((96, 96, 3), "tpu", True), ((128, 128, 3), "tpu", False),
    ((256, 256, 3), "tpu", False), ((32, 32, 3), "cpu", False), ((32, 32, 3), "gpu", False)])
def test_records_are_lane_dense_on_a_tpu_only_when_small_and_their_last_axis_wastes_lanes(shape, backend, expected):
    assert layout.lane_dense(shape, backend) is expected
    stored = layout.to_storage(np.zeros((5, *shape), np.uint8), backend)
    assert stored.shape == ((5, int(np.prod(shape))) if expected else (5, *shape))


def jitter(element, key):
    image = element.data["image"].astype(jnp.float32) / 255.0
    return element.update_data({"image": image + jax.random.uniform(key, image.shape)})


def data(n=37):
    rng = np.random.default_rng(0)
    return {"image": rng.integers(0, 256, (n, 6, 5, 3), dtype=np.uint8), "mask": rng.random((n, 6, 5)) > 0.5,
            "label": np.arange(n, dtype=np.int32)}


def build(**kw) -> Pipeline:
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=3), data=data())
    stage = ElementOperator(ElementOperatorConfig(stochastic=True), fn=jitter, rngs=nnx.Rngs(1))
    return Pipeline(source, [stage], batch_size=8, **kw)


@pytest.fixture
def lane_dense(monkeypatch):
    """Stores every multi-axis record lane-dense, as a TPU does."""
    monkeypatch.setattr(layout, "lane_dense", lambda shape, backend=None: len(shape) >= 2)


def batches(pipeline: Pipeline, epochs: int = 2) -> list[dict]:
    return [jax.device_get(b) for b in pipeline.epochs(epochs)]


def assert_same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for k in w:
            assert g[k].dtype == w[k].dtype
            np.testing.assert_array_equal(g[k], w[k])


@pytest.mark.parametrize("per_dispatch", [1, 4])
def test_lane_dense_storage_changes_no_batch_spec_or_state(request, per_dispatch):
    plain = build(batches_per_dispatch=per_dispatch)
    want = batches(plain)
    request.getfixturevalue("lane_dense")
    dense = build(batches_per_dispatch=per_dispatch)
    assert dense.source.device_arrays()["image"].shape == (37, 90)
    assert dense.source.device_arrays()["mask"].shape == (37, 30)
    assert dense.source.device_arrays()["label"].shape == (37,)
    assert dense.source.element_spec() == plain.source.element_spec()
    assert dense.output_spec() == plain.output_spec()
    assert dense.fingerprint == plain.fingerprint
    assert_same(batches(dense), want)


def test_scan_and_cache_gather_lane_dense_records(lane_dense):
    expected = [np.asarray(b["image"]).sum() for b in batches(build(), 1)]
    got = ScanRunner(lambda batch: batch["image"].sum(), steps_per_call=2).run(iter(build()))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)

    def two_stages():
        source = MemorySource(MemorySourceConfig(shuffle=True, seed=3), data=data())
        halve = ElementOperator(ElementOperatorConfig(), fn=lambda el: el.update_data({"mask": ~el.data["mask"]}))
        return Pipeline(source, [halve, ElementOperator(ElementOperatorConfig(stochastic=True), fn=jitter,
                                                        rngs=nnx.Rngs(1))], batch_size=8)

    cached = CachingIterator(two_stages(), num_cached_stages=1, num_epochs=1)
    assert_same([jax.device_get(b) for b in cached], batches(two_stages(), 1))
