"""Out-of-core arrays: one `.npy` file per field, memory-mapped, read a whole batch per call.

Nothing is loaded up front; a batch read is one `np.take(..., out=buffer)` per field over the
memory map, so the operating system pages in only the records asked for (and caches hot ones).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.construct import resolve_arguments
from datarax.core.errors import REWRITE, CorruptFileError
from datarax.core.fields import batchable, spec_table, take_batch
from datarax.core.source import DataSourceModule, Handles, ShuffleConfig, seed_from_rngs
from datarax.sources.memory import validate_arrays


@dataclasses.dataclass(frozen=True)
class StreamingDiskSourceConfig(ShuffleConfig):
    """Configuration of a `StreamingDiskSource`: its shuffling (see `ShuffleConfig`)."""


def _field_files(paths: Any) -> dict[str, str]:
    if isinstance(paths, (str, os.PathLike)):
        directory = os.fspath(paths)
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"StreamingDiskSource paths: directory {directory!r} does not exist; pass a "
                                    "directory of .npy files (one per field) or a dict {field: path.npy}")
        files = {name[:-4]: os.path.join(directory, name) for name in sorted(os.listdir(directory))
                 if name.endswith(".npy")}
        if not files:
            raise FileNotFoundError(f"StreamingDiskSource paths: directory {directory!r} holds no .npy files; "
                                    "save one array per field with np.save (or save_npy_dataset)")
        return files
    if not isinstance(paths, Mapping) or not paths:
        raise TypeError(f"StreamingDiskSource paths must be a directory or a dict {{field: path.npy}}, got {paths!r}")
    files = {str(k): os.fspath(v) for k, v in paths.items()}
    for name, path in files.items():
        if not os.path.isfile(path):
            raise FileNotFoundError(f"StreamingDiskSource paths[{name!r}]: {path!r} does not exist; check the path")
    return files


class StreamingDiskSource(DataSourceModule):
    """Serves `.npy` arrays from disk through memory maps (host-resident, out of core).

    Args:
        config: shuffling options.
        paths: a directory holding one `<field>.npy` per field, or a dict `{field: path}`; also by position.
        rngs: draws the shuffle seed when `config.seed` is None.

    Example:
        >>> save_npy_dataset("/tmp/ds", {"x": np.arange(10), "y": np.ones((10, 3))})
        >>> src = StreamingDiskSource("/tmp/ds", shuffle=True, seed=1)
        >>> src.get_batch(np.array([2, 7]))["x"]
        array([2, 7])
    """

    positional = ("paths",)

    def __init__(self, config: StreamingDiskSourceConfig | None = None, *args: Any, paths: Any = None,
                 rngs: nnx.Rngs | None = None, **settings: Any):
        config, paths = resolve_arguments(StreamingDiskSourceConfig, config, settings, "StreamingDiskSource",
                                          {"paths": paths}, args=args, positional=self.positional)
        self.config = config
        files = _field_files(paths)
        maps = {}
        for name, path in files.items():
            check_npy_file(path, f"StreamingDiskSource field {name!r}")
            try:
                arr = np.load(path, mmap_mode="r", allow_pickle=False)
            except ValueError as exc:
                raise TypeError(f"StreamingDiskSource field {name!r} ({path!r}) cannot be memory-mapped ({exc}); "
                                "save numeric arrays with np.save, not object arrays") from None
            if not batchable(arr.dtype):
                raise TypeError(f"StreamingDiskSource field {name!r} ({path!r}) has dtype {arr.dtype}; only numeric "
                                "and bool arrays can be batched")
            maps[name] = arr
        validate_arrays(maps, "StreamingDiskSource")
        self._maps = Handles(arrays=maps)
        self._files = tuple((name, os.path.basename(p)) for name, p in files.items())
        self._length = len(next(iter(maps.values())))
        self.seed = seed_from_rngs(config.seed, rngs)

    def __len__(self) -> int:
        return self._length

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in self._maps.arrays.items()}

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return take_batch(self._maps.arrays, indices, out)

    def structure(self) -> str:
        return (f"StreamingDiskSource(len={len(self)}, spec={spec_table(self.element_spec())}, "
                f"files={list(self._files)})")


def check_npy_file(path: str, owner: str) -> None:
    """Raises `CorruptFileError` unless `path` is a `.npy` file holding exactly the bytes its header
    promises (object arrays pass)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = header(f)
        except (ValueError, EOFError, SyntaxError) as exc:
            raise CorruptFileError(f"{owner} ({path!r}) is not a readable .npy file ({exc}); it is damaged or not "
                                   f"written by np.save: {REWRITE}") from None
        offset = f.tell()
    if dtype.hasobject:
        return
    expected = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size != expected:
        kind = "truncated" if size < expected else "longer than its header says"
        raise CorruptFileError(f"{owner} ({path!r}) is {kind}: its header promises shape {tuple(shape)} of {dtype} "
                               f"({expected} bytes with the header), the file has {size} bytes; {REWRITE}")


def save_npy_dataset(directory: str | os.PathLike, data: Mapping[str, Any]) -> dict[str, str]:
    """Writes a dict of equal-length arrays as `<directory>/<field>.npy`; returns `{field: path}`."""
    arrays = validate_arrays(data, "save_npy_dataset")
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for name, arr in arrays.items():
        paths[name] = os.path.join(os.fspath(directory), f"{name}.npy")
        np.save(paths[name], arr, allow_pickle=False)
    return paths
