"""Why decoding stops near 2 cores' worth on the 13-core TPU host. Prints JSON lines.

Usage: python decode_probe.py [--with-jax]   (with-jax: open the TPU first, as the benchmark does)
"""
import concurrent.futures
import os
import sys
import threading
import time

import numpy as np

if "--with-jax" in sys.argv:
    import jax
    jax.devices()

from benchmarks import record
from benchmarks.peers.common import JPEG_RATIO, JPEG_SCALE
from benchmarks.scenarios.jpeg import dct_scale, image_folder
from datarax.host.image import random_resized_box
from datarax.host.jpeg import TurboDecoder
from datarax.host.stage import record_generator
from datarax.sources import ImageFolderSource

TAG = "with_jax" if "--with-jax" in sys.argv else "no_jax"


RECORDER = record.Recorder(record.command_line("python benchmarks/tpu/decode_probe.py", sys.argv[1:]))


def emit(**kw):
    RECORDER.emit(tag=TAG, **kw)


emit(probe="cpus", cpu_count=os.cpu_count(), affinity=len(os.sched_getaffinity(0)),
     threads_now=threading.active_count())
t = time.perf_counter()
root = image_folder(4000)
emit(probe="folder", seconds=round(time.perf_counter() - t, 2), root=root)
paths = list(ImageFolderSource(root=root).paths)
turbo = TurboDecoder()
sj = turbo.simplejpeg

t = time.perf_counter()
blobs = []
for p in paths:
    with open(p, "rb") as f:
        blobs.append(f.read())
emit(probe="read_serial", rate=round(len(paths) / (time.perf_counter() - t)),
     mb=round(sum(map(len, blobs)) / 1e6, 1))
headers = [turbo.header(b) for b in blobs]
boxes = [random_resized_box(h[0], h[1], JPEG_SCALE, JPEG_RATIO, record_generator(0, 0, 1, i))
         for i, h in enumerate(headers)]


def decode_mem(i):
    h = headers[i]
    s = dct_scale(boxes[i][2], boxes[i][3])
    sj.decode_jpeg(blobs[i], min_height=-(-h[0] // s), min_width=-(-h[1] // s))


def read_only(i):
    with open(paths[i], "rb") as f:
        f.read()


def python_part(i):
    h = turbo.header(blobs[i])
    random_resized_box(h[0], h[1], JPEG_SCALE, JPEG_RATIO, record_generator(0, 0, 1, i))


def full_limit(i):  # what the benchmark's decode_limit does per record
    with open(paths[i], "rb") as f:
        data = f.read()
    h = turbo.header(data)
    top, left, bh, bw = random_resized_box(h[0], h[1], JPEG_SCALE, JPEG_RATIO, record_generator(0, 0, 1, i))
    s = dct_scale(bh, bw)
    sj.decode_jpeg(data, min_height=-(-h[0] // s), min_width=-(-h[1] // s))


sizes = [len(b) for b in blobs]


def read_os(i):
    fd = os.open(paths[i], os.O_RDONLY)
    try:
        return os.read(fd, sizes[i])
    finally:
        os.close(fd)


def full_limit_os(i):
    data = read_os(i)
    h = turbo.header(data)
    top, left, bh, bw = random_resized_box(h[0], h[1], JPEG_SCALE, JPEG_RATIO, record_generator(0, 0, 1, i))
    s = dct_scale(bh, bw)
    sj.decode_jpeg(data, min_height=-(-h[0] // s), min_width=-(-h[1] // s))


def stat_only(i):
    os.stat(paths[i])


def decode_warp(i):
    out = np.empty((128, 128, 3), np.uint8)
    top, left, bh, bw = boxes[i]
    turbo.decode_into(blobs[i], headers[i], (left, top, left + bw, top + bh), out)


def rate(fn, threads, n=None):
    n = n or (1000 if threads <= 1 else len(paths))
    ids = list(range(n))
    if threads == 0:
        t = time.perf_counter()
        for i in ids:
            fn(i)
        return n / (time.perf_counter() - t)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, ids[:64]))
        t = time.perf_counter()
        list(pool.map(fn, ids, chunksize=16))
        return n / (time.perf_counter() - t)


WITH_JAX_SET = ("decode_mem", "full_limit", "read_only")
for name, fn in (("decode_mem", decode_mem), ("read_only", read_only), ("python_part", python_part),
                 ("full_limit", full_limit), ("decode_warp", decode_warp), ("read_os", read_os),
                 ("full_limit_os", full_limit_os), ("stat_only", stat_only)):
    for threads in (0, 1, 2, 4, 8, 13):
        if name in ("python_part", "stat_only") and threads not in (0, 1, 13):
            continue
        if TAG == "with_jax" and (name not in WITH_JAX_SET or threads not in (1, 13)):
            continue
        emit(probe=name, threads=threads, rate=round(rate(fn, threads)))

# batch-submitted like the benchmark's Floor: 64 futures per batch, one batch ahead
def floor_like(fn, threads):
    pool = concurrent.futures.ThreadPoolExecutor(threads)
    ids = list(range(len(paths)))
    t = time.perf_counter()
    pending = [pool.submit(fn, i) for i in ids[:64]]
    for s in range(64, len(ids) + 64, 64):
        nxt = [pool.submit(fn, i) for i in ids[s:s + 64]]
        for f in pending:
            f.result()
        pending = nxt
    r = len(ids) / (time.perf_counter() - t)
    pool.shutdown()
    return r


for threads in (1, 13) if TAG == "no_jax" else ():
    emit(probe="floor_like_full_limit", threads=threads, rate=round(floor_like(full_limit, threads)))
emit(probe="threads_at_end", threads=threading.active_count())


def proc_rate(fn, procs):
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(procs, mp_context=ctx) as pool:
        list(pool.map(fn, range(procs * 4)))
        t = time.perf_counter()
        list(pool.map(fn, range(len(paths)), chunksize=32))
        return len(paths) / (time.perf_counter() - t)


if TAG == "no_jax":
    for procs in (1, 4, 13):
        emit(probe="procs_full_limit", procs=procs, rate=round(proc_rate(full_limit, procs)))
        emit(probe="procs_read_only", procs=procs, rate=round(proc_rate(read_only, procs)))
