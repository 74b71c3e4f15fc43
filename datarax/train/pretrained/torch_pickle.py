"""Reads a PyTorch `.pth` state dict into numpy arrays without torch and without running its code.

`torch.save` writes a zip archive: `<name>/data.pkl` (a pickle of the object), `<name>/data/<key>`
(one raw storage per tensor buffer, in the byte order of `<name>/byteorder`) and `<name>/version`.
In the pickle each tensor is a call `torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
...)` whose storage is a *persistent id* `("storage", torch.FloatStorage, key, location, numel)`. A
pickle may name any importable global and call it (`os.system` is the classic payload), so the
unpickler here resolves only the names a state dict needs, each to a numpy stand-in, and refuses
every other one with an `UnsafePickleError` naming the file and the global: what
`torch.load(..., weights_only=True)` does inside torch, without torch.

    tensors = read_pth("crepe/tiny.pth")       # {"conv1.weight": np.ndarray (128, 1, 512, 1), ...}
"""

from __future__ import annotations

import collections
import os
import pickle
import zipfile
from typing import Any

import numpy as np

from datarax.core.errors import DataraxError

# torch's storage class names and the numpy dtype of their elements.
STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
    "ByteStorage": np.uint8, "BoolStorage": np.bool_, "BFloat16Storage": "bfloat16",
}


class UnsafePickleError(DataraxError, pickle.UnpicklingError):
    """A `.pth` pickle names a global outside the state-dict allow list (it would run that code)."""


class _Storage:
    """A tensor storage: the raw bytes of one `data/<key>` entry as a flat numpy array."""

    def __init__(self, array: np.ndarray):
        self.array = array


def _dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # a dependency of jax

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _rebuild_tensor(storage: _Storage, offset: int, size: tuple, stride: tuple, *_ignored: Any) -> np.ndarray:
    array = storage.array
    itemsize = array.dtype.itemsize
    end = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride) if n > 0)
    if all(n > 0 for n in size) and end > array.size:
        raise pickle.UnpicklingError(f"a tensor of size {tuple(size)} and stride {tuple(stride)} at offset {offset} "
                                     f"reads past its storage of {array.size} elements")
    view = np.ndarray(tuple(size), dtype=array.dtype, buffer=array, offset=offset * itemsize,
                      strides=tuple(s * itemsize for s in stride))
    return np.array(view, order="C", copy=True)


def _rebuild_parameter(data: np.ndarray, *_ignored: Any) -> np.ndarray:
    return data


class _StorageType:
    def __init__(self, name: str):
        self.name = name
        self.dtype = _dtype(STORAGE_DTYPES[name])


def _allowed() -> dict[tuple[str, str], Any]:
    allowed: dict[tuple[str, str], Any] = {
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    }
    for name in STORAGE_DTYPES:
        allowed[("torch", name)] = _StorageType(name)
    return allowed


ALLOWED_GLOBALS = tuple(f"{module}.{name}" for module, name in _allowed())


class _StateDictUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, path: str, byteorder: str):
        import io

        super().__init__(io.BytesIO(data))
        self._archive, self._prefix, self._path, self._byteorder = archive, prefix, path, byteorder
        self._allowed = _allowed()
        self._storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = self._allowed.get((module, name))
        if found is None:
            raise UnsafePickleError(
                f"{self._path}: the pickle asks for the global {module}.{name}, which a state dict never needs "
                f"(loading it could run arbitrary code); refused. Only {', '.join(ALLOWED_GLOBALS[:3])} and "
                "torch's storage types are allowed: save the checkpoint as a plain state dict "
                "(torch.save(model.state_dict(), path)) or as safetensors")
        return found

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType)):
            raise UnsafePickleError(f"{self._path}: unexpected persistent id {pid!r:.120}; only tensor storages "
                                    "('storage', <type>, key, location, numel) are read")
        _, kind, key, _location, numel = pid
        if key not in self._storages:
            try:
                raw = self._archive.read(f"{self._prefix}data/{key}")
            except KeyError:
                raise pickle.UnpicklingError(f"{self._path}: storage {key!r} is missing from the archive") from None
            dtype = kind.dtype.newbyteorder("<" if self._byteorder == "little" else ">")
            array = np.frombuffer(raw, dtype=dtype)
            if array.size < numel:
                raise pickle.UnpicklingError(f"{self._path}: storage {key!r} holds {array.size} elements, the pickle "
                                             f"says {numel}")
            self._storages[key] = _Storage(array.astype(kind.dtype, copy=False))
        return self._storages[key]


def read_pth(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a `torch.save`d state dict as `{key: numpy array}`, without torch.

    Args:
        path: a `.pth`/`.pt` file written by `torch.save(state_dict, path)` (the zip format, torch
            1.6 and later). A checkpoint that wraps the state dict (`{"state_dict": {...}}`,
            `{"model": {...}}`) is returned flattened with dotted keys (`state_dict.conv1.weight`).

    Raises:
        UnsafePickleError: the pickle names a global other than the state-dict ones (the file and
            the global are in the message).
        ValueError: the file is not a torch zip archive (e.g. the legacy pre-1.6 format).
    """
    path = os.fspath(path)
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a PyTorch zip archive (torch.save since torch 1.6); re-save it with a "
                         "current torch (torch.save(torch.load(path, weights_only=True), new_path)) or as safetensors")
    with zipfile.ZipFile(path) as archive:
        names = [n for n in archive.namelist() if n.endswith("data.pkl")]
        if len(names) != 1:
            raise ValueError(f"{path} holds {len(names)} data.pkl entries; a torch.save archive has exactly one")
        prefix = names[0][:-len("data.pkl")]
        byteorder = "little"
        if f"{prefix}byteorder" in archive.namelist():
            byteorder = archive.read(f"{prefix}byteorder").decode().strip()
        loaded = _StateDictUnpickler(archive.read(names[0]), archive, prefix, path, byteorder).load()
    return _flatten(loaded, path)


def _flatten(obj: Any, path: str, prefix: str = "") -> dict[str, np.ndarray]:
    if isinstance(obj, np.ndarray):
        return {prefix[:-1]: obj}
    if isinstance(obj, dict):
        out: dict[str, np.ndarray] = {}
        for key, value in obj.items():
            if isinstance(value, (np.ndarray, dict)):
                out.update(_flatten(value, path, f"{prefix}{key}."))
        return out
    raise ValueError(f"{path} holds a {type(obj).__name__}, not a state dict of tensors")
