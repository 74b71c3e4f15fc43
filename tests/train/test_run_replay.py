"""Replaying training steps: `Trainer.replay(step)` and `datarax replay RUN_DIR --step N` rebuild the batch
the step received, bitwise, across epoch boundaries and after a SIGKILL and a resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optax
import pytest
from flax import nnx
from PIL import Image

from datarax import Pipeline
from datarax.cli.main import main
from datarax.host import DecodeImage
from datarax.operators import ToFloatOperator
from datarax.operators.image import HorizontalFlipOperator, RandomCropOperator
from datarax.pipeline.iterator import PipelineIterator
from datarax.pipeline.replay import ReplayError
from datarax.sources import ImageFolderSource
from datarax.train import Trainer
from datarax.train.replay import replay_run

HANG_GUARD_S = 240


def write_images(root: Path) -> None:
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(5):
            pixels = np.random.default_rng(10 * (label == "b") + i).integers(0, 256, (12 + i, 14, 3), np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i}.png")


class Net(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(6 * 6 * 3, 2, rngs=rngs)

    def __call__(self, x):
        return self.linear(x.reshape(x.shape[0], -1))


def loss_fn(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["image"]), batch["label"]).mean()


def test_trainer_replay_of_ten_random_steps_is_what_each_step_received(tmp_path, monkeypatch):
    write_images(tmp_path / "images")
    source = ImageFolderSource(tmp_path / "images", shuffle=True, seed=2)
    stages = [DecodeImage(8, crop="random_resized", scale=(0.5, 1.0), executor="threads", num_threads=1),
              ToFloatOperator(), RandomCropOperator(size=6, rngs=nnx.Rngs(1)), HorizontalFlipOperator(rngs=nnx.Rngs(2))]
    pipeline = Pipeline(source, stages, batch_size=3, drop_remainder=True, rngs=nnx.Rngs(augment=5))
    received = []
    real_next = PipelineIterator.__next__

    def recording(self):
        batch = real_next(self)
        received.append({k: np.asarray(v) for k, v in batch.items()})
        return batch

    monkeypatch.setattr(PipelineIterator, "__next__", recording)
    trainer = Trainer(Net(nnx.Rngs(0)), optax.sgd(0.1), pipeline, loss_fn, accumulate_steps=3)
    trainer.fit(num_epochs=2)  # 3 steps an epoch
    monkeypatch.undo()
    assert trainer.step == len(received) == 6
    steps = [int(s) for s in np.random.default_rng(0).choice(np.arange(1, 7), 10)] + [4]  # 4: an epoch's first
    for step in steps:
        replayed = trainer.replay(step)
        assert replayed.epoch == (step - 1) // 3 and replayed.position == (step - 1) % 3 * 3
        for name, values in received[step - 1].items():
            np.testing.assert_array_equal(replayed.batch[name], values, strict=True)
    coming = trainer.replay(9)  # a step not trained yet: the batch the next fit's third step reads
    received.clear()
    monkeypatch.setattr(PipelineIterator, "__next__", recording)
    trainer.fit(num_steps=9)
    np.testing.assert_array_equal(received[2]["image"], coming.batch["image"])


HELPERS = '''
import os
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from datarax.pipeline.iterator import PipelineIterator
from datarax.train.callbacks import Callback

_received = {}
_next = PipelineIterator.__next__


def _recording(self):
    batch = _next(self)
    _received["batch"] = {k: np.asarray(v) for k, v in batch.items()}
    return batch


PipelineIterator.__next__ = _recording


class Recorder(Callback):
    """Saves the batch each step received as step-N.npz in $RECORD_DIR (the step's batch is in hand)."""

    def on_step_begin(self, trainer, step):
        np.savez(os.path.join(os.environ["RECORD_DIR"], f"step-{step}.npz"), **_received["batch"])
        if os.environ.get("SLOW_AFTER") and step > int(os.environ["SLOW_AFTER"]):
            import time
            time.sleep(0.5)  # time for the test to kill the run mid-way


class Net(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(6 * 6 * 3, 2, rngs=rngs)

    def __call__(self, x):
        return self.linear(x.reshape(x.shape[0], -1))


def make_model(rngs):
    return Net(rngs)


def loss(model, batch):
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["image"]), batch["label"]).mean()
'''

CONFIG = """allow = ["replay_helpers"]
batch_size = 3
drop_remainder = true
seed = 4
[source.image_folder]
root = "images"
shuffle = true
seed = 1
[[stages]]
decode_image = { size = 8, crop = "random_resized", scale = [0.5, 1.0], executor = "threads", num_threads = 1 }
[[stages]]
to_float = {}
[[stages]]
random_crop = { size = 6 }
[[stages]]
horizontal_flip = {}
[trainer]
model = "replay_helpers:make_model"
loss = "replay_helpers:loss"
optimizer = { sgd = { learning_rate = 0.1 } }
steps = 8
checkpoint_dir = "ckpt"
checkpoint_every = 2
callbacks = [{ "replay_helpers:Recorder" = {} }]
"""


def train_command(folder: Path, env: dict) -> subprocess.Popen:
    code = "import sys; from datarax.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, "train", "run.toml", "--no-progress"], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def test_datarax_replay_after_a_sigkill_and_a_resume(tmp_path, capsys):
    write_images(tmp_path / "images")
    (tmp_path / "replay_helpers.py").write_text(HELPERS)
    (tmp_path / "run.toml").write_text(CONFIG)
    (tmp_path / "received").mkdir()
    # One compilation cache for both runs, as `datarax train` keeps one in the run directory: the
    # resumed run loads the first run's programs (bitwise the same executables) instead of compiling.
    env = {**os.environ, "RECORD_DIR": str(tmp_path / "received"), "SLOW_AFTER": "5",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "DATARAX_COMPILATION_CACHE": str(tmp_path / "jax_cache")}
    first = train_command(tmp_path, env)
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while not (tmp_path / "received" / "step-6.npz").exists():  # past the checkpoint at step 4
            assert first.poll() is None, first.stdout.read().decode()
            assert time.monotonic() < deadline, "the first run never reached step 6"
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == -signal.SIGKILL
    env.pop("SLOW_AFTER")
    second = train_command(tmp_path, env)
    out, _ = second.communicate(timeout=HANG_GUARD_S)
    assert second.returncode == 0, out.decode()
    assert "resumed      from the checkpoint at step" in out.decode()
    run_dir = tmp_path / "runs" / "run"
    for step in (1, 3, 4, 5, 7, 8):  # 3 steps an epoch: 4 and 7 follow epoch boundaries; 5-8 after the resume
        replayed = replay_run(run_dir, step).replayed
        want = np.load(tmp_path / "received" / f"step-{step}.npz")
        assert sorted(want.files) == sorted(replayed.batch)
        for name in want.files:
            np.testing.assert_array_equal(replayed.batch[name], want[name], strict=True)

    capsys.readouterr()
    png, npz = tmp_path / "grid.png", tmp_path / "batch.npz"
    assert main(["replay", str(run_dir), "--step", "7", "--out", str(npz), "--show", str(png)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("step 7: epoch 2, position 0, 3 records (found from the checkpoint at step 6)")
    assert text.count("    host[0] DecodeImage: box [") == 3 and text.count("HorizontalFlipOperator: apply ") == 3
    assert text.count("RandomCropOperator: left ") == 3 and str(tmp_path / "images") in text
    assert f"wrote {png}: field 'image'" in text
    got = np.load(npz)
    np.testing.assert_array_equal(got["image"], np.load(tmp_path / "received" / "step-7.npz")["image"])
    grid = np.asarray(Image.open(png))
    assert grid.ndim == 3 and grid.shape[2] == 3 and grid.std() > 0

    (tmp_path / "run.toml").write_text(CONFIG.replace("seed = 4", "seed = 5"))
    with pytest.raises(ReplayError, match="run.toml changed since the run started"):
        replay_run(run_dir, 3)
    assert main(["replay", str(tmp_path), "--step", "1"]) == 1
    assert "has no run.json: `datarax replay` reads the run directory of a run started by `datarax train`" in \
        capsys.readouterr().err
