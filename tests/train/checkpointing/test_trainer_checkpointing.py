"""Checkpointer: one Orbax checkpoint of model + optimizer + iterator, restore, retention, failures."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from etils import epath
from flax import nnx
from trainer_helpers import assert_bitwise_equal, make_setup, points
from xla_flags import one_device_env

from datarax import Pipeline
from datarax.checkpoint.errors import (
    CheckpointMismatchError,
    CheckpointRestoreError,
    CheckpointSaveError,
    CorruptCheckpointWarning,
)
from datarax.checkpoint.orbax import finalized_steps
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train.checkpointing.checkpointer import Checkpointer


class DropoutNet(nnx.Module):
    """A model with PRNG-key state (Dropout's rngs), to check keys survive a round trip."""

    def __init__(self, seed: int):
        self.linear = nnx.Linear(4, 3, rngs=nnx.Rngs(seed))
        self.dropout = nnx.Dropout(0.5, rngs=nnx.Rngs(seed + 100))

    def __call__(self, x):
        return self.dropout(self.linear(x))


def build(seed: int = 0, *, batch_size: int = 8, num_records: int = 64):
    setup = make_setup(batch_size=batch_size, num_records=num_records)
    model = DropoutNet(seed)
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    return model, optimizer, setup.pipeline.epochs(None)


@nnx.jit
def _update(model, optimizer, x):
    optimizer.update(model, nnx.grad(lambda m: (m(x) ** 2).mean())(model))


def advance(model, optimizer, iterator, steps: int = 3):
    for _ in range(steps):
        _update(model, optimizer, next(iterator)["x"])


def save(checkpointer, step, model, optimizer, iterator, **meta):
    assert checkpointer.save(step, model=model, optimizer=optimizer, iterator=iterator, metadata=meta)
    checkpointer.wait()


def test_round_trip_is_bitwise_including_keys_and_iterator(tmp_path):
    model, optimizer, iterator = build(0)
    advance(model, optimizer, iterator)
    ckpt = Checkpointer(tmp_path, asynchronous=True)
    save(ckpt, 3, model, optimizer, iterator, note="x")
    ckpt.close()
    fresh_model, fresh_opt, fresh_it = build(seed=1)
    restored = Checkpointer(tmp_path).restore_latest(model=fresh_model, optimizer=fresh_opt, iterator=fresh_it)
    assert restored.step == 3 and restored.metadata["note"] == "x" and restored.skipped == ()
    assert_bitwise_equal(model, fresh_model)
    assert_bitwise_equal(optimizer, fresh_opt)
    assert fresh_it.get_state() == iterator.get_state()
    np.testing.assert_array_equal(next(fresh_it)["x"], next(iterator)["x"])


def test_restore_latest_with_no_checkpoint_returns_none(tmp_path):
    model, optimizer, iterator = build()
    assert Checkpointer(tmp_path).restore_latest(model=model, optimizer=optimizer, iterator=iterator) is None


def test_retention_keeps_the_newest(tmp_path):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path, max_to_keep=2)
    for step in range(1, 5):
        save(ckpt, step, model, optimizer, iterator)
    assert ckpt.steps() == [3, 4]
    assert not ckpt.save(4, model=model, optimizer=optimizer, iterator=iterator, metadata={})


def test_layout_on_disk(tmp_path):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path)
    save(ckpt, 7, model, optimizer, iterator)
    assert {"model", "optimizer", "iterator", "meta"} <= set(os.listdir(tmp_path / "7"))
    assert "process_0-of-1.json" in os.listdir(tmp_path / "7" / "iterator")


def test_a_save_writes_into_a_temporary_directory_orbax_reads_as_its_step_and_this_process(tmp_path):
    from datarax.checkpoint.locking import ProcessTemporaryPath
    temporary = ProcessTemporaryPath.from_final(epath.Path(tmp_path) / "12").get()
    assert temporary.name == f"12.orbax-checkpoint-tmp-{os.getpid()}"  # one dash, with any Orbax version
    assert ocp.path.step.step_from_checkpoint_name(temporary.name) == 12  # before 0.12, none for two dashes


