"""Checkpoint trust: damaged-but-readable data is detected, all-damaged directories keep refusing, one
run per directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from trainer_helpers import METRICS, assert_bitwise_equal, loss_fn, make_setup
from xla_flags import one_device_env

from datarax.checkpoint.errors import CheckpointRestoreError, CorruptCheckpointWarning
from datarax.checkpoint.trees import abstract_target
from datarax.train import Trainer
from datarax.train.callbacks import CheckpointCallback
from datarax.train.checkpointing.checkpointer import Checkpointer

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parents[2]  # where trainer_helpers.py lives
STEPS, EVERY = 8, 4

# Orbax's reader leaves an asyncio callback behind when a checkpoint fails to read (its issue, not ours).
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


class Wide(nnx.Module):
    """A classifier with arrays large enough that OCDBT stores them out of line (not inside a checksummed node)."""

    def __init__(self, seed: int = 0):
        self.hidden = nnx.Linear(4, 512, rngs=nnx.Rngs(seed))
        self.head = nnx.Linear(512, 3, rngs=nnx.Rngs(seed + 1))

    def __call__(self, x):
        return self.head(nnx.relu(self.hidden(x)))


def make_trainer(callbacks=()):
    setup = make_setup()
    setup.model = Wide()
    trainer = Trainer(setup.model, optax.adam(5e-2), setup.pipeline, loss_fn, metrics=METRICS, callbacks=callbacks)
    return trainer, setup


@pytest.fixture(scope="module")
def uninterrupted():
    trainer, setup = make_trainer()
    trainer.fit(num_steps=STEPS)
    return setup.model, trainer.optimizer


def flip_a_byte_in_the_data(item_dir: Path, target) -> None:
    """Flips one bit near the middle of the item's largest data file: an array chunk stored out of line.

    OCDBT checksums its b-tree nodes but not out-of-line array chunks, so the item still reads (as
    after a bad disk or a careless copy) with other values; the assertions below check exactly that,
    with Orbax's own reader. The chunks are zstd-compressed, and a flip that lands in a frame's
    header makes the chunk unreadable instead (where it lands depends on the file's layout, which
    varies from run to run), so the first position, going outwards from the middle, at which the
    item still reads with other values is used.
    """
    before = jax.tree.map(np.asarray, ocp.StandardCheckpointer().restore(item_dir, target))
    files = [Path(root) / name for root, _, names in os.walk(item_dir) for name in names]
    largest = max(files, key=lambda path: path.stat().st_size)
    original = largest.read_bytes()
    middle = len(original) // 2
    for offset in (middle + d * sign for d in range(0, 64 * 37, 37) for sign in (1, -1)):
        data = bytearray(original)
        data[offset] ^= 0x10
        largest.write_bytes(bytes(data))
        try:
            after = jax.tree.map(np.asarray, ocp.StandardCheckpointer().restore(item_dir, target))
        except Exception:  # unreadable: not the damage this helper is for
            continue
        if not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after))):
            return
    raise AssertionError(f"no bit flip near the middle of {largest} left it readable with other values")


def damage(step_dir: Path, what: str, model, optimizer) -> None:
    if what in ("model", "optimizer"):
        flip_a_byte_in_the_data(step_dir / what, abstract_target(model if what == "model" else optimizer))
    else:
        path = step_dir / "iterator" / "process_0-of-1.json"
        state = json.loads(path.read_text())
        state["epoch"] += 1  # valid JSON, a plausible epoch: only the integrity data can tell
        path.write_text(json.dumps(state, indent=1, sort_keys=True))


@pytest.mark.parametrize("what, differed", [
    ("model", r"model data"), ("optimizer", r"optimizer data"), ("iterator_epoch", r"iterator epoch"),
])
def test_damaged_but_readable_newest_step_falls_back_and_ends_like_an_uninterrupted_run(
        tmp_path, uninterrupted, what, differed):
    first, _ = make_trainer([CheckpointCallback(tmp_path, every_steps=EVERY)])
    first.fit(num_steps=STEPS)
    damage(tmp_path / str(STEPS), what, first.model, first.optimizer)

    ckpt = CheckpointCallback(tmp_path, every_steps=EVERY)
    second, second_setup = make_trainer([ckpt])
    with pytest.warns(CorruptCheckpointWarning, match=rf"checkpoint step {STEPS} .*{differed}"):
        result = second.fit(num_steps=STEPS)
    assert ckpt.restored.step == EVERY and [s for s, _ in ckpt.restored.skipped] == [STEPS]
    assert result.step == STEPS
    assert any(name.startswith(f"corrupt-{STEPS}-") for name in os.listdir(tmp_path))
    model, optimizer = uninterrupted
    assert_bitwise_equal(model, second_setup.model)
    assert_bitwise_equal(optimizer, second.optimizer)


def test_integrity_mismatch_names_both_hashes(tmp_path):
    trainer, _ = make_trainer([CheckpointCallback(tmp_path, every_steps=2)])
    trainer.fit(num_steps=2)
    damage(tmp_path / "2", "model", trainer.model, trainer.optimizer)
    fresh, _ = make_trainer()
    checkpointer = Checkpointer(tmp_path)
    try:
        with pytest.warns(CorruptCheckpointWarning, match=r"model data differs from what was written: sha256 at "
                                                          r"save time [0-9a-f]{16}\.\.\., read [0-9a-f]{16}"), \
                pytest.raises(CheckpointRestoreError):
            checkpointer.restore_latest(model=fresh.model, optimizer=fresh.optimizer, iterator=fresh.iterator)
    finally:
        checkpointer.close()


def test_an_all_damaged_directory_keeps_refusing_until_told_to_start_fresh(tmp_path, uninterrupted):
    first, _ = make_trainer([CheckpointCallback(tmp_path, every_steps=EVERY)])
    first.fit(num_steps=STEPS)
    for step in (EVERY, STEPS):
        damage(tmp_path / str(step), "model", first.model, first.optimizer)
    trainer, _ = make_trainer([CheckpointCallback(tmp_path, every_steps=EVERY)])
    with pytest.warns(CorruptCheckpointWarning, match=r"checkpoint step 8 .* model data differs"), \
            pytest.raises(CheckpointRestoreError, match=r"could be restored \(step 8: .*step 4: "
                                                        r".*on_damaged='start_fresh'"):
        trainer.fit(num_steps=STEPS)
    assert trainer.step == 0
    # The same command again: the damaged steps are in corrupt-* now, and it still refuses.
    trainer, _ = make_trainer([CheckpointCallback(tmp_path, every_steps=EVERY)])
    with pytest.raises(CheckpointRestoreError, match=r"corrupt-4-.* \(moved aside by an earlier run\).*"
                                                     r"on_damaged='start_fresh'"):
        trainer.fit(num_steps=STEPS)
    assert trainer.step == 0
    ckpt = CheckpointCallback(tmp_path, every_steps=EVERY, on_damaged="start_fresh")
    trainer, setup = make_trainer([ckpt])
    with pytest.warns(CorruptCheckpointWarning, match=r"starting fresh from step 0 .*on_damaged='start_fresh'"):
        result = trainer.fit(num_steps=STEPS)
    assert ckpt.restored is None and result.resumed_from is None and result.step == STEPS
    assert_bitwise_equal(uninterrupted[0], setup.model)


def test_on_damaged_is_validated(tmp_path):
    with pytest.raises(ValueError, match=r"on_damaged must be 'refuse' or 'start_fresh', got 'ignore'"):
        Checkpointer(tmp_path, on_damaged="ignore")


HOLDER = """
import os, sys, time
sys.path.insert(0, {here!r})
import optax
import orbax.checkpoint as ocp
from trainer_helpers import loss_fn, make_setup
from datarax.train import Trainer
from datarax.train.callbacks import Callback, CheckpointCallback

