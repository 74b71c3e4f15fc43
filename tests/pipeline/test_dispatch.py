"""The device-resident per-batch path: no data-dependent loop in the per-batch program, sampling in
chunks, batches dispatched ahead (exact against the host permutation, after seeks, restores,
errors and parameter changes), and a constant amount of Python work per `next()`."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.batching import chunk_schedule, resolve_batches_per_dispatch
from datarax.core.operator import OperatorConfig, OperatorModule
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.operators.image import (
    BrightnessConfig,
    BrightnessOperator,
    ContrastConfig,
    ContrastOperator,
    HorizontalFlipConfig,
    HorizontalFlipOperator,
    RandomCropConfig,
    RandomCropOperator,
)
from datarax.pipeline import compiled as compiled_module
from datarax.samplers import SlidingWindowSampler
from datarax.samplers.feistel import FeistelPermutation
from datarax.sources import MemorySource, MemorySourceConfig


def make_data(n: int) -> dict:
    return {"id": np.arange(n, dtype=np.int32), "x": np.arange(n * 3, dtype=np.float32).reshape(n, 3)}


def noisy(element, key):
    return element.update_data({"x": element.data["x"] + jax.random.normal(key, element.data["x"].shape)})


def build(n=50, batch_size=8, seed=0, stochastic=True, **kw) -> Pipeline:
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data=make_data(n))
    stages = [ElementOperator(ElementOperatorConfig(stochastic=True), fn=noisy,
                              rngs=nnx.Rngs(seed))] if stochastic else []
    return Pipeline(source=source, stages=stages, batch_size=batch_size, **kw)


def primitives(jaxpr) -> list:
    """Every equation of `jaxpr` and of the jaxprs nested in its equations (loops, branches, calls)."""
    found = []
    for eqn in jaxpr.eqns:
        found.append(eqn)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jax.extend.core.Jaxpr):
                    found.extend(primitives(inner))
    return found


def first_chunk(pipeline: Pipeline) -> np.ndarray:
    return chunk_schedule(len(pipeline.sampler), pipeline.batch_size, pipeline.compiled.chunk_batches,
                          drop_remainder=pipeline.drop_remainder, epoch=0, position=0)


def per_batch_jaxpr(pipeline: Pipeline):
    compiled = pipeline.compiled
    params = pipeline.sampler.device_params(0)
    rows = compiled.sample_chunk(params, first_chunk(pipeline))
    arrays = pipeline.source.device_arrays()
    return jax.make_jaxpr(compiled.expand_gather_and_run)(compiled.values(), arrays, params, rows[0]).jaxpr


def sample_jaxpr(pipeline: Pipeline):
    params = pipeline.sampler.device_params(0)
    return jax.make_jaxpr(pipeline.compiled.sample_chunk)(params, first_chunk(pipeline)).jaxpr


# Powers of two, one past them, and sizes whose Feistel domain is up to 4x the records (long walks).
@pytest.mark.parametrize("n", [64, 65, 100, 256, 1000, 1024, 1025, 4097])
def test_the_per_batch_program_of_a_shuffled_pipeline_has_no_loop_or_branch(n):
    pipeline = build(n, batch_size=16)
    names = {e.primitive.name for e in primitives(per_batch_jaxpr(pipeline))}
    assert "gather" in names  # the walker sees the program's body
    # `while` (data-dependent trip count) and `cond` both need the device's answer on the host.
    assert not names & {"while", "cond"}, sorted(names)
    # The cycle walk lives in the sampling program, run once per chunk of batches.
    assert "while" in {e.primitive.name for e in primitives(sample_jaxpr(pipeline))}


def test_windowed_and_dag_pipelines_have_no_loop_in_the_per_batch_program():
    data = {"tok": np.arange(1000, dtype=np.int32)}
    windows = Pipeline(MemorySource(data=data), batch_size=4,
                       sampler=SlidingWindowSampler(1000, window=16, stride=3, shuffle=True, seed=1))
    flip = HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(0))
    bright = BrightnessOperator(BrightnessConfig(max_delta=0.2), rngs=nnx.Rngs(1))
    image = {"image": np.zeros((100, 8, 8, 3), np.float32)}
    dag = Pipeline.from_dag(source=MemorySource(MemorySourceConfig(shuffle=True), data=image),
                            nodes={"flip": flip, "bright": bright}, edges={"flip": [], "bright": ["flip"]},
                            sink="bright", batch_size=8)
    for pipeline in (windows, dag):
        names = {e.primitive.name for e in primitives(per_batch_jaxpr(pipeline))}
        assert not names & {"while", "cond"}, sorted(names)


def host_ids(n: int, batch_size: int, epochs, seed=0, drop_remainder=False) -> list[np.ndarray]:
    """Reference: each batch's record ids from the numpy Feistel permutation."""
    out = []
    stop = n - n % batch_size if drop_remainder else n
    for epoch in epochs:
        perm = FeistelPermutation(n, seed, epoch)(np.arange(n))
        out += [perm[s:min(s + batch_size, n)] for s in range(0, stop, batch_size)]
    return out


