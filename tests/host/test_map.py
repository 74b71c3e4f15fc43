"""HostMap: outputs against calling the function by hand, bitwise equal for every executor and
worker count; keyed randomness; errors, crashes and closing; copies."""

from __future__ import annotations

import copy
import os
import pickle

import jax
import numpy as np
import psutil
import pytest

from datarax import Pipeline
from datarax.host import HostContext, HostMap, HostMapConfig, SkippedRecordWarning, WorkerCrashError
from datarax.host.stage import record_generator
from datarax.sources import MemorySource, MemorySourceConfig, RecordError

OUTPUTS = {"feat": ((3,), np.float32), "code": ((), np.int64)}


def python_feature(record, rng):
    """GIL-bound: a pure-Python loop over the record's values, plus two keyed draws."""
    acc = 0
    for v in record["x"].tolist():
        acc = (acc * 31 + int(v)) % 1_000_003
    return {"feat": np.array([acc, rng.random(), record["x"].sum()], np.float32), "code": rng.integers(0, 10**9)}


def batch_feature(batch, rngs):
    return {"feat": np.stack([batch["x"].sum(1), [r.random() for r in rngs], batch["x"][:, 0]], 1).astype(np.float32),
            "code": np.array([r.integers(0, 10**9) for r in rngs])}


def fails_on_seven(record, rng):
    if int(record["id"]) == 7:
        raise ValueError("seven is not allowed")
    return python_feature(record, rng)


def wrong_shape(record, rng):
    return {"feat": np.zeros(4, np.float32), "code": 0}


def dies_on_five(record, rng):
    if int(record["id"]) == 5:
        os._exit(3)
    return python_feature(record, rng)


def data(n=40):
    rng = np.random.default_rng(0)
    return {"id": np.arange(n, dtype=np.int32), "x": rng.integers(0, 255, (n, 50)).astype(np.int32)}


def by_hand(fn, ids, epoch, stage=0, seed=0):
    """The reference: the function called on each record with its record generator."""
    arrays = data()
    out = [fn({k: v[r] for k, v in arrays.items()}, record_generator(seed, stage, epoch, int(r))) for r in ids]
    return {k: np.stack([np.asarray(o[k]) for o in out]).astype(dict(OUTPUTS)[k][1]) for k in OUTPUTS}


def run(stage, ids, epoch=0):
    arrays = data()
    return stage({k: v[ids] for k, v in arrays.items()}, HostContext(np.asarray(ids), epoch))


EXECUTORS = [("threads", 1), ("threads", 2), ("processes", 1), ("processes", 2)]


@pytest.fixture(scope="module")
def stages():
    made = {}
    yield made
    for stage in made.values():
        stage.close()


def stage_for(stages, executor, workers, fn=python_feature, **kwargs):
    key = (executor, workers, fn.__name__, tuple(sorted(kwargs.items())))
    if key not in stages:
        stages[key] = HostMap(fn=fn, outputs=OUTPUTS, fields=("id", "x"), stochastic=True, executor=executor,
                              num_workers=workers, **kwargs)
    return stages[key]


@pytest.mark.parametrize("executor,workers", EXECUTORS)
def test_records_are_the_function_by_hand_for_any_executor(stages, executor, workers):
    ids = np.array([3, 17, 0, 39, 8, 8, 21])
    got = run(stage_for(stages, executor, workers), ids, epoch=2)
    want = by_hand(python_feature, ids, epoch=2)
    for k in OUTPUTS:
        np.testing.assert_array_equal(got[k], want[k])  # bitwise
    np.testing.assert_array_equal(got["x"], data()["x"][ids])  # inputs pass through


@pytest.mark.parametrize("executor,workers", EXECUTORS)
def test_batched_functions_get_blocks_with_their_generators(stages, executor, workers):
    ids = np.arange(13)
    got = run(stage_for(stages, executor, workers, fn=batch_feature, batched=True), ids, epoch=1)
    reference = batch_feature({k: v[ids] for k, v in data().items()}, [record_generator(0, 0, 1, int(r)) for r in ids])
    for k in OUTPUTS:
        np.testing.assert_array_equal(got[k], reference[k].astype(dict(OUTPUTS)[k][1]))


def test_a_record_draws_by_its_id_and_epoch_only(stages):
    stage = stage_for(stages, "processes", 2)
    whole = run(stage, np.arange(20), epoch=0)["code"]
    reversed_in_pairs = run(stage, np.arange(20)[::-1], epoch=0)["code"][::-1]
    np.testing.assert_array_equal(whole, reversed_in_pairs)  # position and batch do not matter
    assert not np.array_equal(whole, run(stage, np.arange(20), epoch=1)["code"])  # a new epoch draws anew


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_in_a_pipeline_every_executor_gives_the_same_epochs(executor):
    def pipeline(stage):
        source = MemorySource(MemorySourceConfig(shuffle=True, seed=3), data=data())
        return Pipeline(source, [stage], batch_size=8)

    threads = pipeline(HostMap(fn=python_feature, outputs=OUTPUTS, stochastic=True, executor="threads", num_workers=1))
    other = pipeline(HostMap(fn=python_feature, outputs=OUTPUTS, stochastic=True, executor=executor, num_workers=2))
    assert threads.fingerprint == other.fingerprint  # the executor changes no output
    for _ in range(2):
        for a, b in zip(threads, other, strict=True):
            for k in ("id", "feat", "code"):
                np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
    other.source.close()
    threads.source.close()


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_failing_record_is_named_or_skipped(stages, executor):
    ids = np.array([1, 7, 2])
    with pytest.raises(RecordError, match="record 7.*ValueError: seven is not allowed.*on_error='skip'"):
        run(stage_for(stages, executor, 2, fn=fails_on_seven), ids)
    stage = stage_for(stages, executor, 2, fn=fails_on_seven, on_error="skip")
    with pytest.warns(SkippedRecordWarning, match="record 7"):
        out = run(stage, ids)
    np.testing.assert_array_equal(out["feat_ok"], [True, False, True])
    assert not out["feat"][1].any() and out["code"][1] == 0
    np.testing.assert_array_equal(out["feat"][[0, 2]], by_hand(python_feature, ids[[0, 2]], 0)["feat"])
    assert stage.skipped >= 1


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_wrong_output_shape_names_the_declaration(stages, executor):
    with pytest.raises(RecordError, match=r"returned 'feat' with shape \(4,\), outputs= declares \(3,\)"):
        run(stage_for(stages, executor, 2, fn=wrong_shape), np.arange(4))


