"""An in-memory source over a dict of arrays, device-resident when it fits."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import check_bool, check_int, check_int_range, describe_value, field
from datarax.core.construct import resolve_arguments
from datarax.core.fields import take_batch
from datarax.core.layout import to_storage
from datarax.core.source import DataSourceModule, Handles, ShuffleConfig, seed_from_rngs

DEFAULT_MAX_DEVICE_BYTES = 2 * 2**30


@dataclasses.dataclass(frozen=True)
class MemorySourceConfig(ShuffleConfig):
    """Configuration of a `MemorySource`.

    Attributes:
        device_resident: keep the arrays on the device and gather inside the compiled step;
            None decides by size (up to `max_device_bytes`).
        max_device_bytes: the size limit for automatic device residency.
    """

    device_resident: bool | None = None
    max_device_bytes: int = DEFAULT_MAX_DEVICE_BYTES

    def __post_init__(self):
        super().__post_init__()
        check_bool(*field(self, "device_resident"), allow_none=True)
        check_int(*field(self, "max_device_bytes"), 0)


def validate_arrays(data: Any, owner: str) -> dict[str, np.ndarray]:
    """Checks a dict of equal-length numeric arrays and returns it as numpy arrays."""
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"{owner} data must be a non-empty dict of arrays, got {describe_value(data)}; "
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


class MemorySource(DataSourceModule):
    """Serves a dict of arrays held in memory.

    An int64 field whose values fit int32 becomes int32 (without `jax_enable_x64`); one that does
    not is refused with an `IntegerRangeError`.

    Example:
        >>> src = MemorySource({"x": np.arange(10)}, shuffle=True, rngs=nnx.Rngs(0))
        >>> src.get_batch(np.array([3, 1]))["x"]
        array([3, 1])
    """

    positional = ("data",)

    def __init__(self, config: MemorySourceConfig | None = None, *args: Any, data: Mapping[str, Any] | None = None,
                 rngs: nnx.Rngs | None = None, **settings: Any):
        config, data = resolve_arguments(MemorySourceConfig, config, settings, "MemorySource", {"data": data},
                                         args=args, positional=self.positional)
        self.config = config
        arrays = validate_arrays(data, "MemorySource")
        for name, values in arrays.items():
            check_int_range(values, "MemorySource", name, where=lambda row: f"record {row}",
                            fix=f"cast the field before building the source (data[{name!r}].astype(np.float64), or "
                                "ids remapped to 0..N-1), or leave it out")
        self._host = Handles(arrays=arrays)
        self._length = len(next(iter(arrays.values())))
        self.seed = seed_from_rngs(config.seed, rngs)
        nbytes = sum(a.nbytes for a in arrays.values())
        resident = config.device_resident
        if resident is None:
            resident = nbytes <= config.max_device_bytes
        # Stored in the backend's fastest layout (lane-dense on a TPU; `datarax.core.layout`).
        device = {k: jax.device_put(to_storage(v)) for k, v in arrays.items()} if resident else None
        self._device = Handles(arrays=device) if resident else None

    def __len__(self) -> int:
        return self._length

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in self._host.arrays.items()}

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return take_batch(self._host.arrays, indices, out)

    def device_arrays(self) -> dict[str, jax.Array] | None:
        return None if self._device is None else self._device.arrays

    @property
    def device_resident(self) -> bool:
        return self._device is not None
