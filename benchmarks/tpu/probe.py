"""Formulations of the CIFAR crop/flip/normalise and of a bilinear rotation, timed on the chip.

    python benchmarks/tpu/probe.py        (PROBE_QUICK=1: two batches a formulation)

Prints JSON lines `{"probe": name, "rate": records/s, "max_err": vs reference, ...}` and appends
them to the results (`benchmarks.record`). docs/tpu.md quotes them.
"""
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import record
from benchmarks.scenarios.cifar import augment_image  # the floor's per-record code
from datarax.operators.image.functional import geometry

QUICK = os.environ.get("PROBE_QUICK") == "1"

HI = jax.lax.Precision.HIGHEST
HIGH = jax.lax.Precision.HIGH
MEAN = jnp.array([0.4914, 0.4822, 0.4465])
STD = jnp.array([0.2470, 0.2435, 0.2616])


emit = record.Recorder(record.command_line("python benchmarks/tpu/probe.py", sys.argv[1:])).emit


def timed(fn, args_iter, n_batches, batch):
    n_batches = 2 if QUICK else n_batches
    outs = None
    for a in args_iter(3):
        outs = fn(*a)
    jax.block_until_ready(outs)
    t = time.perf_counter()
    for a in args_iter(n_batches):
        outs = fn(*a)
    jax.block_until_ready(outs)
    return n_batches * batch / (time.perf_counter() - t)


# ---------------------------------------------------------------- cifar
N, B = 50_000, 256
rng = np.random.default_rng(0)
data = rng.integers(0, 256, (N, 32, 32, 3), dtype=np.uint8)
nhwc = jax.device_put(data)
dense = jax.device_put(data.reshape(N, -1))
KEY = jax.random.key(0)


def record_keys(idx, epoch):
    base = jax.random.fold_in(KEY, epoch)
    return jax.vmap(lambda r: jax.random.fold_in(base, r))(idx)


def draws(keys):
    def one(key):
        k_crop, k_flip = jax.random.split(key)
        dy, dx = jax.random.randint(k_crop, (2,), 0, 9)
        return dy, dx, jax.random.bernoulli(k_flip)
    return jax.vmap(one)(keys)


def reflect(p, n):
    p = jnp.abs(p)
    return jnp.where(p >= n, 2 * (n - 1) - p, p)


def selections(keys, dtype):
    dy, dx, flip = draws(keys)
    i = jnp.arange(32)
    rows_src = reflect(dy[:, None] + i[None] - 4, 32)                      # (B, 32)
    cols_out = jnp.where(flip[:, None], 31 - i[None], i[None])
    cols_src = reflect(dx[:, None] + cols_out - 4, 32)                     # (B, 32)
    R = (rows_src[:, :, None] == i[None, None]).astype(dtype)              # (B, out, in)
    C = (cols_src[:, :, None] == i[None, None]).astype(dtype)              # (B, out, in)
    return R, C


def kron_cols(C, channels, dtype):
    eye = jnp.eye(channels, dtype=dtype)
    b, wo, wi = C.shape
    return jnp.einsum("blk,cd->bkcld", C, eye).reshape(b, wi * channels, wo * channels)


def f_floor(images, labels, idx, epoch):
    keys = record_keys(idx, epoch)
    return {"image": jax.vmap(augment_image)(jnp.take(images, idx, axis=0), keys), "label": jnp.take(labels, idx)}


def f_dense_floor(images, labels, idx, epoch):
    keys = record_keys(idx, epoch)
    x = jnp.take(images, idx, axis=0).reshape(-1, 32, 32, 3)
    return {"image": jax.vmap(augment_image)(x, keys), "label": jnp.take(labels, idx)}


def f_onehot_issue(images, labels, idx, epoch):
    keys = record_keys(idx, epoch)
    x = jnp.take(images, idx, axis=0).reshape(-1, 32, 32, 3).astype(jnp.float32) / 255.0
    R, C = selections(keys, jnp.float32)
    out = jnp.einsum("bij,bjkc,blk->bilc", R, x, C, precision=HI)
    return {"image": (out - MEAN) / STD, "label": jnp.take(labels, idx)}


