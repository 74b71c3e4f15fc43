"""An in-memory source over a dict of arrays, device-resident when it fits."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import check_bool, check_int, field
from datarax.core.operator import describe
from datarax.core.source import ArrayStore, DataSourceModule
from datarax.samplers.base import Sampler
from datarax.samplers.feistel import validate_seed
from datarax.samplers.simple import SequentialSampler, ShuffleSampler

DEFAULT_MAX_DEVICE_BYTES = 2 * 2**30


@dataclasses.dataclass(frozen=True)
class MemorySourceConfig:
    """Configuration of a `MemorySource`.

    Attributes:
        shuffle: a fresh record order every epoch (Feistel permutation keyed by (seed, epoch)).
        seed: the shuffle seed; when None it is drawn from the source's `rngs` (stream
            `"shuffle"`, falling back to `default`), or 0 without rngs.
        device_resident: keep the arrays on the device and gather inside the compiled step;
            None decides by size (up to `max_device_bytes`).
        max_device_bytes: the size limit for automatic device residency.
    """

    shuffle: bool = False
    seed: int | None = None
    device_resident: bool | None = None
    max_device_bytes: int = DEFAULT_MAX_DEVICE_BYTES

    def __post_init__(self):
        check_bool(*field(self, "shuffle"))
        if self.seed is not None:
            validate_seed(self.seed, "MemorySourceConfig.seed")
        check_bool(*field(self, "device_resident"), allow_none=True)
        check_int(*field(self, "max_device_bytes"), 0)


def validate_arrays(data: Any, owner: str) -> dict[str, np.ndarray]:
    """Checks a dict of equal-length numeric arrays and returns it as numpy arrays."""
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"{owner} data must be a non-empty dict of arrays, got {describe(data)}; "
                         "pass data={'x': array, ...}")
    arrays: dict[str, np.ndarray] = {}
    for name, value in data.items():
        if not isinstance(name, str):
            raise TypeError(f"{owner} field names must be strings, got {name!r}")
        arr = np.asarray(value)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
            raise TypeError(
                f"{owner} field {name!r} has dtype {arr.dtype}; only numeric and bool arrays can be "
                "batched on the device. Encode strings as integer ids (or drop the field) first"
            )
        if arr.ndim == 0:
            raise ValueError(f"{owner} field {name!r} is a scalar; every field needs a leading record axis")
        arrays[name] = arr
    sizes = {name: len(a) for name, a in arrays.items()}
    first = next(iter(sizes))
    for name, size in sizes.items():
        if size != sizes[first]:
            raise ValueError(
                f"{owner} fields must have the same number of records: {first!r} has {sizes[first]} "
                f"but {name!r} has {size}; trim or pad them to one length"
            )
    if sizes[first] == 0:
        raise ValueError(f"{owner} data is empty (0 records in {first!r}); give it at least one record")
    return arrays


def seed_from_rngs(seed: int | None, rngs: nnx.Rngs | None, stream: str = "shuffle") -> int:
    """An explicit seed, else one drawn deterministically from `rngs`, else 0."""
    if seed is not None:
        return seed
    if rngs is None:
        return 0
    key = getattr(rngs, stream)()
    return int(jax.random.randint(key, (), 0, 2**31 - 1))


class MemorySource(DataSourceModule):
    """Serves a dict of arrays held in memory.

    Example:
        >>> src = MemorySource(MemorySourceConfig(shuffle=True), data={"x": np.arange(10)}, rngs=nnx.Rngs(0))
        >>> src.get_batch(np.array([3, 1]))["x"]
        array([3, 1])
    """

    def __init__(self, config: MemorySourceConfig | None = None, *, data: Mapping[str, Any],
                 rngs: nnx.Rngs | None = None):
        config = MemorySourceConfig() if config is None else config
        if not isinstance(config, MemorySourceConfig):
            raise TypeError(f"config must be a MemorySourceConfig, got {type(config).__name__}")
        self.config = config
        arrays = validate_arrays(data, "MemorySource")
        self._host = ArrayStore(arrays)
        self._length = len(next(iter(arrays.values())))
        self.seed = seed_from_rngs(config.seed, rngs)
        nbytes = sum(a.nbytes for a in arrays.values())
        resident = config.device_resident
        if resident is None:
            resident = nbytes <= config.max_device_bytes
        self._device = ArrayStore({k: jax.device_put(v) for k, v in arrays.items()}) if resident else None

    def __len__(self) -> int:
        return self._length

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in self._host.arrays.items()}

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        if out is None:
            return {k: np.take(v, indices, axis=0, mode="clip") for k, v in self._host.arrays.items()}
        for k, v in self._host.arrays.items():
            np.take(v, indices, axis=0, out=out[k], mode="clip")
        return out

    def device_arrays(self) -> dict[str, jax.Array] | None:
        return None if self._device is None else self._device.arrays

    @property
    def device_resident(self) -> bool:
        return self._device is not None

    def default_sampler(self) -> Sampler:
        if self.config.shuffle:
            return ShuffleSampler(len(self), seed=self.seed)
        return SequentialSampler(len(self))