def test_a_crashed_worker_is_an_error_then_a_fresh_pool():
    stage = HostMap(fn=dies_on_five, outputs=OUTPUTS, fields=("id", "x"), stochastic=True, executor="processes",
                    num_workers=2)
    with pytest.raises(WorkerCrashError, match="died \\(exit code 3\\)"):
        run(stage, np.arange(8))
    assert stage.worker_pids == []  # the pool was stopped
    out = run(stage, np.arange(10, 16))
    np.testing.assert_array_equal(out["feat"], by_hand(python_feature, np.arange(10, 16), 0)["feat"])
    stage.close()


def test_close_leaves_no_worker_processes():
    # Five workers: no other stage of this process shares this pool (stages of one kind, worker
    # count and budget share their workers; the last to close stops them).
    stage = HostMap(fn=python_feature, outputs=OUTPUTS, stochastic=True, executor="processes", num_workers=5)
    assert stage.worker_pids == []  # started lazily
    run(stage, np.arange(6))
    pids = stage.worker_pids
    assert len(pids) == 5 and all(psutil.pid_exists(p) for p in pids)
    stage.close()
    stage.close()  # idempotent
    assert stage.worker_pids == []
    children = {c.pid for c in psutil.Process().children(recursive=True)}
    assert not children & set(pids)
    assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE for p in pids)


def test_a_function_workers_cannot_import_is_refused_by_name():
    with pytest.raises(TypeError, match="HostMap fn .*<lambda>.*module level.*executor='threads'"):
        HostMap(fn=lambda record, rng: {}, outputs=OUTPUTS, executor="processes")
    HostMap(fn=lambda record, rng: {}, outputs=OUTPUTS)  # threads take any function


@pytest.mark.parametrize("clone", [copy.deepcopy, lambda s: pickle.loads(pickle.dumps(s))])
def test_a_copy_or_pickle_is_a_working_stage(clone):
    stage = HostMap(fn=python_feature, outputs=OUTPUTS, fields=("id", "x"), stochastic=True, executor="processes",
                    num_workers=2)
    first = run(stage, np.arange(5))
    pids = stage.worker_pids
    twin = clone(stage)
    assert twin.structure() == stage.structure()
    assert twin.worker_pids == pids  # the same function and settings: the process's one pool of them
    np.testing.assert_array_equal(run(twin, np.arange(5))["code"], first["code"])
    twin.close()
    assert stage.worker_pids == pids and all(psutil.pid_exists(p) for p in pids)  # still the stage's
    np.testing.assert_array_equal(run(stage, np.arange(5))["code"], first["code"])
    stage.close()
    assert stage.worker_pids == []  # given back (test_processes checks the last user's close stops them)


def test_output_spec_and_structure():
    stage = HostMap(fn=python_feature, outputs={"feat": jax.ShapeDtypeStruct((3,), np.float32), "code": ((), "int64")},
                    fields=("x",), executor="processes", num_workers=3)
    spec = stage.output_spec({"x": jax.ShapeDtypeStruct((50,), np.int32)})
    assert spec["feat"].shape == (3,) and spec["code"].dtype == np.int64 and spec["x"].shape == (50,)
    with pytest.raises(KeyError, match=r"HostMap fields \['x'\] are not in the records"):
        stage.output_spec({"y": jax.ShapeDtypeStruct((), np.int32)})
    threads = HostMap(fn=python_feature, outputs=OUTPUTS, fields=("x",))
    assert stage.structure() == threads.structure() and "test_map.python_feature" in stage.structure()
    config = HostMapConfig(outputs=OUTPUTS, fields=("x",))
    assert HostMap(config, fn=python_feature).structure() == threads.structure()


@pytest.mark.parametrize("kwargs,error,match", [
    ({"outputs": {}}, TypeError, "HostMapConfig.outputs must be a non-empty dict"),
    ({"outputs": {"s": ((), object)}}, TypeError, r"outputs\['s'\] has dtype object"),
    ({"outputs": OUTPUTS, "executor": "gpu"}, ValueError, "HostMapConfig.executor must be one of"),
    ({"outputs": OUTPUTS, "num_workers": 0}, ValueError, "HostMapConfig.num_workers must be a positive int"),
    ({"outputs": OUTPUTS, "batched": True, "on_error": "skip"}, ValueError, "use batched=False to skip"),
])
def test_bad_settings_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        HostMapConfig(**kwargs)


def byte_sum(record, rng):
    return {"total": np.array(sum(record["payload"]), np.int64)}


def test_encoded_fields_travel_to_worker_processes():
    payload = np.empty(5, object)
    payload[:] = [bytes(range(i + 1)) for i in range(5)]
    stage = HostMap(fn=byte_sum, outputs={"total": ((), np.int64)}, fields=("payload",), executor="processes",
                    num_workers=2)
    out = stage({"payload": payload}, HostContext(np.arange(5), 0))
    np.testing.assert_array_equal(out["total"], [sum(range(i + 1)) for i in range(5)])
    stage.close()