@pytest.mark.parametrize("chunk_ids", [8, 24, 65_536])
@pytest.mark.parametrize("n, batch_size, drop", [(50, 8, False), (50, 8, True), (64, 16, False), (37, 5, False)])
def test_chunked_sampling_gives_the_host_permutation_across_chunks_and_epochs(monkeypatch, chunk_ids, n, batch_size,
                                                                               drop):
    monkeypatch.setattr(compiled_module, "CHUNK_IDS", chunk_ids)
    pipeline = build(n, batch_size, stochastic=False, drop_remainder=drop)
    got = [np.asarray(b["id"]) for b in pipeline.epochs(3)]
    want = host_ids(n, batch_size, range(3), drop_remainder=drop)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("ahead", [0, 1, 3])
def test_seek_and_restore_mid_chunk_continue_exactly(monkeypatch, ahead):
    monkeypatch.setattr(compiled_module, "CHUNK_IDS", 24)  # chunks of 3 batches of 8
    reference = [np.asarray(b["id"]) for b in build(50, 8, stochastic=False, dispatch_ahead=ahead).epochs(2)]
    pipeline = build(50, 8, stochastic=False, dispatch_ahead=ahead)
    it = pipeline.epochs(2)
    for _ in range(4):  # the middle of the second chunk, with batches dispatched beyond it
        next(it)
    state = it.get_state()
    resumed = build(50, 8, stochastic=False, dispatch_ahead=ahead).epochs(2)
    resumed.set_state(state)
    for want, got in zip(reference[4:], resumed):
        np.testing.assert_array_equal(np.asarray(got["id"]), want)
    it.seek(1, 11)  # not a multiple of the batch size: a fresh chunk from there
    perm = FeistelPermutation(50, 0, 1)(np.arange(50))
    got = np.concatenate([np.asarray(b["id"]) for b in it])
    np.testing.assert_array_equal(got, perm[11:])


def test_dispatching_ahead_changes_no_batch_and_no_state():
    plain = build(45, 8, dispatch_ahead=0).epochs(2)
    ahead = build(45, 8, dispatch_ahead=5).epochs(2)
    for a, b in zip(plain, ahead):
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))  # same program: bitwise
        assert plain.get_state() == ahead.get_state()
    with pytest.raises(StopIteration):
        next(ahead)


class Scale(OperatorModule):
    """Multiplies `x` by a parameter (a stage whose variable a training step could change)."""

    def __init__(self):
        self.config = OperatorConfig()
        self.scale = nnx.Param(jnp.float32(1.0))

    def apply_batch(self, elements, ctx):
        return elements.update_data({"x": elements.data["x"] * self.scale[...]})

    def structure(self) -> str:
        return "Scale()"


def test_batches_dispatched_ahead_see_a_parameter_changed_before_they_are_returned():
    source = MemorySource(MemorySourceConfig(shuffle=True), data=make_data(64))
    stage = Scale()
    it = iter(Pipeline(source, [stage], batch_size=8, dispatch_ahead=4))
    x = make_data(64)["x"]
    first = next(it)
    np.testing.assert_array_equal(np.asarray(first["x"]), x[np.asarray(first["id"])])
    stage.scale[...] = jnp.float32(3.0)  # batches 2-5 were dispatched with scale 1
    for batch in it:
        np.testing.assert_array_equal(np.asarray(batch["x"]), 3.0 * x[np.asarray(batch["id"])])


