"""The `limit` rows: the fastest hand-written programs found for a scenario's exact output.

A floor is the work as a user would hand-write it, one jitted call per batch. A limit asks what
the hardware can do for the same output: each candidate formulation runs with one batch per
dispatched program and with `PER_PROGRAM` (a `lax.scan`, so dispatch costs next to nothing),
from data stored the way the backend is fastest, and the fastest candidate is the row. On a TPU
the winner is the selection matrices on the lane-dense view at 32 batches per program
(docs/tpu.md); on the CPU, where a scanned body loses XLA's intra-op threads, the per-record
code at one batch per program (the floor itself).

Every candidate's output is checked equal to the floor's on one batch before it is timed.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import interleaved_rates, permuted_batches

PER_PROGRAM = 32
HIGHEST = jax.lax.Precision.HIGHEST


def reflect(p: jax.Array, n: int) -> jax.Array:
    """numpy's `reflect` padding index for positions `p` (counted from the unpadded start)."""
    p = jnp.abs(p)
    return jnp.where(p >= n, 2 * (n - 1) - p, p)


def selection_crop_flip(images: jax.Array, dy: jax.Array, dx: jax.Array, flip: jax.Array, pad: int) -> jax.Array:
    """Reflect-pad `pad`, crop at (dy, dx), flip where `flip`: two one-hot products per record on
    the lane-dense view `(B, H, W * C)`, exact at `HIGHEST` precision for float32 images."""
    batch, height, width, channels = images.shape
    i, j = jnp.arange(height), jnp.arange(width)
    rows = reflect(dy[:, None] + i - pad, height)
    cols = reflect(dx[:, None] + jnp.where(flip[:, None], width - 1 - j, j) - pad, width)
    row_sel = (rows[:, :, None] == i).astype(images.dtype)                              # (B, H_out, H)
    col_sel = (cols[:, :, None] == j).astype(images.dtype)                              # (B, W_out, W)
    per_lane = jnp.einsum("blk,cd->bkcld", col_sel, jnp.eye(channels, dtype=images.dtype), precision=HIGHEST)
    per_lane = per_lane.reshape(batch, width * channels, width * channels)
    picked = jnp.einsum("bij,bjk->bik", row_sel, images.reshape(batch, height, width * channels), precision=HIGHEST)
    return jnp.einsum("bik,bkm->bim", picked, per_lane, precision=HIGHEST).reshape(images.shape)


def keyed(seed: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """`keys(idx, epoch)`: the floor's per-record keys `fold_in(fold_in(key(seed), epoch), record)`."""
    key = jax.random.key(seed)

    def keys(idx, epoch):
        base = jax.random.fold_in(key, epoch)
        return jax.vmap(lambda r: jax.random.fold_in(base, r))(idx)

    return keys


def many_batches(per_batch: Callable, per_program: int):
    """A jitted `program(arrays, idx[K, B], epoch) -> stacked outputs` running `per_batch(arrays, idx,
    epoch)` over K batches in a `lax.scan` (K = 1: the batch alone, no scan)."""

    @jax.jit
    def program(arrays, idx, epoch):
        if per_program == 1:
            return per_batch(arrays, idx[0], epoch)
        return jax.lax.scan(lambda c, i: (c, per_batch(arrays, i, epoch)), None, idx)[1]

    return program


def epoch_of(program: Callable, arrays: dict, n: int, batch: int, seed: int, per_program: int):
    """`epoch_iter(epoch)`: the epoch's batches (a NumPy permutation, the floor's), `per_program`
    per call; the last group is padded with repeats of its last batch."""

    def epoch_iter(epoch):
        groups = list(permuted_batches(n, batch, seed, epoch))
        for start in range(0, len(groups), per_program):
            part = [idx for idx, _ in groups[start:start + per_program]]
            part += [part[-1]] * (per_program - len(part))
            yield program(arrays, np.stack(part), np.int32(epoch))

    return epoch_iter


def limit_row(scenario: str, candidates: dict[str, tuple[Callable, dict]], check: Callable[[Callable, dict], None],
              n: int, batch: int, repeats: int, seed: int = 0) -> dict:
    """Times each candidate `name -> (per_batch, arrays)` (after `check(per_batch, arrays)` raises
    nothing for it) over whole epochs, interleaved; the fastest is the `limit` row."""
    sides = {}
    for name, (per_batch, arrays) in candidates.items():
        check(per_batch, arrays)
        # On the CPU a scanned body loses XLA's intra-op threads (10-70x slower, measured): one per program.
        for per_program in ((1,) if jax.default_backend() == "cpu" else (1, PER_PROGRAM)):
            epoch_iter = epoch_of(many_batches(per_batch, per_program), arrays, n, batch, seed, per_program)
            jax.block_until_ready(list(epoch_iter(0)))  # compile and warm up
            counter = iter(range(1, 10**6))
            sides[f"{name}, {per_program} per program"] = (
                lambda epoch_iter=epoch_iter, counter=counter: epoch_iter(next(counter)))
    rates = interleaved_rates(sides, n, repeats)
    best = max(rates, key=lambda name: rates[name]["el_s"])
    others = "; ".join(f"{name} {rates[name]['el_s']:,.0f}" for name in rates if name != best)
    return {"scenario": scenario, "framework": "limit", "el_s": round(rates[best]["el_s"], 1),
            "el_s_runs": rates[best]["el_s_runs"], "backend": jax.default_backend(),
            "settings": f"hand-written: {best} (fastest)"
                        + (f"; also tried {others}" if others else "")}
