"""The data source contract.

A source is random access: it has a length, an element spec, and returns a whole batch for an
index array in one vectorised call. A source whose arrays live on the device also exposes them,
so the pipeline can fuse the gather into its compiled step (the arrays are passed to the jitted
function as arguments, never closed over, which would bake them into the program).
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.samplers.base import Sampler


class ArrayStore:
    """Holds a source's arrays outside NNX state, so `nnx.state(pipeline)` never copies the data."""

    def __init__(self, arrays: dict[str, Any]):
        self.arrays = arrays

    def __repr__(self) -> str:
        return f"ArrayStore({sorted(self.arrays)})"


class DataSourceModule(nnx.Module, abc.ABC):
    """Abstract base of random-access sources.

    Subclasses implement `__len__`, `element_spec` and `get_batch`; device-resident sources also
    return their arrays from `device_arrays`.
    """

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of records."""

    @abc.abstractmethod
    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        """Shape and dtype of one record's fields (no batch axis)."""

    @abc.abstractmethod
    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Host arrays for the records at `indices` (any shape; the result gains its axes).

        When `out` is given (buffers of the right shape) the batch is written into it.
        """

    def read(self, indices: np.ndarray, epoch: int, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The batch the pipeline's reader takes for `indices` in `epoch` (what `get_batch` returns,
        for sources whose records do not depend on the epoch; host stages' sources override it)."""
        return self.get_batch(indices, out)

    def describe_record(self, record_id: int) -> str:
        """Where a record comes from, for error messages (a file path, a row of a file)."""
        return f"record {record_id}"

    def device_arrays(self) -> dict[str, jax.Array] | None:
        """The source's arrays on the device, or None for a host-resident source."""
        return None

    def default_sampler(self) -> Sampler:
        """The sampler a pipeline uses unless it is given one."""
        from datarax.samplers.simple import SequentialSampler

        return SequentialSampler(len(self))

    def structure(self) -> str:
        """Identifies the source for iterator fingerprints: class, length and element spec."""
        spec = {k: (tuple(v.shape), str(v.dtype)) for k, v in sorted(self.element_spec().items())}
        return f"{type(self).__qualname__}(len={len(self)}, spec={spec})"


def gather_device(arrays: dict[str, jax.Array], indices: jax.Array, mode: str = "fill") -> dict[str, jax.Array]:
    """The device-side gather used inside the pipeline's compiled programs.

    The indices are always in range (a final short batch repeats its last position), so `mode`
    changes no value, only the code XLA makes. `fill` (jnp.take's default, the one a hand-written
    step uses) measured 20-40 us faster than `clip` per batch on XLA:CPU for a consumer that
    waits on every step (docs/benchmarks.md, "Per-batch overhead"); `ScanRunner`, one call per
    epoch, keeps `clip`, with which its compiled epoch was measured.
    """
    return {k: jax.numpy.take(v, indices, axis=0, mode=mode) for k, v in arrays.items()}
