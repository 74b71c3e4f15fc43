"""Where the CPU of a JPEG epoch goes, thread by thread and call by call, on this host.

    python benchmarks/tpu/decode_threads.py [--scale 1.0]

The `jpeg` scenario's files and pipeline at its defaults. Prints one JSON line with the CPU
seconds of each thread of this process over a timed epoch (by thread name: the reader, the queue's
feeder, the main thread, the runtime's threads), one with the workers' CPU, and the top of a
profile of `DecodeImage`'s own per-record work on one core (`cProfile`, from memory), then one
line with each step of the turbo path timed alone (`steps_us_per_record`) and OpenCV's warp and
resize of a synthetic image. The JSON lines are appended to the results (`benchmarks.record`).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import psutil  # noqa: E402

from benchmarks import record  # noqa: E402
from benchmarks.scenarios.jpeg import JPEG_RATIO, JPEG_SCALE, JPEG_SIZE, NUM_RECORDS, build_pipeline, image_folder  # noqa: E402
from benchmarks.timing import block  # noqa: E402
from datarax.host import DecodeImage  # noqa: E402
from datarax.samplers.keyed import rekeyed_generator  # noqa: E402
from datarax.sources import ImageFolderSource  # noqa: E402


def thread_cpu() -> dict[str, float]:
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in psutil.Process().threads():
        name = names.get(t.id, "native")
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


def children_cpu() -> float:
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args()
    recorder = record.Recorder(record.command_line("python benchmarks/tpu/decode_threads.py", sys.argv[1:]))
    n = max(64, int(NUM_RECORDS * args.scale))
    root = image_folder(n)
    pipeline = build_pipeline(root)
    per_epoch = len(pipeline)
    batches = iter(pipeline.epochs(3))  # one reader thread for all three: its CPU is read while it lives
    block([next(batches) for _ in range(per_epoch)])  # warm-up epoch
    before, kids = thread_cpu(), children_cpu()
    start = time.perf_counter()
    block([next(batches) for _ in range(per_epoch)])
    wall = time.perf_counter() - start
    after = thread_cpu()
    per_thread = {k: round(after.get(k, 0.0) - before.get(k, 0.0), 3) for k in after}
    busiest = dict(sorted(per_thread.items(), key=lambda kv: -kv[1])[:12])
    recorder.emit(scenario="jpeg_profile", framework="epoch at the defaults", el_s=round(n / wall, 1),
                  wall_s=round(wall, 3), workers_cpu_s=round(children_cpu() - kids, 3), threads_cpu_s=busiest)
    pipeline.close()

    paths = list(ImageFolderSource(root=root).paths)[:600]
    blobs = [open(p, "rb").read() for p in paths]
    stage = DecodeImage(size=JPEG_SIZE, crop="random_resized", scale=JPEG_SCALE, ratio=JPEG_RATIO, executor="threads",
                        num_threads=1)
    stage._turbo.cv2.setNumThreads(1)
    out = np.empty((JPEG_SIZE, JPEG_SIZE, 3), np.uint8)

    def work() -> None:
        for i, data in enumerate(blobs):
            stage.decode_into(data, rekeyed_generator(0, 0, 0, i), out)

    work()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.runcall(work)
    per_record = (time.perf_counter() - start) / len(blobs)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
    recorder.emit(scenario="jpeg_profile", framework="DecodeImage per record, one core (cProfile)",
                  profiled_us_per_record=round(1e6 * per_record, 1))
    print(text.getvalue())

    # OpenCV's resampling alone on a 300x400 RGB image into 128x128: the warp DecodeImage uses,
    # and a crop + resize of the same box (which rounds differently), one core.
    cv2 = stage._turbo.cv2
    image = np.random.default_rng(0).integers(0, 255, (300, 400, 3), dtype=np.uint8)
    matrix = np.array([[1.3, 0.0, 10.2], [0.0, 1.2, 5.7]])
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP

    def warp() -> None:
        cv2.warpAffine(image, matrix, (JPEG_SIZE, JPEG_SIZE), dst=out, flags=flags, borderMode=cv2.BORDER_REPLICATE)

    def resize() -> None:
        cv2.resize(image[5:159, 10:176], (JPEG_SIZE, JPEG_SIZE), dst=out, interpolation=cv2.INTER_LINEAR)

    timings = {}
    for name, fn in (("warpAffine", warp), ("resize", resize)):
        fn()
        start = time.perf_counter()
        for _ in range(2000):
            fn()
        timings[f"{name}_us"] = round(1e6 * (time.perf_counter() - start) / 2000, 1)
    recorder.emit(scenario="jpeg_profile", framework="turbo path steps, one core (us a record)",
                  steps_us_per_record=steps(stage, blobs, out), **{f"synthetic_{k}": v for k, v in timings.items()},
                  opencv=cv2.__version__, cpu_features=cv2.getCPUFeaturesLine())
    recorder.close()


def steps(stage: DecodeImage, blobs: list[bytes], out: np.ndarray) -> dict[str, float]:
    """Each step of the turbo path on the same records, timed alone over all of them (one core):
    the header, the box, the DCT-scale decode, the warp of the decoded image (and of the same
    image after a copy: whether the decoder's fresh pages cost the warp), and the whole record."""
    from datarax.host import jpeg

    turbo = stage._turbo
    headers = [turbo.header(data) for data in blobs]
    boxes = [stage._box(h.height, h.width, rekeyed_generator(0, 0, 0, i)) for i, h in enumerate(headers)]
    scales = [jpeg._eighths(box, out.shape[:2]) for box in boxes]

    def decode(i):
        h = headers[i]
        raw_h, raw_w = (h.width, h.height) if h.orientation >= 5 else (h.height, h.width)
        e = scales[i]
        return turbo.simplejpeg.decode_jpeg(blobs[i], colorspace=h.colour, min_height=-(-raw_h * e // 8),
                                            min_width=-(-raw_w * e // 8))

    decoded = [decode(i) for i in range(len(blobs))]
    copies = [np.array(image) for image in decoded]

    def warp(images):
        def run(i):
            h = headers[i]
            raw = (h.width, h.height) if h.orientation >= 5 else (h.height, h.width)
            turbo._warp_into(images[i], 8 / scales[i], h.orientation, raw, boxes[i], out)
        return run

    parts = {"header": lambda i: turbo.header(blobs[i]),
             "exif": lambda i: jpeg.exif_orientation(blobs[i]),
             "box": lambda i: stage._box(headers[i].height, headers[i].width, rekeyed_generator(0, 0, 0, i)),
             "decode": decode, "warp": warp(decoded), "warp_of_copies": warp(copies),
             "record": lambda i: stage.decode_into(blobs[i], rekeyed_generator(0, 0, 0, i), out)}
    timed = {}
    for name, fn in parts.items():
        for i in range(len(blobs)):
            fn(i)
        start = time.perf_counter()
        for _ in range(3):
            for i in range(len(blobs)):
                fn(i)
        timed[name] = round(1e6 * (time.perf_counter() - start) / (3 * len(blobs)), 1)
    return timed


if __name__ == "__main__":
    main()
