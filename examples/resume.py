"""Exact resume with your own training loop: model, optimizer and data iterator in one Orbax checkpoint.

An uninterrupted run trains 30 steps. A second run "crashes" after step 25 (its last checkpoint
is step 20); a third run starts from nothing, restores step 20 from disk and trains to step 30.
Its batches after the restore are the uninterrupted run's, record for record, and so are its
final parameters, bit for bit.

Run: python examples/resume.py [DIR]   (DIR defaults to a temporary directory)
"""

import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from datarax import Pipeline
from datarax.checkpoint import IteratorRestore, IteratorSave
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.sources import MemorySource, MemorySourceConfig

STEPS, SAVE_EVERY, CRASH_AFTER = 30, 10, 25


def build():
    """Everything a run needs, built from scratch as a fresh process would."""
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(size=(200, 8)).astype(np.float32), "y": rng.integers(0, 3, 200).astype(np.int32),
            "id": np.arange(200, dtype=np.int32)}
    noise = ElementOperator(ElementOperatorConfig(stochastic=True), rngs=nnx.Rngs(1),
                            fn=lambda el, key: el.update_data({"x": el.data["x"] + 0.1 * jax.random.normal(key, (8,))}))
    pipeline = Pipeline(MemorySource(MemorySourceConfig(shuffle=True, seed=7), data=data), [noise], batch_size=16)
    model = nnx.Linear(8, 3, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    return pipeline.epochs(None), model, optimizer


@nnx.jit
def train_step(model, optimizer, batch):
    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(batch["x"]), batch["y"]).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def train(directory, stop_after=STEPS, restore=False):
    """Trains to `stop_after` steps, checkpointing every SAVE_EVERY; returns (model, ids of every batch)."""
    iterator, model, optimizer = build()
    manager = ocp.CheckpointManager(Path(directory).absolute())
    step = 0
    if restore and manager.latest_step() is not None:
        step = manager.latest_step()
        restored = manager.restore(step, args=ocp.args.Composite(
            model=ocp.args.StandardRestore(nnx.state(model)),
            optimizer=ocp.args.StandardRestore(nnx.state(optimizer)),
            data=IteratorRestore(iterator)))   # sets the iterator's position in place
        nnx.update(model, restored["model"])
        nnx.update(optimizer, restored["optimizer"])
    seen = []
    while step < stop_after:
        batch = next(iterator)
        seen.append(np.asarray(batch["id"]))
        train_step(model, optimizer, batch)
        step += 1
        if step % SAVE_EVERY == 0:
            manager.save(step, args=ocp.args.Composite(
                model=ocp.args.StandardSave(nnx.state(model)), optimizer=ocp.args.StandardSave(nnx.state(optimizer)),
                data=IteratorSave(iterator)))
    manager.wait_until_finished()
    manager.close()
    iterator.close()
    return model, seen


def main(root):
    print(f"1/3 training {STEPS} steps without interruption (checkpoints every {SAVE_EVERY})...", flush=True)
    full, full_ids = train(Path(root) / "uninterrupted")
    print(f"2/3 training again, 'crashing' after step {CRASH_AFTER}...", flush=True)
    _, crashed_ids = train(Path(root) / "crashing", stop_after=CRASH_AFTER)
    print("3/3 restoring the newest checkpoint and training to the end...", flush=True)
    resumed, resumed_ids = train(Path(root) / "crashing", restore=True)
    restored_at = STEPS - len(resumed_ids)
    same_batches = all(np.array_equal(a, b) for a, b in zip(full_ids[restored_at:], resumed_ids))
    same_params = all(bool(jnp.array_equal(a, b)) for a, b in
                      zip(jax.tree.leaves(nnx.state(full)), jax.tree.leaves(nnx.state(resumed))))
    print(f"crashed after step {len(crashed_ids)}; restored step {restored_at} from disk and trained to {STEPS}")
    print(f"batches after the restore identical to the uninterrupted run: {same_batches}")
    print(f"final parameters bitwise identical: {same_params}")
    return same_batches and same_params


if __name__ == "__main__":
    if len(sys.argv) > 1:
        ok = main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as tmp:
            ok = main(tmp)
    sys.exit(0 if ok else 1)
