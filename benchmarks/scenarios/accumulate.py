"""`accumulate`: a Trainer step of k accumulated micro-batches against k plain steps of the micro-batch.

A small CNN (conv 3->32, conv 32->64 stride 2, linear to 10 classes) on 32x32x3 float images,
softmax cross-entropy, SGD, from a device-resident shuffled `MemorySource`. For each k in
`K_VALUES`, datarax is `Trainer(..., accumulate_steps=k)` at batch `BATCH` (one optimizer step of k
micro-batches of `BATCH // k`) and its floor is the same Trainer at `accumulate_steps=1` and batch
`BATCH // k`: the same records through the same forward and backward passes, with k optimizer
updates instead of one. Both are timed as records per second over `STEPS` steps of `BATCH`
records (so `STEPS * k` steps on the floor side), steps interleaved in rounds after a warm-up
that compiles; `ratio` is datarax over floor, and 1 / ratio is what an accumulated step costs in
units of k small steps (the goal: at most 1.2, a ratio of at least 0.83).

On the CPU a `lax.scan` over the micro-batches cost 20-35 small steps for k = 2 (XLA:CPU runs the
convolutions of a loop body many times slower); the step now traces the micro-batches one after
the other (`datarax.train.loop.step.accumulate`).
"""

from __future__ import annotations

import statistics
import time
import warnings

import jax
import numpy as np
import optax
from flax import nnx

from benchmarks.registry import BenchOptions
from benchmarks.timing import row
from datarax import Pipeline
from datarax.sources import MemorySource

NUM_RECORDS = 4096
BATCH = 256
STEPS = 8
K_VALUES = (2, 4)


class CNN(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(3, 32, (3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, (3, 3), strides=2, rngs=rngs)
        self.out = nnx.Linear(64 * 16 * 16, 10, rngs=rngs)

    def __call__(self, x):
        x = jax.nn.relu(self.conv2(jax.nn.relu(self.conv1(x))))
        return self.out(x.reshape(x.shape[0], -1))


def loss_fn(model: CNN, batch: dict) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()


def make_data(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.random((n, 32, 32, 3)).astype(np.float32), "y": rng.integers(0, 10, n).astype(np.int32)}


def trainer(data: dict, batch_size: int, k: int):
    from datarax.train import Trainer

    pipeline = Pipeline(MemorySource(data=data, shuffle=True, seed=0), [], batch_size=batch_size, drop_remainder=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the guardrails' advice is not what is measured here
        return Trainer(CNN(nnx.Rngs(0)), optax.sgd(0.01), pipeline, loss_fn, accumulate_steps=k)


def timed_steps(run, steps: int) -> float:
    """Seconds for `steps` more steps of a Trainer, waiting for the last one's state."""
    start = time.perf_counter()
    run.fit(run.step + steps)
    jax.block_until_ready(run.model.out.kernel[...])
    return time.perf_counter() - start


def run(options: BenchOptions) -> list[dict]:
    data = make_data(max(BATCH * 2, options.records(NUM_RECORDS)))
    rows = []
    for k in K_VALUES:
        sides = {"datarax": (trainer(data, BATCH, k), STEPS), "floor": (trainer(data, BATCH // k, 1), STEPS * k)}
        for run_, steps in sides.values():
            timed_steps(run_, 2)  # compiles
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(options.repeats):
            for name, (run_, steps) in sides.items():
                rates[name].append(STEPS * BATCH / timed_steps(run_, steps))
        datarax, floor = ({"el_s": statistics.median(rates[n]), "el_s_runs": [round(r, 1) for r in rates[n]]}
                          for n in ("datarax", "floor"))
        rows.append(row(f"accumulate_k{k}", datarax, floor, records=len(data["x"]), batch_size=BATCH,
                        accumulate_steps=k, micro_batch=BATCH // k,
                        cost_in_small_steps=round(floor["el_s"] / datarax["el_s"], 3)))
    return rows
