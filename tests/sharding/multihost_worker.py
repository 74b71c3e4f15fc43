"""One process of a multi-host test run; also the shared pipeline definition the tests compare with.

Run as `python multihost_worker.py --port P --num-processes N --process-id I --out FILE ...` with
`XLA_FLAGS=--xla_force_host_platform_device_count=D`: it joins an N-process CPU cluster through
`jax.distributed`, streams two epochs of a sharded pipeline, records for every step the global
rows this process holds (ids, augmented values, mask) and a jitted reduction over the global
batch, saves the iterator with Orbax after `--save-at` steps and, with `--restore-dir`, restores a
checkpoint (written by any number of processes) into a fresh pipeline and records the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax import Pipeline
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.sharding import DataSharding
from datarax.sources import MemorySource, MemorySourceConfig

NUM_RECORDS = 29
BATCH = 8
EPOCHS = 2


def noisy(element, key):
    return element.update_data({"x": element.data["x"] + jax.random.normal(key, element.data["x"].shape)})


SHARDS_ENV = "DATARAX_TEST_SHARDS"  # a folder of parquet shards of the same records: use ShardedSource


def write_shards(folder: str) -> None:
    """The records as three parquet shards (row groups of 4), for the ShardedSource runs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = np.arange(NUM_RECORDS, dtype=np.int32)
    for shard, part in enumerate(np.array_split(ids, 3)):
        x = pa.array((part[:, None] * 3 + np.arange(3)).astype(np.float32).tolist(), type=pa.list_(pa.float32(), 3))
        pq.write_table(pa.table({"id": part, "x": x}), f"{folder}/shard-{shard}.parquet", row_group_size=4)


def build(sharding: DataSharding | None = None, resident: bool = True) -> Pipeline:
    """The pipeline every run uses: shuffled, per-record random augmentation, a short final batch."""
    data = {"id": np.arange(NUM_RECORDS, dtype=np.int32),
            "x": np.arange(NUM_RECORDS * 3, dtype=np.float32).reshape(NUM_RECORDS, 3)}
    shards = os.environ.get(SHARDS_ENV)
    if shards:
        from datarax.sources import ShardedSource

        source = ShardedSource(urls=f"file://{shards}/shard-*.parquet", shuffle=True, seed=11, window=2,
                               manifest_dir=f"{shards}/manifests")
    else:
        source = MemorySource(MemorySourceConfig(shuffle=True, seed=11, device_resident=resident), data=data)
    op = ElementOperator(ElementOperatorConfig(stochastic=True), fn=noisy, rngs=nnx.Rngs(5))
    return Pipeline(source, [op], batch_size=BATCH, sharding=sharding)


def make_sharding(mesh_kind: str) -> DataSharding:
    """`data`: one axis over every device; `data,model`: one row of the mesh per process."""
    devices = np.array(jax.devices())
    if mesh_kind == "data":
        return DataSharding(jax.sharding.Mesh(devices, ("data",)), "data")
    mesh = jax.sharding.Mesh(devices.reshape(jax.process_count(), -1), ("data", "model"))
    return DataSharding(mesh, "data")


def local_rows(batch: dict) -> dict:
    """The global rows this process holds, with their values (replicas must agree)."""
    rows: dict[int, dict] = {}
    for key, leaf in batch.items():
        for shard in leaf.addressable_shards:
            values = np.asarray(shard.data)
            for r, v in zip(range(BATCH)[shard.index[0]], values):
                v = v.tolist()
                previous = rows.setdefault(r, {}).setdefault(key, v)
                assert previous == v, f"replicas of row {r} disagree on {key}: {previous} vs {v}"
    return rows


@jax.jit
def valid_id_sum(batch):
    return jnp.sum(jnp.where(batch["mask"], batch["id"], 0))


def record(batch: dict) -> dict:
    rows = local_rows(batch)
    order = sorted(rows)
    return {"rows": order, **{k: [rows[r][k] for r in order] for k in batch},
            "total": int(np.asarray(valid_id_sum(batch)))}


def manager(directory: str):
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(create=True))


def save(directory: str, step: int, iterator) -> None:
    import orbax.checkpoint as ocp

    from datarax.checkpoint import IteratorSave

    with manager(directory) as mngr:
        mngr.save(step, args=ocp.args.Composite(iterator=IteratorSave(iterator)), force=True)
        mngr.wait_until_finished()


def restore(directory: str, iterator) -> int:
    import orbax.checkpoint as ocp

    from datarax.checkpoint import IteratorRestore

    with manager(directory) as mngr:
        step = mngr.latest_step()
        mngr.restore(step, args=ocp.args.Composite(iterator=IteratorRestore(iterator)))
    return step


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--mesh", default="data")
    parser.add_argument("--host-resident", action="store_true")
    parser.add_argument("--save-at", type=int, required=True)
    parser.add_argument("--save-dir", required=True)
    parser.add_argument("--restore-dir")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}", num_processes=args.num_processes,
                               process_id=args.process_id, initialization_timeout=60)
    sharding = make_sharding(args.mesh)
    resident = not args.host_resident

    result = {"process_index": jax.process_index(), "process_count": jax.process_count(), "fresh": []}
    pipeline = build(sharding, resident)
    result["fingerprint"] = pipeline.fingerprint
    result["steps_per_epoch"] = len(pipeline)
    iterator = pipeline.epochs(EPOCHS)
    for step, batch in enumerate(iterator):
        result["fresh"].append(record(batch))
        if step + 1 == args.save_at:
            save(args.save_dir, step + 1, iterator)
            result["saved_state"] = iterator.get_state()

    if args.restore_dir:
        resumed = build(sharding, resident).epochs(EPOCHS)
        result["restored_step"] = restore(args.restore_dir, resumed)
        result["resumed"] = [record(batch) for batch in resumed]

    with open(f"{args.out}.{args.process_id}.json", "w") as f:
        json.dump(result, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    # Run the imported module, not `__main__`: the stages' structure (part of the iterator
    # fingerprint) names their functions' module, which must match the test process's.
    import multihost_worker

    multihost_worker.main(sys.argv[1:])
