import contextlib
import io
import runpy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datarax import Pipeline
from datarax.operators import ElementOperator, ElementOperatorConfig, MapOperator, MapOperatorConfig
from datarax.pipeline.programs import PROGRAMS
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.typing import Element

ROOT = Path(__file__).resolve().parents[2]


def noisy(element: Element, key: jax.Array) -> Element:
    return element.update_data({"x": element.data["x"] + jax.random.normal(key, element.data["x"].shape)})


def make_data(n: int) -> dict:
    return {"id": np.arange(n, dtype=np.int32), "x": np.arange(n * 3, dtype=np.float32).reshape(n, 3)}


def build(n=50, batch_size=8, seed=0, resident=True, shuffle=True, stochastic=True, **kw) -> Pipeline:
    source = MemorySource(MemorySourceConfig(shuffle=shuffle, seed=seed, device_resident=resident), data=make_data(n))
    stages = [ElementOperator(ElementOperatorConfig(stochastic=True), fn=noisy,
                              rngs=nnx.Rngs(seed))] if stochastic else []
    return Pipeline(source=source, stages=stages, batch_size=batch_size, **kw)


def assert_same_up_to_rounding(a, b):
    """Equal to within 4 ulps. The same random draws computed by two differently compiled programs
    (another batch size, host vs device gather) can round one float differently on some CPUs
    (seen on AMD EPYC with AVX-512: 1 value in 180 off by 1 ulp); within one program, results are
    bitwise (the resume tests check that)."""
    a, b = np.asarray(a), np.asarray(b)
    if np.issubdtype(a.dtype, np.floating):
        np.testing.assert_array_max_ulp(a, b, maxulp=4)
    else:
        np.testing.assert_array_equal(a, b)


def collect(batches) -> dict:
    batches = list(batches)
    return {k: np.concatenate([np.asarray(b[k]) for b in batches]) for k in batches[0]}


def test_quickstart_example_runs_verbatim():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(ROOT / "examples" / "quickstart.py"), run_name="__main__")
    lines = out.getvalue().strip().splitlines()
    assert lines == [f"Batch {i}: images (32, 28, 28, 1), labels (32,)" for i in range(3)]


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("n,batch_size", [(50, 8), (64, 16), (7, 10)])
def test_shuffled_epochs_are_permutations(resident, n, batch_size):
    pipeline = build(n, batch_size, resident=resident)
    for _ in range(2):
        batches = list(pipeline)
        assert [len(b["id"]) for b in batches][:-1] == [batch_size] * (len(batches) - 1)
        ids = collect(batches)["id"]
        np.testing.assert_array_equal(np.sort(ids), np.arange(n))


def test_consecutive_epochs_differ_in_order_and_augmentation():
    pipeline = build(40, 8)
    e0, e1 = collect(pipeline), collect(pipeline)
    assert not np.array_equal(e0["id"], e1["id"])
    x0 = e0["x"][np.argsort(e0["id"])]
    x1 = e1["x"][np.argsort(e1["id"])]
    assert np.all(np.abs(x0 - x1).max(axis=1) > 1e-3)


def test_record_augmentation_is_independent_of_batch_size_and_residency():
    per_record = []
    for batch_size, resident in [(7, True), (32, False), (100, True)]:
        out = collect(build(60, batch_size, resident=resident))
        per_record.append(out["x"][np.argsort(out["id"])])
    for other in per_record[1:]:
        assert_same_up_to_rounding(per_record[0], other)


def test_record_augmentation_is_independent_of_shuffle_order():
    a = collect(build(30, 8, shuffle=True, seed=0))
    b = collect(build(30, 8, shuffle=False, seed=0))
    np.testing.assert_array_equal(a["x"][np.argsort(a["id"])], b["x"])


def test_host_and_device_paths_agree_batch_by_batch():
    for a, b in zip(build(45, 8, resident=True), build(45, 8, resident=False)):
        np.testing.assert_array_equal(np.asarray(a["id"]), np.asarray(b["id"]))
        for k in a:
            assert_same_up_to_rounding(a[k], b[k])


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("clone", ["deepcopy", "pickle"])
def test_a_copied_pipeline_continues_with_the_same_batches(resident, clone):
    import copy
    import pickle

    pipeline = build(21, 8, resident=resident)
    list(pipeline)  # compiled and one epoch in: the copy carries the epoch and builds its programs again
    copied = copy.deepcopy(pipeline) if clone == "deepcopy" else pickle.loads(pickle.dumps(pipeline))
    for a, b in zip(list(pipeline), list(copied), strict=True):
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))


