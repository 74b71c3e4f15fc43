"""DataSharding (mesh + batch PartitionSpec) and the per-process row helpers."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.sharding import DataSharding, describe_processes, is_multi_process, process_rows, rows_by_process


def mesh(shape=(8,), names=("data",)) -> Mesh:
    return Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), names)


@pytest.mark.parametrize("shape,names,batch_axes,spec,num_shards", [
    ((8,), ("data",), None, P("data"), 8),
    ((8,), ("data",), "data", P("data"), 8),
    ((4, 2), ("data", "model"), None, P("data"), 4),
    ((4, 2), ("data", "model"), ("data",), P("data"), 4),
    ((4, 2), ("data", "model"), ("data", "model"), P(("data", "model")), 8),
    ((2, 4), ("replica", "data"), "data", P("data"), 4),
])
def test_spec_and_shard_count(shape, names, batch_axes, spec, num_shards):
    sharding = DataSharding(mesh(shape, names), batch_axes)
    assert sharding.spec == spec
    assert sharding.num_shards == num_shards
    assert sharding.batch_sharding == NamedSharding(sharding.mesh, spec)
    assert isinstance(sharding.batch_axes, tuple)
    assert sharding.check_batch_size(2 * num_shards) == 2 * num_shards


def test_data_parallel_spans_every_device():
    sharding = DataSharding.data_parallel()
    assert sharding.mesh.devices.size == jax.device_count() and sharding.spec == P("data")
    assert sharding.mask_key == "mask"
    assert "data" in sharding.structure()


@pytest.mark.parametrize("kwargs,error,match", [
    ({"mesh": "not a mesh"}, TypeError, "DataSharding.mesh must be a jax.sharding.Mesh, got str"),
    ({"batch_axes": "batch"}, ValueError, r"batch_axes='batch' must name distinct axes of the mesh"),
    ({"batch_axes": ("data", "data")}, ValueError, "must name distinct axes"),
    ({"batch_axes": ()}, TypeError, r"batch_axes must be a mesh axis name or a tuple of names, got \(\)"),
    ({"batch_axes": 3}, TypeError, "batch_axes must be a mesh axis name or a tuple of names, got 3"),
    ({"mask_key": ""}, ValueError, "mask_key must be a non-empty field name or None, got ''"),
])
def test_bad_configuration_is_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        DataSharding(**{"mesh": mesh(), **kwargs})


def test_batch_size_must_split_over_the_shards():
    with pytest.raises(ValueError, match=r"batch_size=10 does not split evenly over the 4 shards .* multiple of 4"):
        DataSharding(mesh((4, 2), ("data", "model")), "data").check_batch_size(10)


def test_is_frozen_plain_data():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DataSharding.data_parallel().mask_key = "m"


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    id: int
    process_index: int


class ProcessesOf:
    """A real sharding whose devices are attributed to `devices_per_process`-sized processes."""

    def __init__(self, sharding: NamedSharding, devices_per_process: int):
        self.sharding, self.per = sharding, devices_per_process

    def devices_indices_map(self, shape):
        return {FakeDevice(d.id, d.id // self.per): index
                for d, index in self.sharding.devices_indices_map(shape).items()}


def reference_rows(batch_size: int, num_shards: int, shard_of_device, devices) -> np.ndarray:
    """Rows from first principles: shard k holds [k*B/S, (k+1)*B/S)."""
    per = batch_size // num_shards
    return np.array(sorted({r for d in devices for r in range(shard_of_device(d) * per,
                                                               (shard_of_device(d) + 1) * per)}))


@pytest.mark.parametrize("shape,names,batch_axes,per_process,batch_size", [
    ((8,), ("data",), "data", 2, 16),  # 4 processes, 2 shards each
    ((8,), ("data",), "data", 4, 8),  # 2 processes, 4 shards each
    ((4, 2), ("data", "model"), "data", 2, 8),  # one mesh row per process: replicas within a process
    ((2, 4), ("data", "model"), "data", 2, 8),  # two processes per row: replicas across processes
    ((4, 2), ("data", "model"), ("data", "model"), 4, 16),
])
def test_rows_by_process_match_first_principles(shape, names, batch_axes, per_process, batch_size):
    sharding = DataSharding(mesh(shape, names), batch_axes)
    fake = ProcessesOf(sharding.batch_sharding, per_process)
    got = rows_by_process(fake, batch_size)
    coords = {d.id: np.argwhere(sharding.mesh.device_ids == d.id)[0] for d in sharding.mesh.devices.flat}
    axes = [names.index(a) for a in sharding.batch_axes]

    def shard_of(device_id):
        k = 0
        for a in axes:
            k = k * shape[a] + coords[device_id][a]
        return k

    for p in range(8 // per_process):
        devices = [i for i in range(8) if i // per_process == p]
        np.testing.assert_array_equal(got[p], reference_rows(batch_size, sharding.num_shards, shard_of, devices))
    np.testing.assert_array_equal(np.unique(np.concatenate(list(got.values()))), np.arange(batch_size))


def test_a_single_process_holds_every_row():
    sharding = DataSharding(mesh((4, 2), ("data", "model")), "data").batch_sharding
    np.testing.assert_array_equal(process_rows(sharding, 12), np.arange(12))
    assert process_rows(sharding, 12, process_index=3).size == 0
    assert not is_multi_process()
    assert describe_processes().startswith("process 0 of 1, local devices [0, 1, 2")