def test_finalized_steps_are_the_complete_step_directories_only(tmp_path):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path)
    for step in (3, 1):
        save(ckpt, step, model, optimizer, iterator)
    ckpt.close()
    (tmp_path / "5.orbax-checkpoint-tmp-123" / "model").mkdir(parents=True)  # a save that was killed
    (tmp_path / "corrupt-2-20260101").mkdir()  # moved aside by a restore
    assert finalized_steps(tmp_path) == [1, 3] == Checkpointer(tmp_path).steps()
    assert finalized_steps(tmp_path / "absent") == [] and finalized_steps(None) == []


# Orbax's reader leaves an asyncio callback behind when a checkpoint fails to read (its issue, not ours).
ORBAX_LOOP_NOISE = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _corrupt(step_dir):
    """Truncates every array data file of the model item (what a bad disk or partial copy leaves)."""
    for root, _, files in os.walk(step_dir / "model"):
        for name in files:
            if name not in ("_METADATA", "commit_success.txt"):
                with open(os.path.join(root, name), "wb") as f:
                    f.write(b"\0garbage")


@ORBAX_LOOP_NOISE
def test_corrupt_latest_falls_back_to_previous_with_a_warning(tmp_path):
    model, optimizer, iterator = build()
    advance(model, optimizer, iterator)
    ckpt = Checkpointer(tmp_path)
    save(ckpt, 1, model, optimizer, iterator)
    reference = build(seed=5)[0]
    nnx.update(reference, nnx.state(model))
    advance(model, optimizer, iterator)
    save(ckpt, 2, model, optimizer, iterator)
    ckpt.close()  # one open Checkpointer per directory (it holds the directory's lock)
    _corrupt(tmp_path / "2")
    fresh_model, fresh_opt, fresh_it = build(seed=3)
    reader = Checkpointer(tmp_path)
    with pytest.warns(CorruptCheckpointWarning, match=r"checkpoint step 2 .* could not be restored"):
        restored = reader.restore_latest(model=fresh_model, optimizer=fresh_opt, iterator=fresh_it)
    reader.close()
    assert restored.step == 1 and [s for s, _ in restored.skipped] == [2]
    assert_bitwise_equal(reference, fresh_model)
    assert fresh_it.get_state()["position"] == 3 * 8
    assert any(name.startswith("corrupt-2-") for name in os.listdir(tmp_path))
    again = Checkpointer(tmp_path)
    assert again.steps() == [1]
    save(again, 2, fresh_model, fresh_opt, fresh_it)
    assert again.steps() == [1, 2]


def test_partial_checkpoint_is_ignored(tmp_path):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path)
    save(ckpt, 1, model, optimizer, iterator)
    ckpt.close()
    partial = tmp_path / "2.orbax-checkpoint-tmp-123"
    (partial / "model").mkdir(parents=True)
    (partial / "model" / "junk").write_bytes(b"half written")
    fresh = build(seed=2)
    restored = Checkpointer(tmp_path).restore_latest(model=fresh[0], optimizer=fresh[1], iterator=fresh[2])
    assert restored.step == 1


@ORBAX_LOOP_NOISE
def test_all_checkpoints_unreadable_raises(tmp_path):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path)
    save(ckpt, 1, model, optimizer, iterator)
    ckpt.close()
    _corrupt(tmp_path / "1")
    fresh = build()
    with pytest.warns(CorruptCheckpointWarning):
        with pytest.raises(CheckpointRestoreError, match=r"no checkpoint in .* could be restored \(step 1"):
            Checkpointer(tmp_path).restore_latest(model=fresh[0], optimizer=fresh[1], iterator=fresh[2])


@pytest.mark.parametrize("change, match", [
    ({"batch_size": 16}, r"batch_size=8, this pipeline has batch_size=16"),
    ({"num_records": 48}, r"over 64 records, this one has 48"),
])
def test_restore_into_a_different_pipeline_fails_clearly(tmp_path, change, match):
    model, optimizer, iterator = build()
    advance(model, optimizer, iterator)
    ckpt = Checkpointer(tmp_path)
    save(ckpt, 3, model, optimizer, iterator)
    other_model, other_opt, other_it = build(**change)
    with pytest.raises(CheckpointMismatchError, match=match):
        ckpt.restore_latest(model=other_model, optimizer=other_opt, iterator=other_it)
    assert ckpt.steps() == [3]  # a foreign checkpoint is never moved aside
    ckpt.close()


