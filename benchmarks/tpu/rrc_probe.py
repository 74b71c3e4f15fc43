"""Formulations of the 224x224 random-resized crop (and resize) of 256x256x3 images, timed on the chip.

    python benchmarks/tpu/rrc_probe.py            (on the chip: about 3 minutes, compiles included)
    JAX_PLATFORMS=cpu python benchmarks/tpu/rrc_probe.py --small     (a smoke run: small shapes, no rows kept)

The work is `rrc224`'s (benchmarks/scenarios/rrc224.py): 2,048 uint8 records on the device, stored
as the pipeline stores them, `(N, H, W, C)` (`--lane-dense` adds the formulations on flattened
records), batch 128, each program gathering `PER_PROGRAM` batches, drawing each record's box from
its key and writing the float crops, as the pipeline's programs do. Each formulation computes
`out[b] = rows[b] @ image[b] @ cols[b].T` per channel, with the resampling weights of
`geometry.resample_weights`, in one layout and at one precision:

    per-record   `einsum("ah,hwc,bw->abc")` under `vmap` (the per-record maths; at `DEFAULT`,
                 `HIGH` and `HIGHEST`: one, three and six bfloat16 passes)
    rows first, cols first
                 the same under `vmap`, its two products in a fixed order
    hwc          two batched einsums on (B, H, W, C), layouts left to XLA
    chw          channels moved to the front, (B, C, H, W), and back
    planar       each row's channels side by side, (B, H, C * W), and back (`batched.separable_planar`)
    interleaved  channels interleaved on the lanes, (B, H, W * C), the column matrix repeated per
                 channel (`batched.separable` for small images; `--lane-dense` only)
    planar, planar in and out
                 records stored and written planar: what the two channel moves cost
    datarax      `batched.resized_crop` / `batched.resize` as the operators run them

Prints one JSON line per variant: `rate` (records/s), `max_err` (the largest difference from a
float64 numpy reference of the first records' boxes, as a fraction of the value range),
`compile_s`; the `limit` lines move the same bytes without resampling (rrc224's limit row). Rows
are appended to the results when the probe ends (`benchmarks.record`), except with `--small`.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import limits, record
from benchmarks.scenarios import rrc224
from datarax.operators.image.functional import batched, geometry
from datarax.operators.precision import WEIGHTED_SUM

P = jax.lax.Precision
PRECISIONS = {"DEFAULT": P.DEFAULT, "HIGH": P.HIGH, "HIGHEST": P.HIGHEST}
BUDGET_S = 170  # stop starting variants after this long: a run is one command on a lent chip


def weights(boxes, side, size):
    rows = jax.vmap(lambda b: geometry.resample_weights(size, side, size / b[2], b[0]))(boxes)
    cols = jax.vmap(lambda b: geometry.resample_weights(size, side, size / b[3], b[1]))(boxes)
    return rows, cols


def per_record(x, rows, cols, precision):
    return jax.vmap(lambda im, r, c: jnp.einsum("ah,hwc,bw->abc", r, im, c, precision=precision))(x, rows, cols)


def rows_first(x, rows, cols, precision):
    return jax.vmap(lambda im, r, c: jnp.einsum("awc,bw->abc", jnp.einsum("ah,hwc->awc", r, im, precision=precision),
                                                c, precision=precision))(x, rows, cols)


def cols_first(x, rows, cols, precision):
    return jax.vmap(lambda im, r, c: jnp.einsum("ah,hbc->abc", r, jnp.einsum("hwc,bw->hbc", im, c, precision=precision),
                                                precision=precision))(x, rows, cols)


def hwc(x, rows, cols, precision):
    tall = jnp.einsum("bih,bhwc->biwc", rows, x, precision=precision)
    return jnp.einsum("biwc,bjw->bijc", tall, cols, precision=precision)


def chw(x, rows, cols, precision):
    tall = jnp.einsum("bih,bchw->bciw", rows, jnp.transpose(x, (0, 3, 1, 2)), precision=precision)
    return jnp.transpose(jnp.einsum("bciw,bjw->bcij", tall, cols, precision=precision), (0, 2, 3, 1))


def planar_rows_cols(planar, rows, cols, precision):
    """(B, H, C, W) -> (B, OH, C, OW)."""
    b, h, c, w = planar.shape
    tall = jnp.einsum("bih,bhk->bik", rows, planar.reshape(b, h, c * w), precision=precision)
    out = jnp.einsum("bmw,bjw->bmj", tall.reshape(b, -1, w), cols, precision=precision)
    return out.reshape(b, rows.shape[1], c, cols.shape[1])


def planar(x, rows, cols, precision):
    return jnp.swapaxes(planar_rows_cols(jnp.swapaxes(x, 2, 3), rows, cols, precision), 2, 3)


def interleaved(x, rows, cols, precision):
    b, h, w, c = x.shape
    picked = jnp.einsum("bij,bjk->bik", rows, x.reshape(b, h, w * c), precision=precision)
    eye = jnp.eye(c, dtype=x.dtype)
    per_lane = (jnp.swapaxes(cols, 1, 2)[:, :, None, :, None] * eye[None, None, :, None, :]).reshape(b, w * c, -1)
    return jnp.einsum("bik,bkm->bim", picked, per_lane, precision=precision).reshape(b, rows.shape[1], -1, c)


FORMULATIONS = {"per-record": per_record, "rows first": rows_first, "cols first": cols_first, "hwc": hwc, "chw": chw,
                "planar": planar, "interleaved": interleaved}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--small", action="store_true", help="small shapes for a CPU smoke run; keeps no rows")
    parser.add_argument("--only", default="", help="run only the variants whose name contains this text")
    parser.add_argument("--lane-dense", action="store_true", help="also the formulations on flattened records")
    args = parser.parse_args(argv)
    side, size, n, batch, per_program = (64, 56, 64, 16, 2) if args.small else (
        rrc224.SIDE, rrc224.SIZE, rrc224.NUM_RECORDS, rrc224.BATCH, 8)
    recorder = record.Recorder(record.command_line("python benchmarks/tpu/rrc_probe.py", argv or sys.argv[1:]),
                               directory=None if args.small else "default")
    started = time.perf_counter()
    timed_s = 0.02 if args.small else 0.5  # a smoke run checks that each variant runs, not its rate
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, side, side, 3), dtype=np.uint8)
    stores = {"hwc": jax.device_put(images), "lane-dense": jax.device_put(images.reshape(n, -1)),
              "planar": jax.device_put(np.ascontiguousarray(np.swapaxes(images, 2, 3)))}
    keys_of = limits.keyed(0)
    perm = np.random.default_rng(1).permutation(n).astype(np.int32)
    groups = [perm[i:i + batch * per_program].reshape(per_program, batch)
              for i in range(0, n - batch * per_program + 1, batch * per_program)]

    def draw(idx, operation):
        if operation == "resize":
            return jnp.tile(jnp.asarray([[0.0, 0.0, side, side]], jnp.float32), (idx.shape[0], 1))
        boxes = rrc224.draw_boxes(keys_of(idx, 1))
        return boxes * (side / rrc224.SIDE)  # the same fractions of the image at any side

    first = groups[0][0][:8]
    boxes = np.asarray(jax.jit(lambda i: draw(i, "crop"))(first), np.float64)
    references = {}

    def reference(dtype, operation):
        if (dtype, operation) not in references:
            x = np.asarray(jnp.asarray(images[first]).astype(dtype) / jnp.asarray(255, dtype), np.float64)
            chosen = boxes if operation == "crop" else np.tile([[0.0, 0.0, side, side]], (len(first), 1))
            references[dtype, operation] = rrc224.reference(x, chosen, size)
        return references[dtype, operation]

    def program(per_batch):
        # The records are an argument, not a constant baked into the program (docs: DESIGN, traps).
        return jax.jit(lambda data, idx: jax.lax.map(lambda i: per_batch(jnp.take(data, i, axis=0), i), idx))

    def measure(name, per_batch, store, dtype, operation, planar_out=False, **facts):
        if args.only not in name:
            return
        if time.perf_counter() - started > BUDGET_S:
            recorder.emit(probe="rrc224", variant=name, operation=operation or "limit", dtype=dtype,
                          skipped=f"past the {BUDGET_S} s budget", **facts)
            return
        try:
            fn, data = program(per_batch), stores[store]
            start = time.perf_counter()
            out = jax.block_until_ready(fn(data, groups[0]))
            compile_s = time.perf_counter() - start
            err = None
            if operation is not None:
                got = np.asarray(out[0][:8].astype(jnp.float32), np.float64)
                if planar_out:  # (B, OH, C, OW)
                    got = np.swapaxes(got, 2, 3)
                err = float(np.max(np.abs(got - reference(dtype, operation))))
            calls, pending = 0, None
            start = time.perf_counter()
            while calls < 3 or time.perf_counter() - start < timed_s:
                out = fn(data, groups[(calls + 1) % len(groups)])
                if pending is not None:  # two calls in flight at most: each holds its output on the chip
                    pending.block_until_ready()
                pending, calls = out, calls + 1
            pending.block_until_ready()
            rate = calls * batch * per_program / (time.perf_counter() - start)
            recorder.emit(probe="rrc224", variant=name, operation=operation or "limit", dtype=dtype,
                          rate=round(rate), max_err=err, compile_s=round(compile_s, 2), **facts)
        except Exception as exc:  # a variant that fails is reported, and the probe goes on
            recorder.emit(probe="rrc224", variant=name, operation=operation or "limit", dtype=dtype,
                          error=f"{type(exc).__name__}: {exc}"[:400], **facts)

    def resampled(formulation, dtype, precision, operation):
        def per_batch(rows_u8, idx):
            x = rows_u8.reshape(-1, side, side, 3).astype(dtype) / jnp.asarray(255, dtype)
            rows, cols = weights(draw(idx, operation), side, size)
            return formulation(x, rows.astype(dtype), cols.astype(dtype), precision)
        return per_batch

    def library(dtype, operation):
        def per_batch(rows_u8, idx):
            x = rows_u8.reshape(-1, side, side, 3).astype(dtype) / jnp.asarray(255, dtype)
            if operation == "resize":
                return batched.resize(x, size, size)
            return batched.resized_crop(x, draw(idx, operation), size, size)
        return per_batch

    def planar_in_out(dtype, precision):
        def per_batch(rows_u8, idx):
            x = rows_u8.astype(dtype) / jnp.asarray(255, dtype)  # (B, H, C, W)
            rows, cols = weights(draw(idx, "crop"), side, size)
            return planar_rows_cols(x, rows.astype(dtype), cols.astype(dtype), precision)
        return per_batch

    def window(dtype):
        def per_batch(rows_u8, idx):
            x = rows_u8.reshape(-1, side, side, 3)[:, :size, :size]
            return x.astype(dtype) / jnp.asarray(255, dtype)
        return per_batch

    # Most telling first: a run cut short by the budget keeps them. Records are stored as the
    # pipeline stores them, (N, H, W, C); `--lane-dense` adds the earlier formulations on
    # flattened records.
    recorder.emit(probe="rrc224", variant="setup", backend=jax.default_backend(), side=side, size=size, batch=batch,
                  per_program=per_program, policy=str(WEIGHTED_SUM.precision), devices=str(jax.devices()))
    for dtype in ("float32", "bfloat16"):
        measure(f"limit: fixed window + convert ({dtype})", window(dtype), "hwc", dtype, None)
    measure("per-record HIGH (float32), records stored (N, H, W, C)",
            resampled(per_record, "float32", P.HIGH, "crop"), "hwc", "float32", "crop",
            layout="per-record", precision="HIGH")
    measure("datarax batched.resized_crop (float32)", library("float32", "crop"), "hwc", "float32", "crop")
    for level in ("DEFAULT", "HIGHEST"):  # what the float32 products' passes cost: one and six
        measure(f"per-record {level} (float32), records stored (N, H, W, C)",
                resampled(per_record, "float32", PRECISIONS[level], "crop"), "hwc", "float32", "crop",
                layout="per-record", precision=level)
    for dtype, level in (("float32", "HIGH"), ("bfloat16", "DEFAULT")):
        measure(f"planar {level} ({dtype}), records stored (N, H, W, C)",
                resampled(planar, dtype, PRECISIONS[level], "crop"), "hwc", dtype, "crop", layout="planar",
                precision=level)
    for name in ("rows first", "cols first", "chw", "hwc"):
        measure(f"{name} HIGH (float32), records stored (N, H, W, C)",
                resampled(FORMULATIONS[name], "float32", P.HIGH, "crop"), "hwc", "float32", "crop", layout=name,
                precision="HIGH")
    measure("datarax batched.resize (float32)", library("float32", "resize"), "hwc", "float32", "resize")
    measure("datarax batched.resized_crop (bfloat16)", library("bfloat16", "crop"), "hwc", "bfloat16", "crop")
    for dtype, level in (("float32", "HIGH"), ("bfloat16", "DEFAULT")):
        measure(f"planar, planar in and out {level} ({dtype})", planar_in_out(dtype, PRECISIONS[level]), "planar",
                dtype, "crop", planar_out=True, layout="planar in and out", precision=level)
    if args.lane_dense:
        for name in ("planar", "chw", "hwc", "interleaved", "per-record"):
            for dtype, level in (("float32", "HIGH"), ("bfloat16", "DEFAULT"), ("float32", "DEFAULT"),
                                 ("float32", "HIGHEST")):
                measure(f"{name} {level} ({dtype}), lane-dense records",
                        resampled(FORMULATIONS[name], dtype, PRECISIONS[level], "crop"),
                        "lane-dense", dtype, "crop", layout=name, precision=level)
    recorder.emit(probe="done", backend=jax.default_backend(), seconds=round(time.perf_counter() - started, 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