def test_a_failed_dispatch_loses_no_batch(monkeypatch):
    # One batch per dispatch, the program patched below (a TPU's default groups 8 per dispatch,
    # through `expand_gather_and_run_many`; PER_DISPATCH_CASES cover a failure there).
    pipeline = build(50, 8, stochastic=False, dispatch_ahead=2, batches_per_dispatch=1)
    reference = [np.asarray(b["id"]) for b in build(50, 8, stochastic=False).epochs(1)]
    real = pipeline.compiled.expand_gather_and_run
    calls = {"n": 0}

    def flaky(*args):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("device lost")
        return real(*args)

    monkeypatch.setattr(pipeline.compiled, "expand_gather_and_run", flaky)
    it = pipeline.epochs(1)
    got = [np.asarray(next(it)["id"])]  # dispatches batches 0-2
    with pytest.raises(RuntimeError, match="device lost"):
        next(it)  # batch 3's dispatch fails while keeping two ahead
    assert it.cursor == (0, 8)
    got += [np.asarray(b["id"]) for b in it]
    assert len(got) == len(reference)
    for g, w in zip(got, reference):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("bad", [-1, 65, 1.5, "2", None])
def test_dispatch_ahead_is_checked(bad):
    with pytest.raises(ValueError, match=r"dispatch_ahead must be an int in \[0, 64\].*got"):
        build(dispatch_ahead=bad)


def python_calls_per_next(pipeline: Pipeline, batches: int = 20) -> float:
    """Python function calls (profiler `call` events) per `next()`, once warm."""
    it = pipeline.epochs(None)
    for _ in range(3):
        next(it)
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        for _ in range(batches):
            next(it)
    finally:
        sys.setprofile(None)
    return calls / batches


def image_chain(n: int, batch_size: int, stages: bool) -> Pipeline:
    data = {"image": np.zeros((n, 8, 8, 3), np.float32)}
    ops = [RandomCropOperator(RandomCropConfig(size=8, padding=1), rngs=nnx.Rngs(0)),
           HorizontalFlipOperator(HorizontalFlipConfig(), rngs=nnx.Rngs(1)),
           BrightnessOperator(BrightnessConfig(max_delta=0.2), rngs=nnx.Rngs(2)),
           ContrastOperator(ContrastConfig(max_delta=0.2), rngs=nnx.Rngs(3))] if stages else []
    return Pipeline(MemorySource(MemorySourceConfig(shuffle=True), data=data), ops, batch_size=batch_size)


def test_python_work_per_batch_does_not_grow_with_the_batch_the_data_or_the_stages():
    base = python_calls_per_next(image_chain(1000, 4, stages=False))
    assert python_calls_per_next(image_chain(20_000, 256, stages=False)) == base
    chain = image_chain(1000, 4, stages=True)
    variables = len(chain.compiled.values())
    # The stages add one read per variable of theirs (a flat list, no traversal of the stages).
    assert python_calls_per_next(chain) == base + variables
    assert base <= 6  # 4 on CPython 3.11: __next__, _next_device, values, the schedule generator


def test_warps_are_separated_by_a_branch_on_the_cpu_only(monkeypatch):
    """`RotationOperator` keeps XLA:CPU from fusing its gathers with a `cond` on an always-true
    predicate (`datarax.core.fusion.separately`); on any other backend, where a branch can cost a
    device-to-host round trip, the per-batch program has none."""
    from datarax.core import fusion
    from datarax.operators.image import RotationConfig, RotationOperator

    def rotated() -> Pipeline:
        data = {"image": np.zeros((40, 8, 8, 3), np.float32)}
        stage = RotationOperator(RotationConfig(degrees=20.0), rngs=nnx.Rngs(0))
        return Pipeline(MemorySource(MemorySourceConfig(shuffle=True), data=data), [stage], batch_size=8)

    monkeypatch.setattr(fusion.jax, "default_backend", lambda: "cpu")
    assert "cond" in {e.primitive.name for e in primitives(per_batch_jaxpr(rotated()))}
    monkeypatch.setattr(fusion.jax, "default_backend", lambda: "gpu")
    names = {e.primitive.name for e in primitives(per_batch_jaxpr(rotated()))}
    assert not names & {"while", "cond"}, sorted(names)


def assert_same_batches(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w)
        for k in w:
            np.testing.assert_array_equal(np.asarray(g[k]), np.asarray(w[k]))


# (records, batch size, drop_remainder, records sampled per chunk): short final batches, chunks that a
# group of batches does not divide, one chunk per epoch.
PER_DISPATCH_CASES = [(50, 8, False, 24), (50, 8, True, 24), (64, 16, False, 65_536), (37, 5, False, 35),
                      (9, 4, False, 65_536)]


# The one-batch-per-dispatch run of each case (its batches, and the state after each), made once for
# the three batches-per-dispatch compared with it: the same pipeline gives the same run.
ONE_PER_DISPATCH: dict[tuple, tuple[list, list]] = {}


