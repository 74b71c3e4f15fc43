"""How device-resident records are stored: in the backend's fastest layout, invisible to users.

On a TPU small records are kept lane-dense (`(N, prod(record_shape))`), so a gather of whole
records moves only the data; large ones, and every record on other backends, keep their own shape.
The pipeline reshapes gathered rows back to the record shape. See docs/tpu.md, "Storage layout".
"""

from __future__ import annotations

import math

import jax
import numpy as np

LANES = 128  # the minor tile dimension of a TPU
# Past this many values a record keeps its own shape on a TPU too: the reshape of gathered
# lane-dense rows back to a large record costs more than the padded gather it saves
# (`benchmarks/tpu/layout_probe.py`; docs/tpu.md, "Storage layout").
LANE_DENSE_MAX_VALUES = 32768


def lane_dense(record_shape: tuple[int, ...], backend: str | None = None) -> bool:
    """Whether records of `record_shape` are stored flattened on `backend` (default: JAX's): on a
    TPU, records of two or more axes whose last axis does not fill whole lanes, up to
    `LANE_DENSE_MAX_VALUES` values."""
    backend = jax.default_backend() if backend is None else backend
    return (backend == "tpu" and len(record_shape) >= 2 and record_shape[-1] % LANES != 0
            and math.prod(record_shape) <= LANE_DENSE_MAX_VALUES)


def to_storage(array: np.ndarray, backend: str | None = None) -> np.ndarray:
    """`array` (records along axis 0) in its storage layout: `(N, prod(record))` when lane-dense."""
    if lane_dense(array.shape[1:], backend):
        return array.reshape(len(array), math.prod(array.shape[1:]))
    return array


def from_storage(rows: jax.Array, leading: tuple[int, ...], record_shape: tuple[int, ...]) -> jax.Array:
    """Gathered stored rows (`leading + stored record shape`) as records of `record_shape`."""
    return rows.reshape(tuple(leading) + tuple(record_shape))
