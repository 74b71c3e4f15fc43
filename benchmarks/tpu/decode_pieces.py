"""Where one record's time goes in `DecodeImage`'s turbo path against `decode_limit`'s, one thread.

    python benchmarks/tpu/decode_pieces.py [--count 256] [--rounds 9]

Over the `jpeg` scenario's first `count` files held in memory, with OpenCV on one thread (as in a
worker process), the median of `rounds` interleaved passes, microseconds a record: the stage's
whole `decode_into`, the limit's work (header, box, decode at the DCT scale), the decode alone,
the warp alone, the header with the box draw. Also the coefficient of variation of the stage's
per-record time (each record's best of 3), the CPU's name and the features OpenCV dispatches to
(`*`: in use). The process starts JAX's backend first, as the benchmark's does: run it with
`JAX_PLATFORMS=cpu` and without to see whether an accelerator's runtime in the process slows the
host's decoding.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.peers.common import JPEG_RATIO, JPEG_SCALE, JPEG_SIZE  # noqa: E402
from benchmarks.scenarios.jpeg import image_folder, limit_decode, make_data, opencv_threads  # noqa: E402
from datarax.host import DecodeImage  # noqa: E402
from datarax.host.image import random_resized_box  # noqa: E402
from datarax.host.jpeg import TurboDecoder, _eighths  # noqa: E402
from datarax.host.stage import record_generator  # noqa: E402


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    import jax
    import numpy as np

    devices = jax.devices()  # starts the backend, as the benchmark's process has (an accelerator's runtime threads)

    image_folder(4000)
    paths = make_data(4000)["path"][:args.count].tolist()
    blobs = []
    for path in paths:
        with open(path, "rb") as f:
            blobs.append(f.read())
    turbo = TurboDecoder()
    stage = DecodeImage(size=JPEG_SIZE, crop="random_resized", scale=JPEG_SCALE, ratio=JPEG_RATIO, backend="turbo")
    out = np.empty((JPEG_SIZE, JPEG_SIZE, 3), np.uint8)
    headers = [turbo.header(d) for d in blobs]
    boxes, sizes = [], []
    for r, h in enumerate(headers):
        top, left, bh, bw = random_resized_box(h[0], h[1], JPEG_SCALE, JPEG_RATIO, record_generator(0, 0, 0, r))
        boxes.append((left, top, left + bw, top + bh))
        eighths = _eighths(boxes[-1], (JPEG_SIZE, JPEG_SIZE))
        sizes.append((eighths, math.ceil(h[0] * eighths / 8), math.ceil(h[1] * eighths / 8)))
    images = [turbo.simplejpeg.decode_jpeg(d, colorspace="RGB", min_height=s[1], min_width=s[2])
              for d, s in zip(blobs, sizes)]
    pieces = {
        "stage decode_into": lambda r, d: stage.decode_into(d, record_generator(0, 0, 0, r), out),
        "limit": lambda r, d: limit_decode(turbo, d, 0, 0, r),
        "decode alone": lambda r, d: turbo.simplejpeg.decode_jpeg(d, colorspace="RGB", min_height=sizes[r][1],
                                                                  min_width=sizes[r][2]),
        "warp alone": lambda r, d: turbo._warp_into(images[r], 8 / sizes[r][0], 1, headers[r][:2], boxes[r], out),
        "header + box": lambda r, d: random_resized_box(*turbo.header(d)[:2], JPEG_SCALE, JPEG_RATIO,
                                                        record_generator(0, 0, 0, r)),
    }
    seconds = {name: [] for name in pieces}
    with opencv_threads(turbo.cv2, 1):
        for _ in range(args.rounds):
            for name, fn in pieces.items():
                start = time.perf_counter()
                for r, d in enumerate(blobs):
                    fn(r, d)
                seconds[name].append((time.perf_counter() - start) / len(blobs) * 1e6)
        each = [math.inf] * len(blobs)  # how unevenly records cost (schedule_sim.py's --cv): each one's best of 3
        for _ in range(3):
            for r, d in enumerate(blobs):
                start = time.perf_counter()
                pieces["stage decode_into"](r, d)
                each[r] = min(each[r], time.perf_counter() - start)
    line = {name: round(statistics.median(v), 1) for name, v in seconds.items()}
    line["cv_per_record"] = round(statistics.pstdev(each) / statistics.fmean(each), 3)
    line.update(records=len(blobs), cpu=cpu_name(), cores=os.cpu_count(), backend=devices[0].platform,
                opencv_cpu=turbo.cv2.getCPUFeaturesLine())
    print(json.dumps(line), flush=True)
    stage.close()


if __name__ == "__main__":
    main()
