"""StepGuard: a record poisoned with NaN and one extreme record are named by their incident (shard file
and row), a skipped step leaves parameters and optimizer state bitwise as they were, and a stop
leaves the run and its checkpoints at the step before the bad one."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import optax
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flax import nnx
from trainer_helpers import leaves

from datarax import Pipeline
from datarax.sources import ShardedSource
from datarax.train import Trainer
from datarax.train.callbacks import Callback, CheckpointCallback, GoodputMonitor, StepGuard
from datarax.train.checkpointing.checkpointer import Checkpointer

NUM, BATCH, PER_SHARD, GROUP = 48, 4, 16, 4


def write_shards(folder, poison: dict[int, float]) -> None:
    """Records `id` with `x` (3 values) and `y = sum(x)`, three parquet shards of row groups of 4;
    `poison[id]` replaces that record's `x` by the value."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(NUM, 3)).astype(np.float32)
    y = x.sum(1)
    for record, value in poison.items():
        x[record] = value
    for shard in range(NUM // PER_SHARD):
        rows = slice(shard * PER_SHARD, (shard + 1) * PER_SHARD)
        table = pa.table({"id": np.arange(NUM, dtype=np.int32)[rows], "x": pa.array(x[rows].tolist(),
                          type=pa.list_(pa.float32(), 3)), "y": y[rows]})
        pq.write_table(table, folder / f"shard-{shard}.parquet", row_group_size=GROUP)


def origin(folder, record: int) -> tuple[str, str]:
    """The shard file and the place in its row group a record has, by arithmetic."""
    return f"shard-{record // PER_SHARD}.parquet", f"record {record % GROUP} of row group {record % PER_SHARD // GROUP}"


def loss_fn(model, batch):
    return jnp.mean((model(batch["x"])[:, 0] - batch["y"]) ** 2)


class Snapshots(Callback):
    """Each step's parameters and optimizer state (host copies), keyed by step."""

    def __init__(self):
        self.after: dict[int, list[np.ndarray]] = {}

    def on_train_begin(self, trainer):
        self.after[trainer.step] = leaves(trainer.model) + leaves(trainer.optimizer)

    def on_step_end(self, trainer, logs):
        self.after[logs.step] = leaves(trainer.model) + leaves(trainer.optimizer)


def make_pipeline(tmp_path, poison) -> Pipeline:
    shards = tmp_path / "shards"
    if not shards.exists():  # written once: a rewritten shard is a changed shard to its manifest
        shards.mkdir(parents=True)
        write_shards(shards, poison)
    source = ShardedSource(urls=f"file://{shards}/shard-*.parquet", shuffle=True, seed=3, window=2,
                           manifest_dir=str(tmp_path / "manifests"))
    return Pipeline(source, batch_size=BATCH, drop_remainder=True)


def epoch_order(tmp_path) -> np.ndarray:
    """The records of epoch 0 in order (the sampler's; it does not depend on the records' values)."""
    return make_pipeline(tmp_path / "probe", {}).sampler.indices(np.arange(NUM), 0)


def build(tmp_path, poison, guard, checkpoint=None, extra=()):
    snapshots = Snapshots()
    callbacks = [guard, snapshots, *extra] + ([checkpoint] if checkpoint is not None else [])
    trainer = Trainer(nnx.Linear(3, 1, rngs=nnx.Rngs(0)), optax.adam(0.05), make_pipeline(tmp_path, poison), loss_fn,
                      callbacks=callbacks)
    return trainer, snapshots


def step_of(order: np.ndarray, record: int) -> int:
    return int(np.nonzero(order == record)[0][0]) // BATCH + 1


def test_skip_names_the_nan_and_the_extreme_record_and_leaves_the_state_untouched(tmp_path):
    order = epoch_order(tmp_path)
    nan_record, big_record = int(order[9]), int(order[33])  # steps 3 and 9 of epoch 0
    guard = StepGuard(tmp_path, action="skip", spike=20.0, warmup=4, window=8)
    goodput = GoodputMonitor(plot=False, verbose=False)
    trainer, snapshots = build(tmp_path, {nan_record: np.nan, big_record: 300.0}, guard, extra=[goodput])
    result = trainer.fit(num_steps=12)
    assert result.step == 12 and result.stop_reason is None
    assert goodput.report["guard"]["skipped_steps"] == 2 and "2 step(s) skipped by the guard (steps 3, 9)" in \
        goodput.report["text"]
    bad = [step_of(order, nan_record), step_of(order, big_record)]
    assert bad == [3, 9] and guard.skipped == bad
    for step in bad:  # bitwise the state of the step before: parameters and optimizer state
        for before, after in zip(snapshots.after[step - 1], snapshots.after[step]):
            np.testing.assert_array_equal(after, before)
    assert not all(np.array_equal(a, b) for a, b in zip(snapshots.after[4], snapshots.after[3]))
    for step, record, reason in ((3, nan_record, "non-finite loss"), (9, big_record, "loss spike")):
        incident = json.loads((tmp_path / "incidents" / f"step-{step}.json").read_text())
        assert incident["step"] == step and incident["reason"] == reason and incident["action"] == "skip"
        assert (incident["epoch"], incident["position"]) == (0, (step - 1) * BATCH)
        top = incident["records"][0]
        assert top["record_id"] == record and all(part in top["origin"] for part in origin(tmp_path, record))
        assert sorted(r["record_id"] for r in incident["records"]) == sorted(order[(step - 1) * BATCH:step * BATCH])
        batch = np.load(tmp_path / "incidents" / f"step-{step}.npz")
        np.testing.assert_array_equal(batch["id"], [r["record_id"] for r in sorted(incident["records"],
                                                                                   key=lambda r: r["row"])])
    nan_incident = json.loads((tmp_path / "incidents" / "step-3.json").read_text())
    assert nan_incident["records"][0]["not_finite"] == ["x: 3 of 3 values not finite"]
    spike = json.loads((tmp_path / "incidents" / "step-9.json").read_text())
    losses = [r["loss"] for r in spike["records"]]
    assert losses == sorted(losses, reverse=True) and losses[0] > 100 * losses[1]
    assert spike["loss"] > spike["threshold"] > 0


def test_stop_ends_at_the_step_before_and_its_checkpoint_is_intact(tmp_path):
    nan_record = int(epoch_order(tmp_path)[21])  # step 6
    checkpoint = CheckpointCallback(tmp_path / "ckpt", every_steps=2, asynchronous=False)
    guard = StepGuard(tmp_path, action="stop")
    trainer, snapshots = build(tmp_path, {nan_record: np.nan}, guard, checkpoint)
    result = trainer.fit(num_steps=10)
    assert result.step == 5 and result.stop_reason.startswith("step 6: non-finite loss")
    assert sorted(int(p.name) for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == [2, 4, 5]
    incident = json.loads((tmp_path / "incidents" / "step-6.json").read_text())
    assert incident["records"][0]["record_id"] == nan_record
    # A fresh trainer resumes from step 5's checkpoint: the state after step 5, and step 6's batch next.
    fresh, _ = build(tmp_path, {nan_record: np.nan}, StepGuard(tmp_path / "again"))
    ckpt = Checkpointer(tmp_path / "ckpt")
    restored = fresh.restore_checkpoint(ckpt)
    ckpt.close()
    assert restored.step == 5
    for got, want in zip(leaves(fresh.model) + leaves(fresh.optimizer), snapshots.after[5]):
        np.testing.assert_array_equal(got, want)
    replayed = fresh.replay(6)
    assert nan_record in replayed.record_ids
    np.testing.assert_array_equal(next(fresh.iterator)["id"], replayed.batch["id"])


@pytest.mark.parametrize("settings,words", [
    ({"action": "halt"}, "StepGuardConfig.action must be one of"),
    ({"spike": 0.5}, "StepGuardConfig.spike must be"),
    ({"window": 4, "warmup": 5}, "warmup must be <= window"),
])
def test_bad_settings_name_the_field(tmp_path, settings, words):
    with pytest.raises(ValueError, match=words):
        StepGuard(tmp_path, **settings)
