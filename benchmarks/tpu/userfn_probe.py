"""The user-function path on the chip: where the per-record `ElementOperator` loses time.

Prints JSON lines `{"probe": name, "rate": records/s, "max_err": vs the floor}` for the `cifar`
scenario's per-record `augment_image` run several ways (one batch of 256 per call), and the
datarax pipeline at `batches_per_dispatch` 1 and 8 (which lowers the function's slices on a
TPU); writes the optimised HLO of two variants to `$OUT` when that is set.
"""
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import limits, record
from benchmarks.scenarios.cifar import BATCH, augment_image, build_pipeline, make_data
from benchmarks.timing import interleaved_rates
from datarax import Pipeline
from datarax.operators.lowering import slices_as_selections

N = 50_000
data = make_data(N)
nhwc = jax.device_put(data["image"])
dense = jax.device_put(data["image"].reshape(N, -1))
columns = jax.device_put(np.ascontiguousarray(data["image"].reshape(N, -1).T))
keys_of = limits.keyed(0)
OUT = os.environ.get("OUT")


emit = record.Recorder(record.command_line("python benchmarks/tpu/userfn_probe.py", sys.argv[1:])).emit


def per_record_nhwc(x, idx, epoch):
    return jax.vmap(augment_image)(jnp.take(x, idx, axis=0), keys_of(idx, epoch))


def per_record_dense(x, idx, epoch):
    return jax.vmap(augment_image)(jnp.take(x, idx, axis=0).reshape(-1, 32, 32, 3), keys_of(idx, epoch))


def selections_dense(x, idx, epoch):
    images = jnp.take(x, idx, axis=0).reshape(-1, 32, 32, 3)
    return jax.vmap(slices_as_selections(augment_image))(images, keys_of(idx, epoch))


def batch_last(x, idx, epoch):
    images = jnp.take(x, idx, axis=0).reshape(-1, 32, 32, 3)
    out = jax.vmap(augment_image, in_axes=(3, 0), out_axes=3)(jnp.moveaxis(images, 0, 3), keys_of(idx, epoch))
    return jnp.moveaxis(out, 3, 0)


def batch_last_columns(x, idx, epoch):
    images = jnp.take(x, idx, axis=1).reshape(32, 32, 3, -1)
    out = jax.vmap(augment_image, in_axes=(3, 0), out_axes=3)(images, keys_of(idx, epoch))
    return jnp.moveaxis(out, 3, 0)


def batch_last_flat(x, idx, epoch):
    """Records as rows of 3072, the batch moved to the lane axis: (32, 32, 3, B) -> (3072, B)."""
    images = jnp.take(x, idx, axis=0).T.reshape(32, 32, 3, -1)
    out = jax.vmap(augment_image, in_axes=(3, 0), out_axes=3)(images, keys_of(idx, epoch))
    return out.reshape(3072, -1).T.reshape(-1, 32, 32, 3)


VARIANTS = {"per-record, NHWC storage (the floor)": (per_record_nhwc, nhwc),
            "per-record, lane-dense storage (today's datarax)": (per_record_dense, dense),
            "per-record, lane-dense, slices as selections (datarax's lowering)": (selections_dense, dense),
            "vmap with the batch axis last": (batch_last, dense),
            "vmap with the batch axis last, flattened transpose": (batch_last_flat, dense),
            "vmap with the batch axis last, column storage": (batch_last_columns, columns)}


def main():
    rng = np.random.default_rng(0)
    idx_sets = [jnp.asarray(rng.permutation(N)[:BATCH].astype(np.int32)) for _ in range(40)]
    reference = None
    for name, (fn, x) in VARIANTS.items():
        program = jax.jit(fn)
        try:
            got = np.asarray(program(x, idx_sets[0], np.int32(0)))
        except Exception as exc:  # a variant that does not compile on this backend is a finding, not a crash
            emit(probe=name, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            continue
        reference = got if reference is None else reference
        for i in range(3):
            program(x, idx_sets[i], np.int32(0))
        jax.block_until_ready(program(x, idx_sets[0], np.int32(0)))
        began = time.perf_counter()
        for i in range(40):
            out = program(x, idx_sets[i], np.int32(0))
        jax.block_until_ready(out)
        rate = 40 * BATCH / (time.perf_counter() - began)
        emit(probe=name, rate=round(rate), max_err=float(np.max(np.abs(got - reference))))
        if OUT and name in ("per-record, lane-dense storage (today's datarax)", "vmap with the batch axis last"):
            text = program.lower(x, idx_sets[0], np.int32(0)).compile().as_text()
            with open(os.path.join(OUT, name.split(",")[0].replace(" ", "_") + ".hlo.txt"), "w") as f:
                f.write(text)
    sides = {f"datarax K={k}": (lambda k=k: build_pipeline_k(k)) for k in (1, 8)}
    built = {name: make() for name, make in sides.items()}
    for name, p in built.items():
        began = time.perf_counter()
        jax.block_until_ready(list(p))
        emit(probe=name, first_epoch_s=round(time.perf_counter() - began, 2))
    for name, r in interleaved_rates({n: (lambda p=p: p) for n, p in built.items()}, N, 2).items():
        emit(probe=name, **r)


def build_pipeline_k(k):
    p = build_pipeline(data)
    return Pipeline(p.source, p.stages, batch_size=BATCH, batches_per_dispatch=k)


if __name__ == "__main__":
    main()