@pytest.mark.parametrize("per_dispatch", [1, 4])
def test_final_short_batch_kept_or_dropped_and_never_recompiles(per_dispatch):
    # Pipelines of the same stages share programs process-wide: an earlier test's pipeline of
    # other lengths (in the same process, as on the chip's one-process run) would have added its
    # own compiles to the shared program's count.
    PROGRAMS.clear()
    pipeline = build(45, 8, batches_per_dispatch=per_dispatch)
    sizes = [len(b["id"]) for b in pipeline]
    assert sizes == [8] * 5 + [5]
    assert len(pipeline) == 6
    program = (pipeline.compiled.expand_gather_and_run if per_dispatch == 1
               else pipeline.compiled.expand_gather_and_run_many)
    assert program._cache_size() == 1
    assert pipeline.compiled.sample_chunk._cache_size() == 1
    dropped = build(45, 8, drop_remainder=True, batches_per_dispatch=per_dispatch)
    assert [len(b["id"]) for b in dropped] == [8] * 5 and len(dropped) == 5


def test_deterministic_pipeline_matches_numpy():
    source = MemorySource(data=make_data(10))
    double = MapOperator(MapOperatorConfig(fields=("x",)), fn=lambda x: x * 2)
    out = collect(Pipeline(source=source, stages=[double], batch_size=4))
    np.testing.assert_array_equal(out["x"], make_data(10)["x"] * 2)
    np.testing.assert_array_equal(out["id"], np.arange(10))


def test_epochs_iterator_streams_several_epochs_and_endless():
    pipeline = build(20, 8)
    ids = collect(pipeline.epochs(3))["id"]
    assert len(ids) == 60
    for e in range(3):
        np.testing.assert_array_equal(np.sort(ids[e * 20:(e + 1) * 20]), np.arange(20))
    endless = build(5, 4).epochs()
    assert len([next(endless) for _ in range(25)]) == 25
    with pytest.raises(ValueError, match="num_epochs must be a positive int or None"):
        pipeline.epochs(0)


def test_iterating_after_epochs_continues_with_the_next_epoch():
    a = build(20, 8)
    list(a.epochs(2))
    b = build(20, 8)
    list(b), list(b)
    np.testing.assert_array_equal(collect(a)["id"], collect(b)["id"])


def _resume_case(n, batch_size, k, seed, resident, drop):
    reference = build(n, batch_size, seed=seed, resident=resident, drop_remainder=drop)
    it = reference.epochs(2)
    full = list(it)
    k = k % (len(full) + 1)
    it = build(n, batch_size, seed=seed, resident=resident, drop_remainder=drop).epochs(2)
    for _ in range(k):
        next(it)
    state = it.get_state()
    it.close()
    import json
    state = json.loads(json.dumps(state))
    fresh = build(n, batch_size, seed=seed, resident=resident, drop_remainder=drop).epochs(2)
    fresh.set_state(state)
    rest = list(fresh)
    assert len(rest) == len(full) - k
    for got, want in zip(rest, full[k:]):
        for key in want:
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), batch_size=st.integers(1, 12), k=st.integers(0, 20), seed=st.integers(0, 2**40),
       resident=st.booleans(), drop=st.booleans())
def test_resume_gives_identical_next_batches(n, batch_size, k, seed, resident, drop):
    if drop and n < batch_size:
        return
    _resume_case(n, batch_size, k, seed, resident, drop)


def test_one_epoch_iterator_resume_sets_the_next_epoch():
    pipeline = build(20, 6)
    list(pipeline)
    it = iter(pipeline)  # epoch 1
    next(it)
    state = it.get_state()
    rest, following = list(it), collect(pipeline)
    fresh = build(20, 6)
    it2 = iter(fresh)
    it2.set_state(state)
    np.testing.assert_array_equal(collect(it2)["id"], collect(rest)["id"])
    np.testing.assert_array_equal(collect(fresh)["id"], following["id"])


def test_multi_epoch_iterator_resume_keeps_its_absolute_end_and_the_next_epoch():
    """`epochs(3)` resumed mid-epoch 1 ends after epoch 2, like the uninterrupted run; `for` then gives epoch 3."""
    pipeline = build(20, 6)
    it = pipeline.epochs(3)
    for _ in range(5):  # 4 batches per epoch: into epoch 1
        next(it)
    state = it.get_state()
    assert state["epoch"] == 1
    rest, following = collect(it), collect(pipeline)
    fresh = build(20, 6)
    it2 = fresh.epochs(3)
    it2.set_state(state)
    np.testing.assert_array_equal(collect(it2)["id"], rest["id"])
    assert len(rest["id"]) == 20 - 6 + 20
    np.testing.assert_array_equal(collect(fresh)["id"], following["id"])
    # A state saved at the very end of the span yields nothing more.
    done = build(20, 6).epochs(3)
    done.set_state(it.get_state())
    assert list(done) == []


def test_pipeline_is_an_nnx_module_with_stage_state():
    pipeline = build(10, 4)
    leaves = jax.tree.leaves(nnx.state(pipeline))
    assert len(leaves) == 1 and leaves[0].dtype == jnp.uint32  # the augmenter's key; no data arrays


