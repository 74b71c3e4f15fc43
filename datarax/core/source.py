"""The data source contract.

A source is random access: it has a length, an element spec, and returns a whole batch for an
index array in one vectorised call. A source whose arrays live on the device also exposes them,
so the pipeline can fuse the gather into its compiled step (the arrays are passed to the jitted
function as arguments, never closed over, which would bake them into the program).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import MAX_INT32, check_bool, check_seed, field
from datarax.core.layout import from_storage

if TYPE_CHECKING:
    from datarax.samplers.base import Sampler


class Handles:
    """Holds what a source keeps outside NNX state and graph: its arrays, readers, tables, datasets.

    NNX walks a module's dicts and lists as graph nodes and copies arrays into `nnx.state`; behind
    a `Handles` they stay put, so `nnx.state(pipeline)` never copies the data.
    """

    def __init__(self, **objects: Any):
        self.__dict__.update(objects)

    def __repr__(self) -> str:
        return f"Handles({sorted(self.__dict__)})"


@dataclasses.dataclass(frozen=True)
class ShuffleConfig:
    """The shuffling fields every shuffling source's config has (keyword-only, after its own).

    Attributes:
        shuffle: a fresh record order every epoch (Feistel permutation keyed by (seed, epoch)).
        seed: the shuffle seed; None draws it from the source's `rngs` (stream "shuffle",
            falling back to `default`), or uses 0 without rngs.
    """

    shuffle: bool = dataclasses.field(default=False, kw_only=True)
    seed: int | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self):
        check_bool(*field(self, "shuffle"))
        check_seed(*field(self, "seed"), allow_none=True)


def seed_from_rngs(seed: int | None, rngs: nnx.Rngs | None, stream: str = "shuffle") -> int:
    """An explicit seed, else one drawn deterministically from `rngs`, else 0."""
    if seed is not None:
        return seed
    if rngs is None:
        return 0
    key = getattr(rngs, stream)()
    return int(jax.random.randint(key, (), 0, MAX_INT32))


class DataSourceModule(nnx.Module, abc.ABC):
    """Abstract base of random-access sources.

    Subclasses implement `__len__`, `element_spec` and `get_batch`; device-resident sources also
    return their arrays from `device_arrays`.
    """

    # The settings a constructor takes by position, in order (`datarax.core.construct`).
    positional: ClassVar[tuple[str, ...]] = ()

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

    def upcoming(self, indices: np.ndarray, epoch: int) -> None:
        """A hint from the pipeline's reader: the records of the batch it reads after the current
        one, whatever the sampler. A source that fetches ahead (`ShardedSource`) starts on them;
        the others ignore it."""

    def device_arrays(self) -> dict[str, jax.Array] | None:
        """The source's arrays on the device in their storage layout (`datarax.core.layout`: records
        may be flattened), or None for a host-resident source. Gather them with `gather_device`."""
        return None

    def sampler(self) -> Sampler | None:
        """The order the source is read in unless a pipeline is given a sampler, or None (the
        default) for `datarax.samplers.default_sampler`'s: a fresh order every epoch, keyed by
        `(self.seed, epoch)`, when the source's config has `shuffle=True` (a `ShuffleConfig`),
        else storage order. A source with an order of its own (a mixture, shards read block by
        block) returns it; a wrapper returns its inner source's default."""
        return None

    def structure(self) -> str:
        """Identifies the source for iterator fingerprints: class, length and element spec."""
        spec = {k: (tuple(v.shape), str(v.dtype)) for k, v in sorted(self.element_spec().items())}
        return f"{type(self).__qualname__}(len={len(self)}, spec={spec})"


def record_shapes(source: DataSourceModule) -> dict[str, tuple[int, ...]]:
    """Each field's record shape (the source's `element_spec`), as `gather_device` takes them."""
    return {k: tuple(v.shape) for k, v in source.element_spec().items()}


def gather_device(arrays: dict[str, jax.Array], indices: jax.Array, shapes: dict[str, tuple[int, ...]],
                  mode: str = "fill") -> dict[str, jax.Array]:
    """The device-side gather used inside the pipeline's compiled programs.

    `arrays` are a source's `device_arrays()` in their storage layout; `shapes`
    (`record_shapes(source)`) gives each field's record shape. Indices are always in range, so `mode`
    changes only the code XLA makes (docs/benchmarks.md, "The gather's mode").
    """
    return {k: from_storage(jax.numpy.take(v, indices, axis=0, mode=mode), indices.shape, shapes[k])
            for k, v in arrays.items()}
