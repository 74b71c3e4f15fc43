"""grain interop, both ways: `GrainSource` (a grain random-access source or `MapDataset`),
`GrainStreamSource` (a grain `IterDataset`), `to_grain(source)` and `to_grain_iter_dataset(pipeline)`.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import check_bool, check_positive_int, describe_value, field, require
from datarax.core.construct import resolve_config
from datarax.core.fields import flatten, read_batch, spec_of, spec_table, stack_into
from datarax.core.source import DataSourceModule, Handles, ShuffleConfig, seed_from_rngs
from datarax.sources.stream import ChunkReader, RecordReader, StreamSourceModule, check_stream_state

Decoder = Callable[[Any], Mapping[str, Any]]


def as_record(element: Any, decode: Decoder | None, owner: str) -> dict[str, Any]:
    """A grain element as a flat dict of arrays (`decode` first when given)."""
    if decode is not None:
        element = decode(element)
    if isinstance(element, Mapping):
        return flatten(element)
    if element is None:
        raise ValueError(f"{owner} got a None element (filtered out in the grain pipeline); random access needs "
                         "every index to hold a record: filter after datarax, or use GrainStreamSource")
    raise TypeError(f"{owner} elements must be dicts of arrays, got {describe_value(element)}; pass decode=fn "
                    "that turns one element into a dict of arrays")


@dataclasses.dataclass(frozen=True)
class GrainSourceConfig(ShuffleConfig):
    """Configuration of a `GrainSource`: shuffling by the pipeline's Feistel permutation."""


class GrainSource(DataSourceModule):
    """A grain random-access data source or `MapDataset` as a datarax source.

    Example:
        >>> ds = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(files)).map(parse)
        >>> source = GrainSource(GrainSourceConfig(shuffle=True, seed=0), source=ds)
    """

    def __init__(self, config: GrainSourceConfig | None = None, *, source: Any, decode: Decoder | None = None,
                 rngs: nnx.Rngs | None = None, **settings: Any):
        config = resolve_config(GrainSourceConfig, config, settings, "GrainSource")
        if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
            raise TypeError(f"GrainSource source must be a grain RandomAccessDataSource or MapDataset (with __len__ "
                            f"and __getitem__), got {describe_value(source)}; wrap an IterDataset in GrainStreamSource")
        length = len(source)
        if length >= sys.maxsize or length <= 0:
            raise ValueError(f"GrainSource source has length {length}; it must be finite and non-empty (remove "
                             ".repeat(); epochs are the pipeline's)")
        self.config, self._length = config, length
        batched = getattr(source, "_getitems", None) or getattr(source, "__getitems__", None)
        self._io = Handles(source=source, decode=decode, batched=batched)
        spec = spec_of(self._records(np.zeros(1, np.int64))[0], "GrainSource element", batched=False)
        self._io.spec = spec
        self._name = type(source).__name__
        self.seed = seed_from_rngs(config.seed, rngs)

    def _records(self, flat: np.ndarray) -> list[dict[str, Any]]:
        keys = flat.tolist()
        batched, source = self._io.batched, self._io.source
        elements = batched(keys) if batched is not None else [source[k] for k in keys]
        return [as_record(e, self._io.decode, "GrainSource") for e in elements]

    def __len__(self) -> int:
        return self._length

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return dict(self._io.spec)

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return read_batch(indices, out, self._io.spec, self._length,
                          lambda flat, o: stack_into(self._records(flat), o, "GrainSource"))

    def structure(self) -> str:
        return f"GrainSource(len={len(self)}, spec={spec_table(self.element_spec())}, source={self._name})"


@dataclasses.dataclass(frozen=True)
class GrainStreamSourceConfig:
    """Configuration of a `GrainStreamSource`.

    Attributes:
        batched: the grain dataset yields batches (leading batch axis), e.g. after `.batch(n)`.
        num_records: records per epoch when known (None: the epoch ends when the dataset does).
    """

    batched: bool = False
    num_records: int | None = None

    def __post_init__(self):
        check_bool(*field(self, "batched"))
        check_positive_int(*field(self, "num_records"), allow_none=True)


class GrainStreamSource(StreamSourceModule):
    """A grain `IterDataset` (or a function epoch -> dataset) as a stream source.

    Example:
        >>> ds = (grain.MapDataset.source(files_source).shuffle(seed=0).map(decode).batch(64)
        ...       .to_iter_dataset().mp_prefetch(grain.MultiprocessingOptions(num_workers=4)))
        >>> source = GrainStreamSource(GrainStreamSourceConfig(batched=True), dataset=ds)
    """

    def __init__(self, config: GrainStreamSourceConfig | None = None, *, dataset: Any, **settings: Any):
        require("grain", owner="GrainStreamSource", extra="data")
        config = resolve_config(GrainStreamSourceConfig, config, settings, "GrainStreamSource")
        if not (callable(dataset) or hasattr(dataset, "__iter__")):
            raise TypeError(f"GrainStreamSource dataset must be a grain IterDataset/MapDataset or a function "
                            f"epoch -> dataset, got {describe_value(dataset)}")
        self.config = config
        self._io = Handles(dataset=dataset)
        iterator = iter(self.dataset_for_epoch(0))
        try:
            first = as_record(next(iterator), None, "GrainStreamSource")
        except StopIteration:
            raise ValueError("GrainStreamSource dataset yields no elements in epoch 0") from None
        finally:
            getattr(iterator, "close", lambda: None)()
        self._io.spec = spec_of(first, "GrainStreamSource element", batched=config.batched)
        self._name = type(self.dataset_for_epoch(0)).__name__

    def dataset_for_epoch(self, epoch: int) -> Any:
        """The grain dataset read in `epoch` (the one given, or what a per-epoch factory returns)."""
        dataset = self._io.dataset
        return dataset(epoch) if callable(dataset) and not hasattr(dataset, "__iter__") else dataset

    def num_records(self) -> int | None:
        return self.config.num_records

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return dict(self._io.spec)

    def open(self, epoch: int, state: dict[str, Any] | None) -> RecordReader:
        return _GrainReader(self, epoch, state)

    def structure(self) -> str:
        return (f"GrainStreamSource(records={self.num_records()}, spec={spec_table(self.element_spec())}, "
                f"dataset={self._name}, batched={self.config.batched})")


