"""Per-stage timings behind the augment_chain numbers: `python -m benchmarks.stages`.

Times `jit(vmap(...))` over one batch of 64 128x128x3 float images (median of 9 calls after a
warm-up), for:

* noise draws: `jax.random.normal`, the 16-bit threefry scheme datarax used before, and
  `datarax.core.noise.standard_normal`;
* the augment_chain maths (crop, flip, brightness, contrast, rotation, noise) fused in one
  function, without the noise, and with the rotation computed separately
  (`datarax.core.fusion.separately`, as the warp operators do on CPU).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.scenarios.augment_chain import hand_written_chain
from datarax.core import noise


def threefry_16bit_normal(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """The previous scheme: 16-bit uniforms, two per threefry word, through the inverse normal CDF."""
    size = math.prod(shape)
    words = jax.random.bits(key, ((size + 1) // 2,), jnp.uint32)
    halves = jnp.concatenate([words & 0xFFFF, words >> 16])[:size]
    return (jax.lax.erf_inv(2.0 * (halves.astype(jnp.float32) + 0.5) / 65536.0 - 1.0) * math.sqrt(2.0)).reshape(shape)


def median_ms(fn, *args, calls: int = 9) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--side", type=int, default=128)
    args = parser.parse_args(argv)
    images = jnp.asarray(np.random.default_rng(0).random((args.batch, args.side, args.side, 3), np.float32))
    keys = jax.random.split(jax.random.key(0), args.batch)
    shape = images.shape[1:]
    rows = {
        "noise: jax.random.normal": jax.jit(jax.vmap(lambda k: jax.random.normal(k, shape))),
        "noise: 16-bit threefry (previous)": jax.jit(jax.vmap(lambda k: threefry_16bit_normal(k, shape))),
        "noise: datarax.core.noise": jax.jit(jax.vmap(lambda k: noise.standard_normal(k, shape))),
    }
    results = {name: median_ms(fn, keys) for name, fn in rows.items()}
    for name, kwargs in (("chain fused", {"separate": False}),
                         ("chain fused, without noise", {"separate": False, "with_noise": False}),
                         ("chain, rotation separate", {})):
        fn = jax.jit(lambda x, k, e, kw=kwargs: hand_written_chain(x, k, e >= 0, **kw))
        results[name] = median_ms(fn, images, keys, 0)
    print(f"batch of {args.batch} x {args.side}x{args.side}x3, backend {jax.default_backend()}, median of 9 calls")
    for name, ms in results.items():
        print(f"  {name:34s} {ms:8.2f} ms")
    return results


if __name__ == "__main__":
    main()