def test_restore_into_a_different_model_fails_clearly(tmp_path):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path)
    save(ckpt, 1, model, optimizer, iterator)
    wider = nnx.Linear(4, 5, rngs=nnx.Rngs(0))
    # The message names each state path that differs, read from the checkpoint's array metadata.
    with pytest.raises(CheckpointMismatchError, match=r"holds a model state of a different structure: "
                                                      r"model\['bias'\] is in this run only \(\(5,\) float32\); "
                                                      r"model\['dropout'\]\['rngs'\]\['count'\] is in the checkpoint "
                                                      r"only \(\(\) uint32\); .* \(and 1 more\); the model was built"):
        ckpt.restore_latest(model=wider, optimizer=nnx.Optimizer(wider, optax.adam(1e-2),
                                                                wrt=nnx.Param),
                            iterator=build()[2])


def test_a_model_of_other_sizes_is_named_path_by_path(tmp_path):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path)
    save(ckpt, 1, model, optimizer, iterator)
    wider = DropoutNet(0)
    wider.linear = nnx.Linear(4, 5, rngs=nnx.Rngs(0))
    with pytest.raises(CheckpointMismatchError, match=r"different structure: model\['linear'\]\['bias'\]: saved "
                                                      r"\(3,\) float32, this run \(5,\) float32; "
                                                      r"model\['linear'\]\['kernel'\]: saved \(4, 3\) float32, this "
                                                      r"run \(4, 5\) float32; the model was built differently"):
        ckpt.restore_latest(model=wider, optimizer=nnx.Optimizer(wider, optax.adam(1e-2), wrt=nnx.Param),
                            iterator=build()[2])
    ckpt.close()


def test_restore_with_a_different_fingerprint_fails_clearly(tmp_path):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path)
    save(ckpt, 1, model, optimizer, iterator, pipeline_fingerprint="aaaa")
    with pytest.raises(CheckpointMismatchError, match=r"fingerprint 'aaaa', this one has 'bbbb'"):
        ckpt.restore_latest(model=model, optimizer=optimizer, iterator=iterator, fingerprint="bbbb")


@pytest.fixture
def disk_full(monkeypatch):
    """Every asynchronous Orbax write fails in the background with an injected OSError."""
    original = ocp.StandardCheckpointHandler.async_save

    async def failing(self, directory, *args, **kwargs):
        futures = await original(self, directory, *args, **kwargs)
        broken = concurrent.futures.Future()
        broken.set_exception(OSError("disk full (injected)"))
        return list(futures or []) + [broken]

    monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save", failing)


def test_async_save_error_is_raised_not_swallowed(tmp_path, disk_full):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path, asynchronous=True)
    assert ckpt.save(1, model=model, optimizer=optimizer, iterator=iterator, metadata={})
    with pytest.raises(CheckpointSaveError, match=r"background write of checkpoint step 1 .* disk full"):
        ckpt.wait()
    assert ckpt.steps() == []


def test_async_save_error_surfaces_from_fit(tmp_path, disk_full):
    from trainer_helpers import loss_fn

    from datarax.train import Trainer
    from datarax.train.callbacks import CheckpointCallback

    setup = make_setup()
    trainer = Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn,
                      callbacks=[CheckpointCallback(tmp_path, every_steps=2)])
    with pytest.raises(CheckpointSaveError, match=r"background write of checkpoint step 2 .* disk full"):
        trainer.fit(num_steps=6)
    assert trainer.step == 4  # raised by the next save, two steps later


