"""Weighted mixing of random-access sources, deterministic and exactly resumable by arithmetic.

`MixDataSources` is the concatenation of its components plus a `MixSampler` that picks, for every
position of an epoch, the component and its record. Weights are not in the fingerprint and may
change on restore (docs/sources.md, "Mixing sources").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import check_bool, check_positive_int, check_seed, describe_value, field
from datarax.core.construct import resolve_config
from datarax.core.fields import allocate, spec_table
from datarax.core.source import DataSourceModule, seed_from_rngs
from datarax.samplers.base import Sampler
from datarax.samplers.mix import MixSampler, check_weights


@dataclasses.dataclass(frozen=True)
class MixDataSourcesConfig:
    """Configuration of a `MixDataSources`.

    Attributes:
        weights: one non-negative weight per source (normalised); may change on restore.
        seed: the mixing and shuffle seed; None draws it from `rngs` (or uses 0).
        shuffle: walk each component in a shuffled order (else in storage order).
        epoch_length: positions per mixture epoch; None is the total number of records.
        block_size: positions per block in which the weights are met exactly.
        source_field: when set, each record gets an int32 field of this name holding the index
            of the source it came from.
    """

    weights: tuple[float, ...]
    seed: int | None = None
    shuffle: bool = False
    epoch_length: int | None = None
    block_size: int = 1024
    source_field: str | None = None

    def __post_init__(self):
        check_weights(self.weights, "MixDataSourcesConfig")
        if self.seed is not None:
            check_seed(self.seed, "MixDataSourcesConfig.seed")
        check_bool(*field(self, "shuffle"))
        for name in ("epoch_length", "block_size"):
            check_positive_int(*field(self, name), allow_none=True)
        if self.source_field is not None and not isinstance(self.source_field, str):
            raise TypeError(f"MixDataSourcesConfig.source_field must be a field name or None, "
                            f"got {self.source_field!r}")


class MixDataSources(DataSourceModule):
    """Mixes random-access sources with the same element spec by weight.

    `len()` is the total number of records of the components (record ids index their
    concatenation); an epoch of the default `MixSampler` has `epoch_length` positions.

    Example:
        >>> mix = MixDataSources(MixDataSourcesConfig(weights=(0.7, 0.3), seed=0), sources=[web, books])
        >>> pipeline = Pipeline(source=mix, batch_size=256)
    """

    def __init__(self, config: MixDataSourcesConfig | None = None, *, sources: Sequence[DataSourceModule],
                 rngs: nnx.Rngs | None = None, **settings: Any):
        config = resolve_config(MixDataSourcesConfig, config, settings, "MixDataSources")
        if not isinstance(sources, Sequence) or not sources:
            raise TypeError(f"MixDataSources sources must be a non-empty list of sources, "
                            f"got {describe_value(sources)}")
        for i, s in enumerate(sources):
            if not isinstance(s, DataSourceModule):
                raise TypeError(f"MixDataSources sources[{i}] must be a random-access DataSourceModule, got "
                                f"{describe_value(s)}; streams cannot be mixed by index")
        if len(config.weights) != len(sources):
            raise ValueError(f"MixDataSources needs one weight per source: config.weights has "
                             f"{len(config.weights)} for {len(sources)} sources")
        spec = sources[0].element_spec()
        for i, s in enumerate(sources[1:], 1):
            if spec_table(s.element_spec()) != spec_table(spec):
                raise ValueError(f"MixDataSources sources must share one element spec: sources[0] has "
                                 f"{spec_table(spec)}, sources[{i}] has {spec_table(s.element_spec())}; map them to "
                                 "the same fields, shapes and dtypes first")
        if config.source_field is not None and config.source_field in spec:
            raise ValueError(f"MixDataSourcesConfig.source_field {config.source_field!r} is already a field of the "
                             "sources; pick another name")
        self.config = config
        self.sources = nnx.List(list(sources))
        self.seed = seed_from_rngs(config.seed, rngs)
        self._lengths = tuple(len(s) for s in sources)
        self._offsets = tuple(int(x) for x in np.cumsum((0,) + self._lengths))
        self._spec = dict(spec)
        if config.source_field is not None:
            self._spec[config.source_field] = jax.ShapeDtypeStruct((), np.int32)

    def __len__(self) -> int:
        return self._offsets[-1]

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return dict(self._spec)

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        indices = np.asarray(indices)
        flat = np.clip(indices.reshape(-1).astype(np.int64, copy=False), 0, len(self) - 1)
        if out is None:
            out = allocate(self._spec, indices.shape)
        flat_out = {k: out[k].reshape((flat.size,) + tuple(v.shape)) for k, v in self._spec.items()}
        offsets = np.asarray(self._offsets)
        comp = np.searchsorted(offsets[1:], flat, side="right")
        for c in np.unique(comp):
            rows = np.nonzero(comp == c)[0]
            part = self.sources[int(c)].get_batch(flat[rows] - offsets[c])
            for k, v in part.items():
                flat_out[k][rows] = v
        if self.config.source_field is not None:
            flat_out[self.config.source_field][...] = comp
        return out

    def describe_record(self, record_id: int) -> str:
        """`source 1 (row 17 of books.parquet)`: the component a record belongs to and its own origin there."""
        c = int(np.searchsorted(np.asarray(self._offsets[1:]), record_id, side="right"))
        if not 0 <= record_id < len(self):
            return f"record {record_id}"
        return f"source {c} ({self.sources[c].describe_record(record_id - self._offsets[c])})"

    def sampler(self) -> Sampler:
        c = self.config
        return MixSampler(self._lengths, c.weights, seed=self.seed, shuffle=c.shuffle, epoch_length=c.epoch_length,
                          block_size=c.block_size)

    def structure(self) -> str:
        parts = ", ".join(s.structure() for s in self.sources)
        return f"MixDataSources([{parts}], source_field={self.config.source_field})"