class Hold(Callback):
    def on_train_begin(self, trainer):
        print("holding", os.getpid(), flush=True)
        time.sleep(600)

setup = make_setup()
Trainer(setup.model, optax.adam(5e-2), setup.pipeline, loss_fn,
        callbacks=[CheckpointCallback(sys.argv[1], every_steps=2), Hold()]).fit(num_steps=4)
"""


def test_a_second_trainer_on_a_locked_directory_is_refused_until_the_holder_dies(tmp_path):
    script = tmp_path / "holder.py"
    script.write_text(HOLDER.format(here=str(HERE)))
    directory = tmp_path / "ckpt"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
    one_device_env(env)  # one CPU device, compiled as the suite compiles
    holder = subprocess.Popen([sys.executable, str(script), str(directory)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in holder.stdout:  # blocks until the holder is inside fit(), lock taken
            lines.append(line)
            if line.startswith("holding"):
                break
        assert holder.poll() is None, "".join(lines)
        second, _ = make_trainer([CheckpointCallback(directory, every_steps=2)])
        with pytest.raises(RuntimeError, match=rf"in use by process {holder.pid} on host .*\.lock"):
            second.fit(num_steps=4)
        assert second.step == 0
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
        holder.stdout.close()
    # The OS released the dead holder's lock: the next run takes over (its pid still in the file).
    third, _ = make_trainer([CheckpointCallback(directory, every_steps=2)])
    assert third.fit(num_steps=4).step == 4
    checkpointer = Checkpointer(directory)
    assert checkpointer.steps() == [2, 4]
    checkpointer.close()


def test_a_second_checkpointer_in_the_same_process_is_refused(tmp_path):
    first = Checkpointer(tmp_path)
    try:
        with pytest.raises(RuntimeError, match=rf"in use by process {os.getpid()} \(this process\)"):
            Checkpointer(tmp_path)
    finally:
        first.close()
    Checkpointer(tmp_path).close()  # released by close()