def test_a_resumed_run_compiles_its_step_once(tmp_path):
    from trainer_helpers import loss_fn

    from datarax.train import Trainer
    from datarax.train.callbacks import Callback, CheckpointCallback, StepGuard

    class Compiles(Callback):
        def __init__(self):
            self.steps = []

        def on_step_end(self, trainer, logs):
            if logs.compile_seconds:
                self.steps.append(logs.step)

    setup = make_setup()
    Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn,
            callbacks=[CheckpointCallback(tmp_path / "ckpt", every_steps=2), StepGuard(tmp_path)]).fit(num_steps=2)
    setup, compiles = make_setup(), Compiles()
    trainer = Trainer(setup.model, optax.sgd(0.1), setup.pipeline, loss_fn,
                      callbacks=[CheckpointCallback(tmp_path / "ckpt", every_steps=2), StepGuard(tmp_path), compiles])
    trainer.fit(num_steps=4)
    # The restored arrays and the state the restore leaves alone (the guard's window) start on one
    # device, as the step's outputs do: step 4 does not compile again.
    assert trainer.resumed_from == 2 and compiles.steps == [3]


def test_max_to_keep_is_validated(tmp_path):
    with pytest.raises(ValueError, match=r"max_to_keep must be an int >= 1 or None \(keep all\), got 0"):
        Checkpointer(tmp_path, max_to_keep=0)


def test_iterator_state_saved_is_the_one_at_save_time(tmp_path):
    """The iterator state is captured when save() is called, not when the background write runs."""
    model, optimizer, iterator = build()
    advance(model, optimizer, iterator, 2)
    expected = iterator.get_state()
    ckpt = Checkpointer(tmp_path, asynchronous=True)
    assert ckpt.save(2, model=model, optimizer=optimizer, iterator=iterator, metadata={})
    advance(model, optimizer, iterator, 3)
    ckpt.wait()
    assert ckpt.read_metadata(2)[1] == expected


def test_sources_with_other_data_but_same_shape_are_detected(tmp_path):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path)
    save(ckpt, 1, model, optimizer, iterator)
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=99), data=points(64))
    other = Pipeline(source, batch_size=8, drop_remainder=True).epochs(None)
    with pytest.raises(CheckpointMismatchError, match=r"fingerprint"):
        ckpt.restore_latest(model=model, optimizer=optimizer, iterator=other)


def test_restore_with_a_different_joint_setting_fails_clearly(tmp_path):
    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path)
    stage_holder = nnx.Linear(1, 1, rngs=nnx.Rngs(0))  # stands in for a jointly trained pipeline
    assert ckpt.save(1, model=model, optimizer=optimizer, iterator=iterator, metadata={}, pipeline=stage_holder)
    ckpt.wait()
    with pytest.raises(CheckpointMismatchError, match=r"written with train_pipeline_params=True, this trainer has "
                                                      r"train_pipeline_params=False"):
        ckpt.restore_latest(model=model, optimizer=optimizer, iterator=iterator)


@pytest.mark.parametrize("asynchronous, match", [
    (False, r"saving checkpoint step 5 to .* failed: OSError: read-only"),
    (True, r"background write of checkpoint step 5 to .* failed: OSError: read-only"),
], ids=["synchronous", "asynchronous"])
def test_a_failing_save_call_is_wrapped_with_the_step(tmp_path, monkeypatch, asynchronous, match):
    def broken(self, *args, **kwargs):
        raise OSError("read-only file system (injected)")

    model, optimizer, iterator = build()
    ckpt = Checkpointer(tmp_path, asynchronous=asynchronous)
    monkeypatch.setattr(ocp.CheckpointManager, "save", broken)
    with pytest.raises(CheckpointSaveError, match=match):
        # Asynchronous: Orbax's save runs on the background thread, so the error comes from the next wait.
        ckpt.save(5, model=model, optimizer=optimizer, iterator=iterator, metadata={})
        ckpt.wait()


def test_relative_checkpoint_directory_is_made_absolute(tmp_path, monkeypatch):
    # Orbax refuses relative paths in its background save; the Checkpointer resolves them first.
    monkeypatch.chdir(tmp_path)
    checkpointer = Checkpointer("runs/x/checkpoints")
    try:
        assert str(checkpointer.directory) == str(tmp_path / "runs" / "x" / "checkpoints")
    finally:
        checkpointer.close()


