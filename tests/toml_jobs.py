"""A small regression job as a configuration file, for tests that train from TOML.

`write_job(folder, trainer_keys)` writes the job's helper module (data, model, loss) beside
`run.toml` and returns the file's path; `trainer_keys` are lines added to its `[trainer]` table.
Tests in any folder import it as `toml_jobs` (tests/ is on the path through its conftest).
"""

from __future__ import annotations

from pathlib import Path

HELPERS = '''
import numpy as np
import jax.numpy as jnp
from flax import nnx

def make_regression():
    rng = np.random.default_rng(0)
    x = rng.random((40, 4)).astype(np.float32)
    return {"x": x, "y": x @ np.array([1.0, -2.0, 3.0, 0.5], np.float32)}

def make_model(rngs):
    return nnx.Linear(4, 1, rngs=rngs)

def mse(model, batch):
    return jnp.mean((model(batch["x"])[:, 0] - batch["y"]) ** 2)
'''

CONFIG = """allow = ["job_helpers"]
batch_size = 8
[source.memory]
data = "job_helpers:make_regression"
shuffle = true
[trainer]
model = "job_helpers:make_model"
loss = "job_helpers:mse"
optimizer = { adam = { learning_rate = 0.01 } }
"""


def write_job(folder: Path, trainer_keys: str = "", *, steps: int = 4, after: str = "") -> Path:
    """`folder/run.toml` (a `steps`-step job over 40 regression records) with `trainer_keys` added
    to its `[trainer]` table and `after` (more tables) at its end, and its helper module
    `job_helpers.py` beside it."""
    (folder / "job_helpers.py").write_text(HELPERS)
    path = folder / "run.toml"
    path.write_text(f"{CONFIG}steps = {steps}\n{trainer_keys.strip()}\n{after}")
    return path
