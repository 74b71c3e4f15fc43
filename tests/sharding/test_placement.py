"""BatchPlacement and local_mesh: a process's block of the mesh, and the layout of its share."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding

from datarax.sharding import BatchPlacement, DataSharding, rows_by_process
from datarax.sharding.placement import local_mesh


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    id: int
    process_index: int


def fake_mesh(owners: np.ndarray, names) -> Mesh:
    """A mesh whose device at each position belongs to the process given by `owners`."""
    flat = [FakeDevice(i, int(p)) for i, p in enumerate(owners.ravel())]
    return Mesh(np.array(flat, dtype=object).reshape(owners.shape), names)


@pytest.mark.parametrize("owners,process,block", [
    (np.array([0, 0, 1, 1]), 1, (slice(2, 4),)),
    (np.array([[0, 0], [1, 1], [2, 2], [3, 3]]), 2, (slice(2, 3), slice(0, 2))),
    (np.array([[0, 1], [0, 1], [2, 3], [2, 3]]), 1, (slice(0, 2), slice(1, 2))),
    (np.array([[0, 0, 1, 1], [0, 0, 1, 1]]), 0, (slice(0, 2), slice(0, 2))),
])
def test_local_mesh_is_the_process_block(owners, process, block):
    mesh = fake_mesh(owners, ("data", "model")[:owners.ndim])
    local = local_mesh(mesh, process)
    assert local.axis_names == mesh.axis_names
    ids = np.vectorize(lambda d: d.id)(local.devices)
    np.testing.assert_array_equal(ids, np.arange(owners.size).reshape(owners.shape)[block])


def test_local_mesh_errors_name_the_process_and_the_fix():
    with pytest.raises(ValueError, match=r"holds no device of process 5; build the mesh from jax.devices\(\)"):
        local_mesh(fake_mesh(np.array([0, 1]), ("data",)), 5)
    with pytest.raises(ValueError, match=r"process 0 do not form a block .* order the mesh's devices by process"):
        local_mesh(fake_mesh(np.array([0, 1, 0, 1]), ("data",)), 0)


class ProcessesByOwner:
    """A real sharding whose devices are attributed to processes by a table of owners."""

    def __init__(self, sharding: NamedSharding, owner_of: dict[int, int]):
        self.sharding, self.owner_of = sharding, owner_of

    def devices_indices_map(self, shape):
        return {FakeDevice(d.id, self.owner_of[d.id]): index
                for d, index in self.sharding.devices_indices_map(shape).items()}


LAYOUTS = [
    # mesh shape, names, batch axes, owner of each mesh position, global batch
    ((8,), ("data",), "data", np.repeat(np.arange(4), 2), 16),
    ((4, 2), ("data", "model"), "data", np.repeat(np.arange(4), 2).reshape(4, 2), 8),
    ((4, 2), ("data", "model"), ("data", "model"), np.repeat(np.arange(2), 4).reshape(4, 2), 16),
    ((4, 2), ("data", "model"), ("model", "data"), np.repeat(np.arange(2), 4).reshape(4, 2), 16),
    ((2, 4), ("data", "model"), "data", np.array([[0, 0, 1, 1], [2, 2, 3, 3]]), 8),  # replicas across processes
    ((2, 4), ("data", "model"), ("model", "data"), np.array([[0, 0, 1, 1], [2, 2, 3, 3]]), 8),
]


@pytest.mark.parametrize("shape,names,axes,owners,batch_size", LAYOUTS)
def test_a_process_block_lays_its_rows_out_as_the_global_batch(shape, names, axes, owners, batch_size):
    """The invariant behind the zero-copy assembly of a global batch from a process's share."""
    sharding = DataSharding(Mesh(np.array(jax.devices()).reshape(shape), names), axes)
    owner_of = {d.id: int(o) for d, o in zip(sharding.mesh.devices.flat, owners.ravel())}
    rows = rows_by_process(ProcessesByOwner(sharding.batch_sharding, owner_of), batch_size)
    everything = np.arange(batch_size)
    for process, mine in rows.items():
        block = local_mesh(fake_mesh(owners, names), process)
        ids = np.vectorize(lambda d: d.id)(block.devices)
        local = NamedSharding(Mesh(np.array(jax.devices())[ids], names), sharding.spec)
        local_index = local.devices_indices_map((len(mine),))
        global_index = sharding.batch_sharding.devices_indices_map((batch_size,))
        for device, index in local_index.items():
            np.testing.assert_array_equal(mine[index[0]], everything[global_index[device][0]])


def test_single_process_placement():
    sharding = DataSharding(Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model")), "data")
    placement = BatchPlacement(sharding, 8, drop_remainder=False)
    np.testing.assert_array_equal(placement.rows, np.arange(8))
    assert not placement.is_global and placement.mask_key == "mask"
    assert BatchPlacement(sharding, 8, drop_remainder=True).mask_key is None
    arrays = {"x": jax.device_put(np.arange(10.0))}
    placed = placement.device_arrays(arrays)
    assert placement.device_arrays(arrays) is placed  # replicated once, not per batch
    assert placed["x"].sharding.is_fully_replicated and len(placed["x"].sharding.device_set) == 8
    put = placement.put({"x": np.arange(16.0).reshape(8, 2)})
    assert put["x"].sharding == sharding.batch_sharding
    assert placement.assemble(put) is put