def make_mm2(precision=HI, u8=False, dense_out=False, split3=False, dense_norm=True):
    def f(images, labels, idx, epoch):
        keys = record_keys(idx, epoch)
        g = jnp.take(images, idx, axis=0).reshape(-1, 32, 96)
        if u8:
            x = g.astype(jnp.bfloat16)
            R, C = selections(keys, jnp.bfloat16)
            Ck = kron_cols(C, 3, jnp.bfloat16)
            y = jnp.einsum("bij,bjk->bik", R, x, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
            y = jnp.einsum("bik,bkm->bim", y, Ck, preferred_element_type=jnp.float32)
            y = y / 255.0
        else:
            x = g.astype(jnp.float32) / 255.0
            R, C = selections(keys, jnp.float32)
            Ck = kron_cols(C, 3, jnp.float32)
            if split3:
                hi = x.astype(jnp.bfloat16)
                r1 = x - hi.astype(jnp.float32)
                mid = r1.astype(jnp.bfloat16)
                lo = (r1 - mid.astype(jnp.float32)).astype(jnp.bfloat16)
                parts = jnp.concatenate([hi, mid, lo], axis=-1)                     # (B, 32, 288)
                Rb = R.astype(jnp.bfloat16)
                y = jnp.einsum("bij,bjk->bik", Rb, parts, preferred_element_type=jnp.float32)
                y = y.reshape(y.shape[0], 32, 3, 96)
                # each part goes through the column selection; sum at the end
                yp = jnp.einsum("bipk,bkm->bipm", y.astype(jnp.bfloat16), Ck.astype(jnp.bfloat16),
                                preferred_element_type=jnp.float32)
                y = yp[:, :, 0] + yp[:, :, 1] + yp[:, :, 2]
            else:
                y = jnp.einsum("bij,bjk->bik", R, x, precision=precision)
                y = jnp.einsum("bik,bkm->bim", y, Ck, precision=precision)
        if dense_norm:
            out = (y - jnp.tile(MEAN, 32)) / jnp.tile(STD, 32)
            out = out if dense_out else out.reshape(-1, 32, 32, 3)
        else:
            out = (y.reshape(-1, 32, 32, 3) - MEAN) / STD
        return {"image": out, "label": jnp.take(labels, idx)}
    return f


labels = jax.device_put(rng.integers(0, 10, (N,), dtype=np.int32))
perm = np.random.default_rng(1).permutation(N).astype(np.int32)


def cifar_args(store):
    def it(n):
        for s in range(n):
            j = (s % (N // B)) * B
            yield store, labels, perm[j:j + B], np.int32(1)
    return it


ref = jax.jit(f_floor)(nhwc, labels, perm[:B], np.int32(1))["image"]
variants = {
    "floor_nhwc": (f_floor, nhwc),
    "floor_dense_store": (f_dense_floor, dense),
    "onehot_issue_HI": (f_onehot_issue, dense),
    "mm2_HI": (make_mm2(HI), dense),
    "mm2_HI_nhwc_norm": (make_mm2(HI, dense_norm=False), dense),
    "mm2_HIGH": (make_mm2(HIGH), dense),
    "mm2_split3": (make_mm2(split3=True), dense),
    "mm2_u8_bf16": (make_mm2(u8=True), dense),
    "mm2_HI_dense_out": (make_mm2(HI, dense_out=True), dense),
}
for name, (fn, store) in variants.items():
    try:
        jf = jax.jit(fn)
        out = jf(store, labels, perm[:B], np.int32(1))["image"]
        err = float(jnp.max(jnp.abs(out.reshape(ref.shape) - ref)))
        nb = 100 if name.startswith("floor") else 300
        rate = timed(jf, cifar_args(store), nb, B)
        emit(probe="cifar", variant=name, rate=round(rate), max_err=err)
    except Exception as exc:  # a variant that fails is reported, and the probe goes on
        emit(probe="cifar", variant=name, error=f"{type(exc).__name__}: {exc}"[:400])

# K batches per program (vmap over K, K separate outputs)
for K in (1, 4, 8, 16):
    base = make_mm2(HI)

    def fk(store, labels, idxs, epoch, base=base, K=K):
        out = jax.vmap(lambda i: base(store, labels, i, epoch))(idxs)
        return [jax.tree.map(lambda x: x[k], out) for k in range(K)]
    jf = jax.jit(fk)

    def it(n, K=K):
        for s in range(n):
            j = (s * K % (N // B - K)) * B
            yield dense, labels, perm[j:j + K * B].reshape(K, B), np.int32(1)
    rate = timed(jf, it, max(10, 300 // K), K * B)
    emit(probe="cifar_k", variant=f"mm2_HI_K{K}", rate=round(rate))

# dispatch cost
tiny = jax.jit(lambda x: x + 1)
x = jnp.zeros((8,))
for _ in range(10):
    x = tiny(x)
jax.block_until_ready(x)
t = time.perf_counter()
for _ in range(2000):
    x = tiny(x)
jax.block_until_ready(x)
emit(probe="dispatch", variant="tiny_jit_chain", us_per_call=round(1e6 * (time.perf_counter() - t) / 2000, 1))
t = time.perf_counter()
for _ in range(2000):
    y = tiny(np.zeros((8,), np.float32))
jax.block_until_ready(y)
emit(probe="dispatch", variant="tiny_jit_numpy_arg", us_per_call=round(1e6 * (time.perf_counter() - t) / 2000, 1))

# ---------------------------------------------------------------- rotation
def rot_inverse(angle, side):
    return geometry.affine_matrix(angle, ((side - 1) / 2.0, (side - 1) / 2.0))


def r_gather(images, angles):
    return jax.vmap(geometry.rotate)(images, angles)


def tri_weights(src, n):
    """(..., n) bilinear weights of positions `src` (...,) on taps 0..n-1; outside taps read fill 0."""
    taps = jnp.arange(n, dtype=src.dtype)
    return jnp.maximum(0.0, 1.0 - jnp.abs(taps - src[..., None]))


def make_r_sep(precision):
    def f(images, angles):
        b, h, w, c = images.shape
        inv = jax.vmap(lambda a: rot_inverse(a, h))(angles)                       # (B, 2, 3)
        ys, xs = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32), indexing="ij")
        src_x = inv[:, 0, 0, None, None] * xs + inv[:, 0, 1, None, None] * ys + inv[:, 0, 2, None, None]
        src_y = inv[:, 1, 0, None, None] * xs + inv[:, 1, 1, None, None] * ys + inv[:, 1, 2, None, None]
        wx = tri_weights(src_x.reshape(b, h * w), w)                               # (B, P, W)
        wy = tri_weights(src_y.reshape(b, h * w), h)                               # (B, P, H)
        xt = jnp.transpose(images, (0, 2, 1, 3)).reshape(b, w, h * c)             # (B, W, H*C)
        u = jnp.einsum("bpx,bxm->bpm", wx, xt, precision=precision).reshape(b, h * w, h, c)
        out = jnp.einsum("bpy,bpyc->bpc", wy, u, precision=precision)
        return out.reshape(b, h, w, c)
    return f


def r_flat_gather(images, angles):
    b, h, w, c = images.shape
    inv = jax.vmap(lambda a: rot_inverse(a, h))(angles)
    ys, xs = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32), indexing="ij")
    src_x = inv[:, 0, 0, None, None] * xs + inv[:, 0, 1, None, None] * ys + inv[:, 0, 2, None, None]
    src_y = inv[:, 1, 0, None, None] * xs + inv[:, 1, 1, None, None] * ys + inv[:, 1, 2, None, None]
    flat = images.reshape(b, h * w * c)
    x0, y0 = jnp.floor(src_x), jnp.floor(src_y)
    fx, fy = (src_x - x0)[..., None], (src_y - y0)[..., None]
    x0, y0 = x0.astype(jnp.int32), y0.astype(jnp.int32)
    ch = jnp.arange(c)

    def tap(yy, xx):
        inside = ((yy >= 0) & (yy < h) & (xx >= 0) & (xx < w))[..., None]
        index = ((jnp.clip(yy, 0, h - 1) * w + jnp.clip(xx, 0, w - 1)) * c)[..., None] + ch
        v = jnp.take_along_axis(flat, index.reshape(b, -1), axis=1).reshape(b, h, w, c)
        return jnp.where(inside, v, 0.0)
    top = (1 - fx) * tap(y0, x0) + fx * tap(y0, x0 + 1)
    bot = (1 - fx) * tap(y0 + 1, x0) + fx * tap(y0 + 1, x0 + 1)
    return (1 - fy) * top + fy * bot


for side, n, batch in ((32, 8192, 256), (128, 1024, 64)) if not QUICK else ((32, 512, 64), (64, 128, 16)):
    imgs = jax.device_put(np.random.default_rng(2).random((n, side, side, 3), dtype=np.float32))
    ang = np.random.default_rng(3).uniform(-15, 15, (n,)).astype(np.float32)
    pperm = np.random.default_rng(4).permutation(n).astype(np.int32)

    def rargs(nb, imgs=imgs, batch=batch, n=n):
        for s in range(nb):
            j = (s % (n // batch)) * batch
            yield imgs, pperm[j:j + batch], ang[pperm[j:j + batch]]

    def wrap(fn):
        return jax.jit(lambda store, idx, a: fn(jnp.take(store, idx, axis=0), a))
    refr = wrap(r_gather)(imgs, pperm[:batch], ang[pperm[:batch]])
    for name, fn in (("gather_vmap", r_gather), ("flat_gather", r_flat_gather), ("sep_mm_HI", make_r_sep(HI)),
                     ("sep_mm_HIGH", make_r_sep(HIGH)), ("sep_mm_DEFAULT", make_r_sep(None))):
        try:
            jf = wrap(fn)
            out = jf(imgs, pperm[:batch], ang[pperm[:batch]])
            err = float(jnp.max(jnp.abs(out - refr)))
            rate = timed(jf, rargs, 40, batch)
            emit(probe=f"rotate_{side}", variant=name, rate=round(rate), max_err=err)
        except Exception as exc:  # a variant that fails is reported, and the probe goes on
            emit(probe=f"rotate_{side}", variant=name, error=f"{type(exc).__name__}: {exc}"[:400])

emit(probe="done", backend=jax.default_backend(), devices=str(jax.devices()))
sys.exit(0)
