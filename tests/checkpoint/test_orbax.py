import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from datarax import Pipeline
from datarax.checkpoint import IteratorRestore, IteratorSave
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.pipeline import BucketedPipeline
from datarax.sources import MemorySource, MemorySourceConfig


def jitter(element, key):
    return element.update_data({"x": element.data["x"] + jax.random.uniform(key, (2,))})


def build(resident=True):
    data = {"x": np.arange(60, dtype=np.float32).reshape(30, 2), "id": np.arange(30)}
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=3, device_resident=resident), data=data)
    op = ElementOperator(ElementOperatorConfig(stochastic=True), fn=jitter, rngs=nnx.Rngs(1))
    return Pipeline(source=source, stages=[op], batch_size=4)


@pytest.mark.parametrize("resident", [True, False])
def test_checkpoint_manager_saves_iterator_beside_model_and_fresh_manager_restores(tmp_path, resident):
    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    it = build(resident).epochs(3)
    for _ in range(9):
        next(it)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(9, args=ocp.args.Composite(model=ocp.args.StandardSave(nnx.state(model)), data=IteratorSave(it)))
        mngr.wait_until_finished()
    expected = [next(it) for _ in range(6)]
    it.close()

    fresh_model = nnx.Linear(2, 3, rngs=nnx.Rngs(42))
    fresh_it = build(resident).epochs(3)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        assert mngr.latest_step() == 9
        restored = mngr.restore(9, args=ocp.args.Composite(
            model=ocp.args.StandardRestore(nnx.state(fresh_model)), data=IteratorRestore(fresh_it)))
    nnx.update(fresh_model, restored.model)
    np.testing.assert_array_equal(np.asarray(fresh_model.kernel[...]), np.asarray(model.kernel[...]))
    assert restored.data is fresh_it
    for want in expected:
        got = next(fresh_it)
        for k in want:
            np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
    fresh_it.close()


def test_iterator_state_file_is_small_json(tmp_path):
    it = build().epochs(1)
    next(it)
    with ocp.CheckpointManager(tmp_path) as mngr:
        mngr.save(1, args=ocp.args.Composite(data=IteratorSave(it)))
        mngr.wait_until_finished()
    files = list((tmp_path / "1" / "data").glob("process_*.json"))
    assert len(files) == 1 and files[0].stat().st_size < 400
    with ocp.CheckpointManager(tmp_path) as mngr:
        state = mngr.restore(1, args=ocp.args.Composite(data=IteratorRestore())).data
    assert state == it.get_state()


def bucketed():
    data = {"x": np.arange(60, dtype=np.float32).reshape(30, 2)}
    source = MemorySource(MemorySourceConfig(), data=data)
    return BucketedPipeline(source, np.arange(30) % 7, (2, 4, 8), lambda length: [], batch_size=4, seed=3)


@pytest.mark.parametrize("build", [build, bucketed], ids=["pipeline", "bucketed"])
def test_orbax_v1_checkpointables_protocol(tmp_path, build):
    v1 = pytest.importorskip("orbax.checkpoint.experimental.v1")
    it = build().epochs(2)
    for _ in range(5):
        next(it)
    v1.save_checkpointables(tmp_path / "v1", {"dataset": it})
    want = next(it)
    fresh = build().epochs(2)
    v1.load_checkpointables(tmp_path / "v1", {"dataset": fresh})
    got = next(fresh)
    np.testing.assert_array_equal(np.asarray(got["x"]), np.asarray(want["x"]))


def test_restore_from_missing_item_says_what_is_missing(tmp_path):
    from datarax.checkpoint.orbax import read_state

    with pytest.raises(FileNotFoundError, match=r"no datarax iterator state in .*expected process_0-of-1.json"):
        read_state(tmp_path)
    (tmp_path / "process_0-of-1.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"is not valid JSON .* the checkpoint is corrupt"):
        read_state(tmp_path)


def test_resume_example_restores_model_optimizer_and_data_exactly(tmp_path):
    """examples/resume.py: a run restored from its step-20 Orbax checkpoint after a crash at step 25
    sees the uninterrupted run's batches and ends with its parameters, bit for bit."""
    import runpy
    from pathlib import Path

    module = runpy.run_path(str(Path(__file__).parents[2] / "examples" / "resume.py"), run_name="example")
    assert module["main"](tmp_path) is True
    assert sorted(p.name for p in (tmp_path / "crashing").iterdir() if p.name.isdigit()) == ["10", "20", "30"]
