"""What the chip host can decode when nothing batches, syncs or copies: the `jpeg` scenario's
per-record work in free-running worker processes (each its own share of the files, no IPC until
the end), beside the process-pool limit row at deeper queues and the pipeline at its defaults.

    python benchmarks/tpu/decode_ceiling.py [--procs 1,13] [--records 4000]

Modes (each record: the scenario's random-resized box, epoch 1):
  read         open().read() of the file
  read_ref     `read_data_file` (what `ImageFolderSource`'s references read: open, fstat, reads, close)
  read_os      os.open, one os.readv into a kept 4 MiB buffer, os.close
  open_close   os.open + os.close only
  decode_mem   header + DCT-scale decode of bytes already in memory (no file read)
  limit        read + header + box + DCT-scale decode (`decode_limit`'s work)
  record       read + `TurboDecoder.decode_into` (decode + warp into a 128x128 row: DecodeImage's work)
  crop_mem     header + decode of the box's window only (libjpeg-turbo's crop and skip, through
               Pillow's bundled libjpeg with ctypes) from bytes in memory
  record_crop  read + window decode + the same warp
One JSON line per (mode, processes) with records/s; then `decode_limit[processes]` with 1 and 3
batches queued ahead, and the `jpeg` pipeline (`DecodeImage` at its defaults) for one epoch.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import record  # noqa: E402
from benchmarks.peers.common import JPEG_RATIO, JPEG_SCALE, JPEG_SIZE  # noqa: E402
from benchmarks.scenarios.jpeg import dct_scale, image_folder  # noqa: E402
from datarax.host.image import random_resized_box  # noqa: E402
from datarax.host.jpeg import TurboDecoder  # noqa: E402
from datarax.host.stage import record_generator  # noqa: E402
from datarax.sources._paths import read_data_file  # noqa: E402

_U, _I, _P = ctypes.c_uint, ctypes.c_int, ctypes.c_void_p


class _ErrorManager(ctypes.Structure):  # struct jpeg_error_mgr (jpeglib.h, JPEG_LIB_VERSION 62, LP64)
    _fields_ = [("error_exit", _P), ("emit_message", _P), ("output_message", _P), ("format_message", _P),
                ("reset_error_mgr", _P), ("msg_code", _I), ("msg_parm", ctypes.c_char * 80),
                ("trace_level", _I), ("num_warnings", ctypes.c_long), ("jpeg_message_table", _P),
                ("last_jpeg_message", _I), ("addon_message_table", _P), ("first_addon_message", _I),
                ("last_addon_message", _I)]


class _Decompress(ctypes.Structure):  # struct jpeg_decompress_struct (same ABI)
    _fields_ = [("err", ctypes.POINTER(_ErrorManager)), ("mem", _P), ("progress", _P), ("client_data", _P),
                ("is_decompressor", _I), ("global_state", _I), ("src", _P), ("image_width", _U),
                ("image_height", _U), ("num_components", _I), ("jpeg_color_space", _I), ("out_color_space", _I),
                ("scale_num", _U), ("scale_denom", _U), ("output_gamma", ctypes.c_double),
                ("buffered_image", _I), ("raw_data_out", _I), ("dct_method", _I), ("do_fancy_upsampling", _I),
                ("do_block_smoothing", _I), ("quantize_colors", _I), ("dither_mode", _I),
                ("two_pass_quantize", _I), ("desired_number_of_colors", _I), ("enable_1pass_quant", _I),
                ("enable_external_quant", _I), ("enable_2pass_quant", _I), ("output_width", _U),
                ("output_height", _U), ("out_color_components", _I), ("output_components", _I),
                ("rec_outbuf_height", _I), ("actual_number_of_colors", _I), ("colormap", _P),
                ("output_scanline", _U), ("input_scan_number", _I), ("input_iMCU_row", _U),
                ("output_scan_number", _I), ("output_iMCU_row", _U), ("coef_bits", _P),
                ("quant_tbl_ptrs", _P * 4), ("dc_huff_tbl_ptrs", _P * 4), ("ac_huff_tbl_ptrs", _P * 4),
                ("data_precision", _I), ("comp_info", _P), ("progressive_mode", _I), ("arith_code", _I),
                ("arith_dc_L", ctypes.c_ubyte * 16), ("arith_dc_U", ctypes.c_ubyte * 16),
                ("arith_ac_K", ctypes.c_ubyte * 16), ("restart_interval", _U), ("saw_JFIF_marker", _I),
                ("JFIF_major_version", ctypes.c_ubyte), ("JFIF_minor_version", ctypes.c_ubyte),
                ("density_unit", ctypes.c_ubyte), ("X_density", ctypes.c_ushort), ("Y_density", ctypes.c_ushort),
                ("saw_Adobe_marker", _I), ("Adobe_transform", ctypes.c_ubyte), ("CCIR601_sampling", _I),
                ("marker_list", _P), ("max_h_samp_factor", _I), ("max_v_samp_factor", _I),
                ("min_DCT_scaled_size", _I), ("total_iMCU_rows", _U), ("sample_range_limit", _P),
                ("comps_in_scan", _I), ("cur_comp_info", _P * 4), ("MCUs_per_row", _U), ("MCU_rows_in_scan", _U),
                ("blocks_in_MCU", _I), ("MCU_membership", _I * 10), ("Ss", _I), ("Se", _I), ("Ah", _I),
                ("Al", _I), ("unread_marker", _I), ("master", _P), ("main", _P), ("coef", _P), ("post", _P),
                ("inputctl", _P), ("marker", _P), ("entropy", _P), ("idct", _P), ("upsample", _P),
                ("cconvert", _P), ("cquantize", _P)]


def _pillow_libjpeg() -> str:
    import PIL
    site = os.path.dirname(os.path.dirname(PIL.__file__))
    found = sorted(glob.glob(os.path.join(site, "pillow.libs", "libjpeg-*.so*")))
    if not found:
        raise FileNotFoundError(f"no libjpeg in {site}/pillow.libs")
    return found[0]


_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@_CALLBACK
def _error_exit(cinfo):  # never reached on the probe's own files; libjpeg must not continue after it
    sys.stderr.write("decode_ceiling: libjpeg error_exit\n")
    os.abort()


@_CALLBACK
def _quiet(cinfo):
    pass


class WindowDecoder:
    """A prototype of window decoding: the rows and columns of one box at a DCT scale."""

    def __init__(self):
        lib = ctypes.CDLL(_pillow_libjpeg())
        ptr = ctypes.POINTER(_Decompress)
        lib.jpeg_std_error.restype = ctypes.POINTER(_ErrorManager)
        lib.jpeg_CreateDecompress.argtypes = [ptr, _I, ctypes.c_size_t]
        lib.jpeg_mem_src.argtypes = [ptr, ctypes.c_char_p, ctypes.c_ulong]
        lib.jpeg_read_header.argtypes = [ptr, _I]
        lib.jpeg_start_decompress.argtypes = [ptr]
        lib.jpeg_crop_scanline.argtypes = [ptr, ctypes.POINTER(_U), ctypes.POINTER(_U)]
        lib.jpeg_skip_scanlines.argtypes = [ptr, _U]
        lib.jpeg_skip_scanlines.restype = _U
        lib.jpeg_read_scanlines.argtypes = [ptr, _P, _U]
        lib.jpeg_read_scanlines.restype = _U
        lib.jpeg_abort_decompress.argtypes = [ptr]
        self.lib = lib
        self.err = _ErrorManager()
        lib.jpeg_std_error(ctypes.byref(self.err))
        self.err.error_exit = ctypes.cast(_error_exit, _P)
        self.err.output_message = ctypes.cast(_quiet, _P)
        self.cinfo = _Decompress()
        self.cinfo.err = ctypes.pointer(self.err)
        lib.jpeg_CreateDecompress(ctypes.byref(self.cinfo), 62, ctypes.sizeof(_Decompress))
        self.buffer = np.empty(1 << 22, np.uint8)

    def decode(self, data: bytes, denom: int, x0: int, y0: int, x1: int, y1: int) -> tuple[np.ndarray, int]:
        """Rows y0:y1 of columns [x0 - shift, x1) at 1/denom scale, and `shift`."""
        lib, c = self.lib, self.cinfo
        ref = ctypes.byref(c)
        lib.jpeg_mem_src(ref, data, len(data))
        lib.jpeg_read_header(ref, 1)
        c.out_color_space, c.scale_num, c.scale_denom = 2, 1, denom
        lib.jpeg_start_decompress(ref)
        offset, width = _U(x0), _U(x1 - x0)
        lib.jpeg_crop_scanline(ref, ctypes.byref(offset), ctypes.byref(width))
        if y0:
            lib.jpeg_skip_scanlines(ref, y0)
        n, w = y1 - y0, width.value
        out = self.buffer[:n * w * 3].reshape(n, w, 3)
        rows = np.arange(out.ctypes.data, out.ctypes.data + n * w * 3, w * 3, dtype=np.uint64)
        address, got, read = rows.ctypes.data, 0, lib.jpeg_read_scanlines
        while got < n:
            got += read(ref, address + 8 * got, n - got)
        lib.jpeg_abort_decompress(ref)
        return out, x0 - offset.value


_STATE: dict = {}


def _setup(paths: list[str]) -> None:
    import cv2
    cv2.setNumThreads(1)
    _STATE.update(turbo=TurboDecoder(), window=WindowDecoder(), paths=paths,
                  out=np.empty((JPEG_SIZE, JPEG_SIZE, 3), np.uint8), scratch=bytearray(1 << 22))


def _window(turbo, window, data, header, box, out):
    top, left, bh, bw = box
    s = dct_scale(bh, bw)
    height, width = -(-header[0] // s), -(-header[1] // s)
    x0, y0 = max(0, left // s - 2), max(0, top // s - 2)
    x1, y1 = min(width, -(-(left + bw) // s) + 2), min(height, -(-(top + bh) // s) + 2)
    image, shift = window.decode(data, s, x0, y0, x1, y1)
    if out is not None:
        cx, cy = (x0 - shift) * s, y0 * s
        turbo._warp_into(image, float(s), 1, header[:2], (left - cx, top - cy, left + bw - cx, top + bh - cy), out)


def _share(task: tuple[str, list[int]]) -> tuple[int, float]:
    mode, ids = task
    turbo, window, paths, out = _STATE["turbo"], _STATE["window"], _STATE["paths"], _STATE["out"]
    blobs = {}
    if mode.endswith("_mem"):
        for i in ids:
            with open(paths[i], "rb") as f:
                blobs[i] = f.read()
    t = time.perf_counter()
    for i in ids:
        if mode.endswith("_mem"):
            data = blobs[i]
        elif mode not in ("read_ref", "read_os", "open_close"):
            with open(paths[i], "rb") as f:
                data = f.read()
        if mode == "read_ref":
            read_data_file(paths[i], 1 << 26, "probe", "none")
            continue
        if mode == "read_os":
            fd = os.open(paths[i], os.O_RDONLY)
            os.readv(fd, [_STATE["scratch"]])
            os.close(fd)
            continue
        if mode == "open_close":
            os.close(os.open(paths[i], os.O_RDONLY))
            continue
        if mode == "read":
            continue
        header = turbo.header(data)
        box = random_resized_box(header[0], header[1], JPEG_SCALE, JPEG_RATIO, record_generator(0, 0, 1, i))
        top, left, bh, bw = box
        if mode in ("decode_mem", "limit"):
            s = dct_scale(bh, bw)
            turbo.simplejpeg.decode_jpeg(data, min_height=-(-header[0] // s), min_width=-(-header[1] // s))
        elif mode == "record":
            turbo.decode_into(data, header, (left, top, left + bw, top + bh), out)
        elif mode in ("crop_mem", "record_crop"):
            _window(turbo, window, data, header, box, out if mode == "record_crop" else None)
    return len(ids), time.perf_counter() - t


def _warm(_: int) -> int:
    return os.getpid()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", default=f"1,{os.cpu_count() or 1}")
    parser.add_argument("--records", type=int, default=4000)
    parser.add_argument("--modes", default="read,decode_mem,crop_mem,limit,record,record_crop")
    parser.add_argument("--no-pipeline", action="store_true")
    args = parser.parse_args()
    emit = record.Recorder(record.command_line("python benchmarks/tpu/decode_ceiling.py", sys.argv[1:])).emit
    root = image_folder(4000)
    from datarax.sources import ImageFolderSource
    paths = list(ImageFolderSource(root=root).paths)[:args.records]
    # the window path against the whole-image path on the first files: the same 128x128 rows
    _setup(paths)
    turbo, window = _STATE["turbo"], _STATE["window"]
    mismatches = 0
    for i, p in enumerate(paths[:300]):
        with open(p, "rb") as f:
            data = f.read()
        header = turbo.header(data)
        box = random_resized_box(header[0], header[1], JPEG_SCALE, JPEG_RATIO, record_generator(0, 0, 1, i))
        top, left, bh, bw = box
        a = np.empty((JPEG_SIZE, JPEG_SIZE, 3), np.uint8)
        b = np.empty_like(a)
        turbo.decode_into(data, header, (left, top, left + bw, top + bh), a)
        _window(turbo, window, data, header, box, b)
        mismatches += int(not np.array_equal(a, b))
    emit(probe="window_vs_whole", files=min(300, len(paths)), mismatched_rows=mismatches)
    ctx = multiprocessing.get_context("forkserver")
    for procs in [int(p) for p in args.procs.split(",")]:
        with ctx.Pool(procs, initializer=_setup, initargs=(paths,)) as pool:
            pool.map(_warm, range(procs * 4), chunksize=1)
            for mode in args.modes.split(","):
                for repeat in range(2):
                    shares = [(mode, list(range(k, len(paths), procs))) for k in range(procs)]
                    t = time.perf_counter()
                    done = pool.map(_share, shares, chunksize=1)
                    wall = time.perf_counter() - t
                    busy = sum(d[1] for d in done)
                    emit(probe="ceiling", mode=mode, processes=procs, repeat=repeat,
                         records_per_s=round(len(paths) / (max(d[1] for d in done) if mode.endswith("_mem") else wall)),
                         worker_us_per_record=round(busy / len(paths) * 1e6, 1))
    if args.no_pipeline:
        return
    from benchmarks.scenarios.jpeg import ProcessLimit, build_pipeline
    for ahead in (1, 3):
        limit = ProcessLimit(paths, ahead=ahead)
        for _ in limit.epoch(0):
            pass
        for repeat in range(2):
            t = time.perf_counter()
            for _ in limit.epoch(1 + repeat):
                pass
            emit(probe="limit", ahead=ahead, repeat=repeat, records_per_s=round(len(paths) / (time.perf_counter() - t)))
        limit.close()
    pipeline = build_pipeline(root)
    for epoch in range(3):
        t = time.perf_counter()
        n = 0
        for batch in pipeline:
            n += len(batch["label"])
        jax_block = getattr(batch["image"], "block_until_ready", None)
        if jax_block:
            jax_block()
        emit(probe="pipeline", epoch=epoch, records_per_s=round(n / (time.perf_counter() - t)))


if __name__ == "__main__":
    main()