def one_per_dispatch(n: int, batch_size: int, drop: bool, chunk_ids: int) -> tuple[list, list]:
    key = (n, batch_size, drop, chunk_ids)
    if key not in ONE_PER_DISPATCH:
        one = build(n, batch_size, drop_remainder=drop, batches_per_dispatch=1).epochs(3)
        want, states = [], []
        for batch in one:
            want.append(jax.device_get(batch))
            states.append(one.get_state())
        ONE_PER_DISPATCH[key] = want, states
    return ONE_PER_DISPATCH[key]


@pytest.mark.parametrize("per_dispatch", [2, 3, 8])
@pytest.mark.parametrize("n, batch_size, drop, chunk_ids", PER_DISPATCH_CASES)
def test_several_batches_per_dispatch_give_the_batches_and_states_of_one(monkeypatch, per_dispatch, n, batch_size,
                                                                        drop, chunk_ids):
    monkeypatch.setattr(compiled_module, "CHUNK_IDS", chunk_ids)
    want, states = one_per_dispatch(n, batch_size, drop, chunk_ids)
    many = build(n, batch_size, drop_remainder=drop, batches_per_dispatch=per_dispatch).epochs(3)
    got = []
    for batch, state in zip(many, states):
        got.append(batch)
        assert many.get_state() == state
    assert_same_batches(got, want)
    with pytest.raises(StopIteration):
        next(many)


@pytest.mark.parametrize("ahead", [0, 1, 5])
@pytest.mark.parametrize("stop", [1, 4, 7])
def test_resume_and_seek_inside_a_group_of_batches_continue_exactly(monkeypatch, ahead, stop):
    monkeypatch.setattr(compiled_module, "CHUNK_IDS", 48)  # chunks of 6 batches of 8, groups of 4
    reference = list(build(50, 8, batches_per_dispatch=1).epochs(3))
    it = build(50, 8, batches_per_dispatch=4, dispatch_ahead=ahead).epochs(3)
    for _ in range(stop):
        next(it)
    resumed = build(50, 8, batches_per_dispatch=4, dispatch_ahead=ahead).epochs(3)
    resumed.set_state(it.get_state())
    assert_same_batches(list(resumed), reference[stop:])
    it.seek(1, 13)
    seeked = build(50, 8, batches_per_dispatch=1).epochs(3)
    seeked.seek(1, 13)
    assert_same_batches(list(it), list(seeked))


def test_a_group_dispatched_ahead_sees_a_parameter_changed_before_it_is_returned():
    source = MemorySource(MemorySourceConfig(shuffle=True), data=make_data(64))
    stage = Scale()
    it = iter(Pipeline(source, [stage], batch_size=8, batches_per_dispatch=4))
    x = make_data(64)["x"]
    first = next(it)  # batches 0-3 were computed in one program, batch 4-7 in the next
    np.testing.assert_array_equal(np.asarray(first["x"]), x[np.asarray(first["id"])])
    stage.scale[...] = jnp.float32(3.0)
    count = 1
    for batch in it:
        np.testing.assert_array_equal(np.asarray(batch["x"]), 3.0 * x[np.asarray(batch["id"])])
        count += 1
    assert count == 8


def test_one_program_computes_each_group(monkeypatch):
    pipeline = build(64, 8, stochastic=False, batches_per_dispatch=4, dispatch_ahead=0)
    calls = []
    real_many, real_one = pipeline.compiled.expand_gather_and_run_many, pipeline.compiled.expand_gather_and_run
    monkeypatch.setattr(pipeline.compiled, "expand_gather_and_run_many",
                        lambda *a: calls.append(len(a[3])) or real_many(*a))
    monkeypatch.setattr(pipeline.compiled, "expand_gather_and_run", lambda *a: calls.append(1) or real_one(*a))
    assert len(list(pipeline)) == 8
    assert calls == [4, 4]


@pytest.mark.parametrize("requested, batch_bytes, backend, expected", [
    (None, 1000, "cpu", 1), (None, 1000, "gpu", 1), (None, 1000, "tpu", 8), (None, 20 * 2**20, "tpu", 3),
    (None, 2**30, "tpu", 1), (5, 1000, "cpu", 5), (2, 2**30, "tpu", 2)])
def test_batches_per_dispatch_defaults_by_backend(requested, batch_bytes, backend, expected):
    assert resolve_batches_per_dispatch(requested, batch_bytes, backend) == expected


@pytest.mark.parametrize("bad", [0, 65, 1.5, "2"])
def test_batches_per_dispatch_is_checked(bad):
    with pytest.raises(ValueError, match=r"batches_per_dispatch must be an int in \[1, 64\].*got"):
        build(batches_per_dispatch=bad)
