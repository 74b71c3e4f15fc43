"""`DataSharding`: how a pipeline lays its global batches out over a device mesh.

A sharded pipeline's `batch_size` is the global batch size; the batch axis is split over
`batch_axes` and each process computes only its devices' rows. Record ids stay global, so the
stream does not depend on the number of hosts (docs/distributed.md).

Example:
    >>> pipeline = Pipeline(source, stages, batch_size=256, sharding=DataSharding(mesh, "data"))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

DEFAULT_MASK_KEY = "mask"


@dataclasses.dataclass(frozen=True)
class DataSharding:
    """The mesh a pipeline's batches live on, and the mesh axes the batch axis is split over.

    Attributes:
        mesh: a `jax.sharding.Mesh` over the devices of every process (for a multi-host run,
            built from `jax.devices()`, identically on every process).
        batch_axes: the mesh axis name, or names, the batch axis is split over; the batch is
            replicated over the remaining axes. None: the mesh's first axis.
        mask_key: a sharded batch always has the full global shape, so a kept final short batch
            (`drop_remainder=False`) is padded (padding rows repeat the epoch's last record).
            Such a pipeline adds the field `mask_key` (bool[B], False on padding rows) to every
            batch; None is allowed only with `drop_remainder=True`.
    """

    mesh: Mesh
    batch_axes: str | tuple[str, ...] | None = None
    mask_key: str | None = DEFAULT_MASK_KEY

    def __post_init__(self):
        if not isinstance(self.mesh, Mesh):
            raise TypeError(
                f"DataSharding.mesh must be a jax.sharding.Mesh, got {type(self.mesh).__name__}; build one with "
                "jax.sharding.Mesh(np.array(jax.devices()), ('data',)) or DataSharding.data_parallel()"
            )
        axes = self.batch_axes
        if axes is None:
            axes = (self.mesh.axis_names[0],)
        elif isinstance(axes, str):
            axes = (axes,)
        elif not isinstance(axes, Sequence) or not axes or not all(isinstance(a, str) for a in axes):
            raise TypeError(f"DataSharding.batch_axes must be a mesh axis name or a tuple of names, got {axes!r}")
        unknown = [a for a in axes if a not in self.mesh.axis_names]
        if unknown or len(set(axes)) != len(axes):
            raise ValueError(
                f"DataSharding.batch_axes={self.batch_axes!r} must name distinct axes of the mesh, whose axes are "
                f"{tuple(self.mesh.axis_names)}; pick batch axes from those"
            )
        object.__setattr__(self, "batch_axes", tuple(axes))
        if self.mask_key is not None and (not isinstance(self.mask_key, str) or not self.mask_key):
            raise ValueError(f"DataSharding.mask_key must be a non-empty field name or None, got {self.mask_key!r}")

    @classmethod
    def data_parallel(cls, devices: Sequence[jax.Device] | None = None, axis: str = "data",
                      mask_key: str | None = DEFAULT_MASK_KEY) -> DataSharding:
        """A one-axis mesh over `devices` (default: every device of every process)."""
        devices = jax.devices() if devices is None else list(devices)
        return cls(Mesh(np.array(devices), (axis,)), axis, mask_key)

    @property
    def spec(self) -> PartitionSpec:
        """The PartitionSpec of every batch field: the batch axis split, the rest replicated."""
        axes = self.batch_axes
        return PartitionSpec(axes[0] if len(axes) == 1 else axes)

    @property
    def batch_sharding(self) -> NamedSharding:
        """The `NamedSharding` of every field of a global batch."""
        return NamedSharding(self.mesh, self.spec)

    @property
    def num_shards(self) -> int:
        """How many pieces the batch axis is cut into (the product of the batch axes' sizes)."""
        return math.prod(self.mesh.shape[a] for a in self.batch_axes)

    def check_batch_size(self, batch_size: int) -> int:
        """Checks that the global batch splits evenly over the batch axes."""
        if batch_size % self.num_shards:
            raise ValueError(
                f"batch_size={batch_size} does not split evenly over the {self.num_shards} shards of mesh axes "
                f"{self.batch_axes} (mesh {dict(self.mesh.shape)}); use a global batch size that is a multiple "
                f"of {self.num_shards}"
            )
        return batch_size

    def structure(self) -> str:
        """A readable description (not part of the iterator fingerprint: the stream is layout-free)."""
        return f"DataSharding(mesh={dict(self.mesh.shape)}, batch_axes={self.batch_axes}, mask_key={self.mask_key!r})"
