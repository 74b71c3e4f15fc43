"""Where the training state lives on a mesh: replicated (data parallel) or sharded (FSDP-style).

`Trainer(..., param_sharding="fsdp")` lays the parameters, the optimizer state and the moving
average out over the training pipeline's mesh, cut along its batch axis (as ZeRO-3 / FSDP do): each
device holds 1/N of every array that can be cut, XLA gathers a layer's weights where the step needs
them and reduce-scatters its gradients. `param_sharding="replicated"` puts a full copy on every
device (plain data parallelism).

Which dimension is cut, for each array:

* a variable annotated with a partition spec (`nnx.with_partitioning(init, (None, "data"))`) keeps
  that spec: the user's layout wins;
* otherwise the largest dimension divisible by the axis size (the first of equals), so that no
  device holds a padded shard; an array none of whose dimensions divides (a bias of 10, a step
  count) is replicated. `fsdp_spec` is the rule, testable on shapes alone.

The layout is not part of a checkpoint: Orbax restores each array into the sharding of the trainer
restoring it, so a checkpoint written on 8 devices resumes on 4 or on 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

PARAM_SHARDINGS = ("replicated", "fsdp")


def fsdp_spec(shape: Sequence[int], axis: str | tuple[str, ...], size: int) -> PartitionSpec:
    """The spec that cuts the largest dimension of `shape` divisible by `size` over `axis`
    (the first of equal ones), or the replicated spec when none divides.

    Example:
        >>> fsdp_spec((16, 32), axis="data", size=8) == PartitionSpec(None, "data")
        True
        >>> fsdp_spec((10,), axis="data", size=8) == PartitionSpec()
        True
    """
    best = None
    for dim, length in enumerate(shape):
        if length >= size and length % size == 0 and (best is None or length > shape[best]):
            best = dim
    if best is None or size == 1:
        return PartitionSpec()
    return PartitionSpec(*([None] * best + [axis]))


def _annotated(variable: Any) -> PartitionSpec | None:
    """The partition spec a variable was annotated with, or None."""
    if not isinstance(variable, nnx.Variable):
        return None
    metadata = variable.get_metadata()
    # flax names it `out_sharding` (0.12), `sharding_names` or `sharding` (earlier releases)
    names = next((metadata[k] for k in ("out_sharding", "sharding_names", "sharding") if metadata.get(k)), None)
    if names is None:
        return None
    return names if isinstance(names, PartitionSpec) else PartitionSpec(*names)


def state_shardings(root: nnx.Module, mesh: Mesh, axis: str | tuple[str, ...], mode: str) -> list[NamedSharding]:
    """One `NamedSharding` per variable of `root`, in `nnx.to_flat_state(nnx.state(root))` order
    (the order of `datarax.train.loop.step.VariableBinding`), under `mode` ("replicated" or "fsdp")."""
    if mode not in PARAM_SHARDINGS:
        raise ValueError(f"param_sharding must be one of {PARAM_SHARDINGS} or None, got {mode!r}")
    axes = (axis,) if isinstance(axis, str) else tuple(axis)
    size = 1
    for name in axes:
        size *= mesh.shape[name]
    out = []
    for _, variable in nnx.to_flat_state(nnx.state(root)):
        value = variable.get_value() if isinstance(variable, nnx.Variable) else variable
        spec = _annotated(variable)
        if spec is None:
            shape = getattr(value, "shape", ())
            spec = fsdp_spec(shape, axes[0] if len(axes) == 1 else axes, size) if mode == "fsdp" else PartitionSpec()
        out.append(NamedSharding(mesh, spec))
    return out


def place(values: list, shardings: list[NamedSharding]) -> list:
    """`values` copied onto their shardings (a committed copy each; the originals stay valid)."""
    return jax.device_put(list(values), list(shardings), may_alias=False)


def constrain(values: list, shardings: list[NamedSharding]) -> list:
    """Inside a jitted step: the new state keeps the layout it came in with, so the next step
    sees the same input shardings (no recompile) and the state stays cut."""
    return [jax.lax.with_sharding_constraint(v, s) for v, s in zip(values, shardings)]


def sharding_summary(values: list, shardings: list[NamedSharding]) -> dict[str, int]:
    """`{"arrays": n, "sharded": k, "bytes_per_device": b, "bytes": total}` of a placed state."""
    sharded = sum(1 for s in shardings if any(p is not None for p in s.spec))
    per_device = total = 0
    for value, sharding in zip(values, shardings):
        shape = getattr(value, "shape", ())
        itemsize = getattr(getattr(value, "dtype", None), "itemsize", 0)
        count = 1
        for length in shape:
            count *= length
        shard = 1
        for length in sharding.shard_shape(tuple(shape)):
            shard *= length
        total += count * itemsize
        per_device += shard * itemsize
    return {"arrays": len(values), "sharded": sharded, "bytes_per_device": per_device, "bytes": total}


def keep_layout(step: Callable, shardings: list) -> Callable:
    """`step` whose new state keeps `shardings` (the layout `param_sharding` gave it)."""

    def constrained(values, batch):
        new, out = step(values, batch)
        return constrain(new, shardings), out

    return constrained