class _GrainReader(ChunkReader):
    """State: `{"grain": iterator state at the current grain element, "offset": rows used of it}`."""

    def __init__(self, source: GrainStreamSource, epoch: int, state: dict[str, Any] | None):
        self._batched = source.config.batched
        self._iterator = iter(source.dataset_for_epoch(epoch))
        self._current: dict[str, np.ndarray] | None = None
        self._offset, self._size = 0, 0
        self._start = None
        if state is not None:
            check_stream_state(state, ("offset",), "GrainStreamSource")
            if state.get("grain") is not None:
                self._iterator.set_state(state["grain"])
            if self._batched and state["offset"]:
                self._pull()
                self._offset = min(state["offset"], self._size)
            self._start = state.get("grain")

    def _pull(self) -> bool:
        self._start = self._iterator.get_state()
        element = next(self._iterator, None)
        if element is None:
            self._current = None
            return False
        self._current = as_record(element, None, "GrainStreamSource")
        self._size = len(next(iter(self._current.values()))) if self._batched else 1
        self._offset = 0
        return True

    def remaining(self) -> int:
        return 0 if self._current is None else self._size - self._offset

    def next_chunk(self) -> bool:
        return self._pull()

    def take(self, out: dict[str, np.ndarray], count: int) -> None:
        for name, buf in out.items():
            value = self._current[name]
            buf[...] = value[self._offset:self._offset + count] if self._batched else value
        self._offset += count

    def get_state(self) -> dict[str, Any]:
        if self._current is not None and self._offset == self._size:
            return {"grain": self._iterator.get_state(), "offset": 0}
        return {"grain": self._start, "offset": self._offset}

    def close(self) -> None:
        getattr(self._iterator, "close", lambda: None)()


class GrainDataSource:
    """A datarax source as a grain `RandomAccessDataSource` (records as dicts of numpy arrays)."""

    def __init__(self, source: DataSourceModule):
        if not isinstance(source, DataSourceModule):
            raise TypeError(f"GrainDataSource needs a random-access datarax source, got {describe_value(source)}")
        self._source = source

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not 0 <= int(index) < len(self._source):
            raise IndexError(f"GrainDataSource index {index} is out of range [0, {len(self._source)})")
        return {k: v[0] for k, v in self._source.get_batch(np.array([int(index)])).items()}

    def _getitems(self, indices: list[int]) -> list[dict[str, np.ndarray]]:
        batch = self._source.get_batch(np.asarray(indices, np.int64))
        return [{k: v[i] for k, v in batch.items()} for i in range(len(indices))]

    __getitems__ = _getitems

    def __repr__(self) -> str:
        return f"GrainDataSource({self._source.structure()})"


def to_grain(source: DataSourceModule) -> Any:
    """A datarax source as a grain `MapDataset` (batched reads go through `get_batch`)."""
    grain = require("grain", owner="to_grain", extra="data")
    return grain.MapDataset.source(GrainDataSource(source))


def to_grain_iter_dataset(pipeline: Any, num_epochs: int | None = None) -> Any:
    """A datarax pipeline as a grain `IterDataset` yielding its batches over `num_epochs` epochs; its
    iterator's `get_state`/`set_state` are the pipeline iterator's."""
    grain = require("grain", owner="to_grain_iter_dataset", extra="data")
    return _pipeline_dataset_class(grain)(pipeline, num_epochs)


@functools.cache
def _pipeline_dataset_class(grain: Any) -> type:
    # Defined on first use so that importing this module does not import grain.
    class PipelineDatasetIterator(grain.DatasetIterator):
        def __init__(self, pipeline: Any, num_epochs: int | None):
            super().__init__()
            self._iterator = pipeline.epochs(num_epochs)

        def __next__(self) -> dict:
            return next(self._iterator)

        def get_state(self) -> dict[str, Any]:
            return self._iterator.get_state()

        def set_state(self, state: dict[str, Any]) -> None:
            self._iterator.set_state(state)

        def close(self) -> None:
            self._iterator.close()
            super().close()

    class PipelineIterDataset(grain.IterDataset):
        def __init__(self, pipeline: Any, num_epochs: int | None):
            super().__init__()
            self._pipeline, self._num_epochs = pipeline, num_epochs

        def __iter__(self) -> PipelineDatasetIterator:
            return PipelineDatasetIterator(self._pipeline, self._num_epochs)

        def __str__(self) -> str:
            return f"PipelineIterDataset(num_epochs={self._num_epochs})"

    return PipelineIterDataset
