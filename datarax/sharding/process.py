"""Which rows of a global batch each process holds.

A `NamedSharding` decides which slice of the batch axis each device holds; a process needs the
union of its own devices' slices. These are the rows it loads and transforms, in ascending
order, which is also the layout `jax.make_array_from_process_local_data` expects for a
process's local data.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Sharding


def _rows(index: tuple, batch_size: int) -> range:
    return range(*index[0].indices(batch_size)) if index else range(batch_size)


def process_rows(sharding: Sharding, batch_size: int, process_index: int | None = None) -> np.ndarray:
    """Rows of a global batch of `batch_size` held by a process's devices (int64, ascending).

    Args:
        sharding: the sharding of the batch (the batch is axis 0).
        batch_size: the global batch size.
        process_index: the process to ask about; None: this process.

    Example:
        >>> mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
        >>> process_rows(NamedSharding(mesh, P("data")), 8).tolist()  # one process holds all
        [0, 1, 2, 3, 4, 5, 6, 7]
    """
    index = jax.process_index() if process_index is None else process_index
    return rows_by_process(sharding, batch_size).get(index, np.zeros((0,), np.int64))


def rows_by_process(sharding: Sharding, batch_size: int) -> dict[int, np.ndarray]:
    """`process_rows` for every process that holds a device of `sharding`."""
    held: dict[int, set[int]] = {}
    for device, index in sharding.devices_indices_map((batch_size,)).items():
        held.setdefault(device.process_index, set()).update(_rows(index, batch_size))
    return {p: np.array(sorted(rows), np.int64) for p, rows in sorted(held.items())}


def is_multi_process() -> bool:
    """Whether this program runs as several JAX processes (`jax.distributed.initialize`)."""
    return jax.process_count() > 1


def describe_processes() -> str:
    """`process i of n, local devices [...]`, for logs of multi-host runs."""
    return (f"process {jax.process_index()} of {jax.process_count()}, "
            f"local devices {[d.id for d in jax.local_devices()]} of {jax.device_count()}")