def test_transform_on_a_loaded_batch_matches_iteration_and_is_differentiable():
    pipeline = build(12, 4, shuffle=False)
    first = next(iter(pipeline))
    raw = {k: jnp.asarray(v[:4]) for k, v in make_data(12).items()}
    np.testing.assert_array_equal(np.asarray(pipeline.transform(raw, record_ids=raw["id"], epoch=0)["x"]),
                                  np.asarray(first["x"]))
    grad = jax.grad(lambda x: pipeline.transform({"id": raw["id"], "x": x}, record_ids=raw["id"])["x"].sum())(raw["x"])
    np.testing.assert_array_equal(np.asarray(grad), np.ones((4, 3)))


def test_output_spec():
    spec = build(10, 4).output_spec()
    assert spec["x"].shape == (4, 3) and spec["id"].dtype == jnp.int32


def flips_fired(pipeline):
    """For each record, whether the horizontal and the vertical flip fired (from pixel (0, 0))."""
    out = collect(pipeline)
    corner = out["image"][np.argsort(out["id"]), 0, 0, 0]  # pixel (r, c) holds 2r + c
    return corner % 2 == 1, corner // 2 == 1


def flip_pipeline(h_seed, v_seed, n=4000):
    from datarax.operators.image import (
        HorizontalFlipConfig,
        HorizontalFlipOperator,
        VerticalFlipConfig,
        VerticalFlipOperator,
    )

    image = np.broadcast_to(np.array([[0, 1], [2, 3]], np.float32)[:, :, None], (n, 2, 2, 3)).copy()
    source = MemorySource(MemorySourceConfig(), data={"image": image, "id": np.arange(n, dtype=np.int32)})
    stages = [HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(h_seed)),
              VerticalFlipOperator(VerticalFlipConfig(), rngs=nnx.Rngs(v_seed))]
    return Pipeline(source, stages, batch_size=500)


def test_two_stages_given_the_same_seed_draw_independently():
    h, v = flips_fired(flip_pipeline(0, 0))
    # Independent fair coins agree half the time (4000 records: 5% is over six standard errors).
    assert abs(np.mean(h == v) - 0.5) < 0.05 and abs(np.mean(h) - 0.5) < 0.05 and abs(np.mean(v) - 0.5) < 0.05


def test_stages_with_different_seeds_keep_their_streams():
    same, different = flip_pipeline(0, 0), flip_pipeline(0, 1)
    # The first stage keeps its key either way; the second keeps its own when it differs.
    np.testing.assert_array_equal(flips_fired(same)[0], flips_fired(different)[0])
    from datarax.operators.image import VerticalFlipConfig, VerticalFlipOperator

    alone = VerticalFlipOperator(VerticalFlipConfig(), rngs=nnx.Rngs(1))
    np.testing.assert_array_equal(np.asarray(different.stages[1].key[...]), np.asarray(alone.key[...]))


def test_the_short_quickstart_runs_and_is_the_readme_block():
    code = (ROOT / "examples" / "quickstart_short.py").read_text()
    assert f"```python\n{code}```" in (ROOT / "README.md").read_text()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(ROOT / "examples" / "quickstart_short.py"), run_name="__main__")
    assert out.getvalue().strip().splitlines() == [
        f"Batch {i}: images (32, 28, 28, 1) float32, labels (32,)" for i in range(3)]


def settled_thread_count(at_most: int) -> int:
    """`threading.active_count()` once threads told to stop have ended (a bounded wait, no timing asserted)."""
    import gc
    import threading
    import time

    gc.collect()
    for _ in range(3000):  # a 60 s hang guard; the threads end at their next poll of the stop flag
        if threading.active_count() <= at_most:
            break
        time.sleep(0.02)
    return threading.active_count()


def test_abandoned_pipelines_release_their_threads(tmp_path):
    """100 image pipelines (a reading pool, a decode pool, a prefetch thread each), iterated two
    batches and dropped, leave no more threads than one; `close()` and `with` release them at once."""
    import threading

    from PIL import Image

    from datarax.host import DecodeImage
    from datarax.sources import ImageFolderSource

    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        for i in range(6):
            Image.fromarray(np.full((8, 8, 3), i * 20, np.uint8)).save(tmp_path / label / f"{i}.png")

    def make():
        return Pipeline(ImageFolderSource(root=str(tmp_path), shuffle=True, seed=0),
                        [DecodeImage(size=4, num_threads=2)], batch_size=4)

    def abandon():
        it = iter(make())
        next(it), next(it)

    before = threading.active_count()
    abandon()
    one = settled_thread_count(before)
    for _ in range(100):
        abandon()
    assert settled_thread_count(one) <= one
    with make() as pipeline:
        next(iter(pipeline))
        assert threading.active_count() > one  # its pools are running
    assert settled_thread_count(one) <= one
    pipeline = make()
    next(iter(pipeline))
    pipeline.close()
    assert settled_thread_count(one) <= one
