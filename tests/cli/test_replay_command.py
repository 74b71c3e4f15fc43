"""`datarax replay` on a run over a stream (no random access) refuses, with the reason, in one line."""

from __future__ import annotations

import datarax.train  # noqa: F401 - registers [trainer]
from datarax.cli.main import main
from datarax.config import build_pipeline, load_spec
from datarax.train.replay import write_run_file

HELPERS = '''
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.sources.stream import RecordReader, StreamSourceModule


class Reader(RecordReader):
    def __init__(self, start):
        self.at = start

    def read(self, out, start, count):
        n = min(count, 6 - self.at)
        out["x"][start:start + n] = np.arange(self.at, self.at + n, dtype=np.float32)[:, None]
        self.at += n
        return n

    def get_state(self):
        return {"at": self.at}


class Numbers(StreamSourceModule):
    def element_spec(self):
        return {"x": jax.ShapeDtypeStruct((1,), np.float32)}

    def open(self, epoch, state):
        return Reader(0 if state is None else state["at"])


def make_model(rngs):
    return nnx.Linear(1, 1, rngs=rngs)


def loss(model, batch):
    return jnp.mean(model(batch["x"]) ** 2)
'''

CONFIG = """allow = ["stream_helpers"]
batch_size = 2
[source."stream_helpers:Numbers"]
[trainer]
model = "stream_helpers:make_model"
loss = "stream_helpers:loss"
optimizer = { sgd = { learning_rate = 0.1 } }
steps = 2
"""


def test_a_stream_run_refuses_replay_with_the_reason(tmp_path, monkeypatch, capsys):
    (tmp_path / "stream_helpers.py").write_text(HELPERS)
    (tmp_path / "run.toml").write_text(CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = load_spec(tmp_path / "run.toml")
    write_run_file(spec, tmp_path / "runs" / "run", build_pipeline(spec), None)  # what `datarax train` writes first
    assert main(["replay", str(tmp_path / "runs" / "run"), "--step", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "datarax: error: this pipeline reads Numbers, a stream without random access: its batch at a position is "
        "only reached by reading the stream from the epoch's start")
    assert "To replay batches, read the data through a random-access source" in err
    assert main(["replay", str(tmp_path / "runs" / "run"), "--step", "0"]) == 1
    assert "--step must be a training step >= 1" in capsys.readouterr().err
