"""`sharded`: the `cifar` scenario with global batches sharded over 1, 2, 4 and 8 fake CPU devices.

Each device count runs in its own process started with
`XLA_FLAGS=--xla_force_host_platform_device_count=K` (the count is fixed when JAX starts). In it
the pipeline emits global batches split over a `data` mesh of the K devices
(`DataSharding.data_parallel()`), so XLA partitions the fused gather + augmentation step and
each device transforms its own B/K records. The floor is the same pipeline unsharded, in the
same process (one device does all the work), so `ratio` is the gain or loss from sharding.
Fake CPU devices share the machine's cores: the numbers measure the sharding overhead and the
available parallelism, not a multi-accelerator speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from benchmarks.registry import BenchOptions

DEVICE_COUNTS = (1, 2, 4, 8)
CHILD_TIMEOUT_S = 900


def measure(devices: int, options: BenchOptions) -> dict:
    """Runs in a process with `devices` fake CPU devices: sharded pipeline vs unsharded floor."""
    import jax
    from flax import nnx

    from benchmarks.scenarios.cifar import BATCH, NUM_RECORDS, augment, make_data
    from benchmarks.timing import epoch_rate, first_batch_seconds, row
    from datarax import Pipeline
    from datarax.operators import ElementOperator, ElementOperatorConfig
    from datarax.sharding import DataSharding
    from datarax.sources import MemorySource, MemorySourceConfig

    if jax.device_count() != devices:
        raise RuntimeError(f"expected {devices} devices, JAX sees {jax.device_count()}; is XLA_FLAGS overridden?")
    n = options.records(NUM_RECORDS)
    data = make_data(n)

    def build(sharding):
        source = MemorySource(MemorySourceConfig(shuffle=True, seed=0), data=data)
        op = ElementOperator(ElementOperatorConfig(stochastic=True), fn=augment, rngs=nnx.Rngs(0))
        return Pipeline(source, [op], batch_size=BATCH, sharding=sharding)

    def rate(pipeline):
        first = first_batch_seconds(lambda: pipeline)
        for _ in pipeline:  # the rest of the warm-up epoch
            pass
        return epoch_rate(lambda: pipeline, n, options.repeats), first

    start = time.perf_counter()
    sharded = build(DataSharding.data_parallel())
    build_s = time.perf_counter() - start
    ours, first = rate(sharded)
    floor, floor_first = rate(build(None))
    return row("sharded", ours, floor, devices=devices, records=n, batch_size=BATCH,
               first_batch_s=round(build_s + first, 3), floor_first_batch_s=round(floor_first, 3))


def run_child(devices: int, options: BenchOptions) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    cmd = [sys.executable, "-m", "benchmarks.scenarios.sharded", "--devices", str(devices),
           "--repeats", str(options.repeats), "--scale", str(options.scale)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    if proc.returncode != 0:
        raise RuntimeError(f"the sharded benchmark on {devices} devices failed (exit {proc.returncode}):\n"
                           f"{err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def run(options: BenchOptions) -> list[dict]:
    return [run_child(k, options) for k in DEVICE_COUNTS]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="one device count of the sharded scenario (run by `run`)")
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.devices, BenchOptions(repeats=args.repeats, scale=args.scale))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
