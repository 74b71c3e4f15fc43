"""How device-resident records are stored: in the backend's fastest layout, invisible to users.

A TPU tiles the last two dimensions of an array (8 x 128 for 32-bit values, 32 x 128 for bytes).
A record of shape `(32, 32, 3)` kept as `(N, 32, 32, 3)` pads each `(32, 3)` slab to 128 lanes,
so every gather of whole records moves (and every program reads) about 40 times the data. Kept
*lane-dense*, as `(N, 3072)`, the same gather moves only the data: on a TPU v5e, gathering 256
CIFAR records and casting them took 66,906 records/s with the records' own shape against
1,993,930 lane-dense (docs/tpu.md). The pipeline's program gathers whole stored rows and
reshapes them to the record shape (`datarax.core.source.gather_device`), so stages, element
specs, batches and checkpoints see the records as they are.

Other backends keep the records' own shape: a row-major reshape is free on the CPU, where the
layouts measure the same, and nothing was measured on a GPU.
"""

from __future__ import annotations

import math

import jax
import numpy as np

LANES = 128  # the minor tile dimension of a TPU


def lane_dense(record_shape: tuple[int, ...], backend: str | None = None) -> bool:
    """Whether records of `record_shape` are stored flattened on `backend` (default: JAX's)."""
    backend = jax.default_backend() if backend is None else backend
    return backend == "tpu" and len(record_shape) >= 2 and record_shape[-1] % LANES != 0


def to_storage(array: np.ndarray, backend: str | None = None) -> np.ndarray:
    """`array` (records along axis 0) in its storage layout: `(N, prod(record))` when lane-dense."""
    if lane_dense(array.shape[1:], backend):
        return array.reshape(len(array), math.prod(array.shape[1:]))
    return array


def from_storage(rows: jax.Array, leading: tuple[int, ...], record_shape: tuple[int, ...]) -> jax.Array:
    """Gathered stored rows (`leading + stored record shape`) as records of `record_shape`."""
    return rows.reshape(tuple(leading) + tuple(record_shape))