@pytest.mark.filterwarnings("ignore::datarax.train.ShortFinalBatchWarning")
@pytest.mark.parametrize("change, named", [
    ({"batch_size": 16}, "batch_size differs: saved 8, this run 16"),
    ({"seed": 1}, "sampler differs: saved 'ShuffleSampler(seed=5)', this run 'ShuffleSampler(seed=6)'"),
    ({"drop_remainder": False, "num_records": 60}, "drop_remainder differs: saved True, this run False"),
])
def test_a_trainer_restoring_another_pipelines_checkpoint_names_the_part_that_differs(tmp_path, change, named):
    from trainer_helpers import loss_fn

    from datarax.train import Trainer
    from datarax.train.callbacks import CheckpointCallback

    setup = make_setup()
    Trainer(setup.model, optax.adam(1e-2), setup.pipeline, loss_fn, compilation_cache=False,
            callbacks=[CheckpointCallback(tmp_path, every_steps=2)]).fit(num_steps=2)
    other = make_setup(**change)
    trainer = Trainer(other.model, optax.adam(1e-2), other.pipeline, loss_fn, compilation_cache=False,
                      callbacks=[CheckpointCallback(tmp_path)])
    with pytest.raises(CheckpointMismatchError) as caught:
        trainer.fit(num_steps=4)
    assert "was written for another training pipeline: its " in str(caught.value)
    assert named in str(caught.value)


def test_a_second_run_with_another_learning_rate_is_refused_naming_it(tmp_path):
    """The first run finished (its lock is released); a second one in the same directory with
    another learning rate must not adopt its checkpoint, and says how to start fresh or resume anyway."""
    from trainer_helpers import loss_fn

    from datarax.train import Trainer
    from datarax.train.callbacks import CheckpointCallback

    def run(learning_rate, **kwargs):
        setup = make_setup()
        return Trainer(setup.model, optax.sgd(learning_rate), setup.pipeline, loss_fn, compilation_cache=False,
                       run_config={"learning_rate": learning_rate},
                       callbacks=[CheckpointCallback(tmp_path, every_steps=2)], **kwargs)

    assert run(0.1).fit(num_steps=2).step == 2
    with pytest.raises(CheckpointMismatchError) as caught:
        run(0.5).fit(num_steps=4)
    message = str(caught.value)
    assert "written under another configuration: learning_rate: saved 0.1, this run 0.5" in message
    # What the trainer sees itself: SGD's first update of the probe gradient [0.5, -1, 2] is -lr * g.
    assert "optimizer.probe_updates: saved -0.05 0.1 -0.2" in message and "this run -0.25 0.5 -1" in message
    assert "new checkpoint directory" in message and "allow_config_change=True" in message
    assert run(0.1).fit(num_steps=4).resumed_from == 2                       # the same configuration resumes
    assert run(0.5, allow_config_change=True).fit(num_steps=6).resumed_from == 4


def test_an_optimizer_given_without_run_config_is_still_fingerprinted(tmp_path):
    from trainer_helpers import loss_fn

    from datarax.train import Trainer
    from datarax.train.callbacks import CheckpointCallback

    def trainer(tx):
        setup = make_setup()
        return Trainer(setup.model, tx, setup.pipeline, loss_fn, compilation_cache=False,
                       callbacks=[CheckpointCallback(tmp_path, every_steps=2)])

    trainer(optax.adam(1e-2)).fit(num_steps=2)
    with pytest.raises(CheckpointMismatchError, match=r"optimizer\.probe_updates: saved -0\.01 0\.01 -0\.01"):
        trainer(optax.adam(1e-3)).fit(num_steps=4)
    with pytest.raises(CheckpointMismatchError, match=r"optimizer\.state_structure: saved"):
        trainer(optax.adamw(1e-2)).fit(num_steps=4)


