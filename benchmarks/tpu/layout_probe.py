"""Which storage layout of device-resident records gathers fastest, by record shape, on this chip.

    python benchmarks/tpu/layout_probe.py            (on the chip: about a minute, compiles included)
    JAX_PLATFORMS=cpu python benchmarks/tpu/layout_probe.py --small     (a smoke run; keeps no rows)

For each record shape (uint8 images from MNIST's 28x28 to ImageNet's 256x256x3) the records are
stored two ways: in their own shape `(N, *shape)` and lane-dense `(N, prod(shape))`
(`datarax.core.layout`). A program gathers 8 batches of 128 records as the pipeline's programs do
(`jnp.take` of whole stored rows, then the reshape to the record shape) and converts them to
float32. Prints one JSON line per (shape, storage): `rate` (records/s) and `stored_bytes` (what
the array takes on the device, padding included, from the device's memory statistics; None where
the backend keeps none), and one line per shape naming the faster storage. Rows are appended to
the results when the probe ends (`benchmarks.record`), except with `--small`.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import record  # noqa: E402

SHAPES = ((28, 28), (32, 32, 3), (64, 64, 3), (96, 96, 3), (128, 128, 3), (160, 160, 3), (224, 224, 3),
          (256, 256, 3))
SMALL_SHAPES = ((28, 28), (32, 32, 3), (40, 40, 3))
BATCH, PER_PROGRAM = 128, 8
STORE_BYTES = 256 << 20  # records per shape: about this many bytes, at least two programs' worth


def bytes_in_use() -> int | None:
    stats = jax.devices()[0].memory_stats()
    return None if not stats else stats.get("bytes_in_use")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--small", action="store_true", help="small shapes for a CPU smoke run; keeps no rows")
    args = parser.parse_args(argv)
    recorder = record.Recorder(record.command_line("python benchmarks/tpu/layout_probe.py", argv or sys.argv[1:]),
                               directory=None if args.small else "default")
    timed_s = 0.02 if args.small else 0.5
    batch, per_program = (16, 2) if args.small else (BATCH, PER_PROGRAM)
    started = time.perf_counter()
    for shape in SMALL_SHAPES if args.small else SHAPES:
        size = math.prod(shape)
        n = max(4 * batch * per_program, min(64 if args.small else 16384, STORE_BYTES // size))
        images = np.random.default_rng(0).integers(0, 256, (n, *shape), dtype=np.uint8)
        perm = np.random.default_rng(1).permutation(n).astype(np.int32)
        groups = perm[:n - n % (batch * per_program)].reshape(-1, per_program, batch)
        rates = {}
        for storage, stored in (("record shape", images), ("lane-dense", images.reshape(n, size))):
            before = bytes_in_use()
            data = jax.device_put(stored)
            data.block_until_ready()
            after = bytes_in_use()
            fn = jax.jit(lambda data, idx: jax.lax.map(
                lambda i: jnp.take(data, i, axis=0).reshape(len(i), *shape).astype(jnp.float32), idx))
            start = time.perf_counter()
            out = jax.block_until_ready(fn(data, groups[0]))
            compile_s = time.perf_counter() - start
            np.testing.assert_array_equal(np.asarray(out[0][0]), images[groups[0][0][0]].astype(np.float32))
            calls, pending = 0, None
            start = time.perf_counter()
            while calls < 3 or time.perf_counter() - start < timed_s:
                out = fn(data, groups[(calls + 1) % len(groups)])
                if pending is not None:
                    pending.block_until_ready()
                pending, calls = out, calls + 1
            pending.block_until_ready()
            rates[storage] = rate = calls * batch * per_program / (time.perf_counter() - start)
            stored_bytes = None if before is None or after is None else after - before
            recorder.emit(probe="layout", shape=list(shape), storage=storage, records=n, rate=round(rate),
                          stored_bytes=stored_bytes, data_bytes=int(images.nbytes), compile_s=round(compile_s, 2))
            del data, out, pending
        faster = max(rates, key=rates.get)
        recorder.emit(probe="layout", shape=list(shape), faster=faster,
                      ratio=round(rates["lane-dense"] / rates["record shape"], 3))
    recorder.emit(probe="done", backend=jax.default_backend(), seconds=round(time.perf_counter() - started, 1))
    recorder.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
