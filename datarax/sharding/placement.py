"""`BatchPlacement`: where this process's share of each global batch is computed and assembled.

A process computes the rows of the global batch its devices hold (`process_rows`) in one jitted
step sharded over its local mesh; with several processes each leaf is assembled without a copy
by `jax.make_array_from_single_device_arrays`, which needs the process's devices to form a block
of the mesh (`local_mesh` checks it). See docs/distributed.md.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from datarax.sharding.mesh import DataSharding
from datarax.sharding.process import process_rows

NEEDS_MASK = (
    "a sharded pipeline keeps every global batch at its full shape, so the final short batch of an epoch is "
    "padded; with drop_remainder=False give DataSharding a mask_key (e.g. mask_key='mask', the default) to "
    "mark the padding rows, or pass drop_remainder=True to drop the short batch"
)


def local_mesh(mesh: Mesh, process_index: int | None = None) -> Mesh:
    """The block of `mesh` holding a process's devices (default: this process's).

    Raises a clear error when the process has no device in the mesh, or when its devices do not
    form a block (then no local array can be laid out like the process's share of the global one).
    """
    index = jax.process_index() if process_index is None else process_index
    mine = np.vectorize(lambda d: d.process_index == index, otypes=[bool])(mesh.devices)
    if not mine.any():
        raise ValueError(
            f"the mesh {dict(mesh.shape)} holds no device of process {index}; build the mesh from "
            "jax.devices() so that it spans every process"
        )
    block = tuple(slice(int(c.min()), int(c.max()) + 1) for c in np.nonzero(mine))
    if not mine[block].all():
        raise ValueError(
            f"the devices of process {index} do not form a block of the mesh {dict(mesh.shape)}; order the "
            "mesh's devices by process, e.g. np.array(jax.devices()).reshape(...) or jax.make_mesh(...)"
        )
    return Mesh(mesh.devices[block], mesh.axis_names)


class BatchPlacement:
    """This process's share of the global batches of one sharded pipeline.

    Attributes:
        rows: the rows of each global batch this process computes (int64, ascending).
        local_sharding: how those rows are laid out over the process's devices.
        replicated: the process's devices, each holding a full copy.
        global_sharding: the sharding of the global batch (`DataSharding.batch_sharding`).
        mask_key: the validity field added to every batch, or None when no batch is padded.
    """

    def __init__(self, sharding: DataSharding, batch_size: int, drop_remainder: bool):
        if not isinstance(sharding, DataSharding):
            raise TypeError(f"sharding must be a datarax.sharding.DataSharding, got {type(sharding).__name__}; "
                            "wrap your mesh: DataSharding(mesh, batch_axes='data')")
        if not drop_remainder and sharding.mask_key is None:
            raise ValueError(f"DataSharding(mask_key=None) with drop_remainder=False: {NEEDS_MASK}")
        self.sharding = sharding
        self.batch_size = sharding.check_batch_size(batch_size)
        self.mask_key = None if drop_remainder else sharding.mask_key
        self.global_sharding = sharding.batch_sharding
        mesh = local_mesh(sharding.mesh)
        self.local_sharding = NamedSharding(mesh, sharding.spec)
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.rows = process_rows(self.global_sharding, batch_size)
        self.is_global = mesh.devices.size != sharding.mesh.devices.size
        self._source_arrays: Any = None
        self._placed: Any = None

    def device_arrays(self, arrays: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """A device-resident source's arrays replicated on this process's devices (once per source)."""
        if arrays is not self._source_arrays:
            self._placed = jax.device_put(arrays, self.replicated)
            self._source_arrays = arrays
        return self._placed

    def put(self, host_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """This process's rows, loaded on the host, split over its devices."""
        return jax.device_put(host_batch, self.local_sharding)

    def assemble(self, local: dict[str, jax.Array]) -> dict[str, jax.Array]:
        """The global batch from this process's share (already global with one process)."""
        if not self.is_global:
            return local
        return jax.tree.map(self._assemble_leaf, local)

    def _assemble_leaf(self, leaf: jax.Array) -> jax.Array:
        shape = (self.batch_size,) + tuple(leaf.shape[1:])
        return jax.make_array_from_single_device_arrays(shape, self.global_sharding,
                                                        [s.data for s in leaf.addressable_shards])

    def global_spec(self, local_spec: dict) -> dict:
        """Turns the output spec of this process's share into the global batch's spec."""
        return jax.tree.map(lambda s: jax.ShapeDtypeStruct((self.batch_size,) + tuple(s.shape[1:]), s.dtype,
                                                           sharding=self.global_sharding), local_spec)


def committed_together(values: list) -> list:
    """`values` with every uncommitted array committed: to the one device the committed ones are on,
    or where it is when none is committed.

    Arrays committed to one device (restored weights) beside uncommitted ones (a fresh optimizer
    state) give committed outputs, and a fresh model's arrays are uncommitted where a restored one's
    are not: each mix is another set of input shardings, and a step would compile again for it.
    Values committed across several devices (a mesh) are returned as they are.
    """
    placed = {d for v in values if getattr(v, "committed", False) for d in v.sharding.device_set}
    if len(placed) > 1:
        return list(values)
    device = placed.pop() if placed else None
    return [v if getattr(v, "committed", True) else jax.device_put(v, device or v.sharding) for v in values]