# One run of a Trainer with asynchronous checkpoints, as its own process: python -c RUN DIR STEPS K HOLD.
# With HOLD > 0 the background write of checkpoint HOLD stops inside Orbax's write (its temporary
# directory exists) after writing DIR/held, and never finishes. Every dispatched step is printed.
RUN = """
import json, os, sys, time
import optax, orbax.checkpoint as ocp
from trainer_helpers import RECORD_METRICS, loss_fn, make_setup
from datarax.train import Trainer
from datarax.train.callbacks import Callback, CheckpointCallback
from datarax.checkpoint.hashing import state_sha256

workdir, steps, k, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
original = ocp.StandardCheckpointHandler.async_save

async def held(self, directory, *args, **kwargs):
    if hold and f"/{hold}.orbax-checkpoint-tmp" in str(directory):
        open(os.path.join(workdir, "held"), "w").close()
        time.sleep(3600)
    return await original(self, directory, *args, **kwargs)

ocp.StandardCheckpointHandler.async_save = held

class PrintSteps(Callback):
    def on_step_end(self, trainer, logs):
        print("step", logs.step, flush=True)

setup = make_setup()
trainer = Trainer(setup.model, optax.adam(5e-2), setup.pipeline, loss_fn, metrics=RECORD_METRICS,
                  steps_per_execution=k, compilation_cache=False,
                  callbacks=[CheckpointCallback(os.path.join(workdir, "ckpt"), every_steps=4), PrintSteps()])
result = trainer.fit(num_steps=steps)
with open(os.path.join(workdir, "result.json"), "w") as f:
    json.dump({"step": result.step, "resumed_from": result.resumed_from, "metrics": result.metrics,
               "model": state_sha256(setup.model), "optimizer": state_sha256(trainer.optimizer),
               "iterator": trainer.iterator.get_state()}, f)
"""


REPO = Path(__file__).resolve().parents[3]


def run_process(workdir: Path, steps: int, k: int, hold: int = 0) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, JAX_PLATFORMS="cpu", DATARAX_COMPILATION_CACHE="off", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]))
    one_device_env(env)  # one CPU device, compiled as the suite compiles
    with open(workdir / "log.txt", "a") as log:
        return subprocess.Popen([sys.executable, "-c", RUN, str(workdir), str(steps), str(k), str(hold)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(condition, proc: subprocess.Popen, what: str, log: Path, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"waiting for {what}: the run ended or timed out; its log:\n{log.read_text()[-3000:]}")
        time.sleep(0.01)



@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[subprocess.Popen, Path]:
    """The uninterrupted 14 steps of single steps, as its own process, started once for both K: a
    call of K steps trains bitwise like K single steps (test_trainer's
    test_steps_per_execution_trains_bitwise_like_single_steps), so K = 2's resumed run must end on
    these very arrays too. Each test waits for it only when it compares (the first one's killed run
    starts beside it)."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    proc = run_process(workdir, 14, 1)
    yield proc, workdir
    if proc.poll() is None:  # a failed test left it running
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


@pytest.mark.parametrize("k", [1, 2])
def test_sigkill_inside_an_async_save_that_the_loop_did_not_wait_for_resumes_bitwise(tmp_path, k, uninterrupted):
    """A real process, killed by a real SIGKILL while Orbax writes checkpoint 8 in the background and
    the loop trains on past it: the rerun resumes from checkpoint 4 and ends bitwise equal to an
    uninterrupted run of single steps (model, optimizer, iterator, metrics of the last step)."""
    reference, reference_dir = uninterrupted
    killed = run_process(tmp_path / "run", 14, k, hold=8)
    log = tmp_path / "run" / "log.txt"
    wait_for(lambda: (tmp_path / "run" / "held").exists(), killed, "the save of step 8 to begin", log)
    # The loop goes on training while the write is held: it reaches step 10 (and blocks at the save
    # of step 12, which waits for the held one).
    wait_for(lambda: "step 10\n" in log.read_text(), killed, "the loop to train past the held save", log)
    assert any(".orbax-checkpoint-tmp" in name for name in os.listdir(tmp_path / "run" / "ckpt"))
    os.killpg(killed.pid, signal.SIGKILL)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    assert sorted(int(p) for p in os.listdir(tmp_path / "run" / "ckpt") if p.isdigit()) == [4]
    rerun = run_process(tmp_path / "run", 14, k)
    assert rerun.wait(timeout=240) == 0, log.read_text()[-3000:]
    assert reference.wait(timeout=240) == 0, (reference_dir / "log.txt").read_text()[-3000:]
    expected = json.loads((reference_dir / "result.json").read_text())
    resumed = json.loads((tmp_path / "run" / "result.json").read_text())
    assert resumed.pop("resumed_from") == 4 and expected.pop("resumed_from") is None
    assert resumed == expected
