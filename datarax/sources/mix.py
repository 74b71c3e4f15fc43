"""Weighted mixing of random-access sources, deterministic and exactly resumable by arithmetic.

`MixDataSources` is the concatenation of its components (record id = component offset + local
id) plus a `MixSampler` that decides, for every position of an epoch, which component it draws
from and which of that component's records it gets:

* The epoch's draws per component are the epoch length apportioned by the weights (largest
  remainder): with weights proportional to the component sizes they are exactly the sizes, so
  every epoch holds every record exactly once.
* Positions are grouped in blocks of `block_size`. The first n positions of an epoch hold
  `webster(n, draws)` slots of each component (Webster/Sainte-Lague apportionment, which never
  takes a slot back as n grows), so block k holds the difference at its two ends: within two
  slots of the weights in every block, with no rounding error carried from block to block. The slots
  of a block are ordered by a Feistel permutation keyed by (seed, epoch, block), so position p's
  component is a function of (seed, epoch, p) alone.
* The k-th draw of component c in an epoch is its draw number `epoch * draws_per_epoch[c] + k`
  in one endless stream over that component, which walks the component's own shuffled epochs
  (Feistel keyed by (seed, c, component epoch)) without repeats or gaps.

Everything is O(1) per position, so the iterator state stays `(epoch, position)`.

Weights may change on restore: the weights are not part of the pipeline fingerprint, and a
restored pipeline built with new weights continues from the saved position as if it had used
the new weights from the start of that epoch (positions before the restore point are not
replayed; records near the restore point may repeat or be skipped once in that epoch, and every
later epoch is exact for the new weights).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import check_bool, check_positive_int, field, is_number
from datarax.core.construct import resolve_config
from datarax.core.operator import describe
from datarax.core.source import DataSourceModule, default_shuffle, seed_from_rngs
from datarax.samplers.base import Sampler
from datarax.core.checks import check_seed
from datarax.samplers.feistel import FeistelPermutation
from datarax.core.fields import allocate, spec_text


def _check_weights(weights: object, owner: str) -> tuple[float, ...]:
    if not isinstance(weights, (tuple, list)) or not weights:
        raise TypeError(f"{owner} weights must be a non-empty tuple of numbers, got {weights!r}")
    if not all(is_number(x) and x >= 0 for x in weights) or sum(weights) <= 0:
        raise ValueError(f"{owner} weights must be finite, >= 0 and not all 0, got {weights!r}")
    return tuple(float(x) for x in weights)


def apportion(total: int, weights: Sequence[float]) -> np.ndarray:
    """Splits `total` slots by `weights` with the largest-remainder method (ties to lower index)."""
    w = np.asarray(weights, np.float64)
    quota = w / w.sum() * total
    counts = np.floor(quota).astype(np.int64)
    rest = total - int(counts.sum())
    order = np.lexsort((np.arange(len(w)), -(quota - counts)))
    counts[order[:rest]] += 1
    return counts


def webster(seats: int, weights: Sequence[float] | np.ndarray) -> np.ndarray:
    """Splits `seats` by `weights` with Webster's divisor method (Sainte-Lague; ties to lower index).

    Divisor methods are house monotone: no component loses a seat when `seats` grows, so the
    differences between consecutive totals (the slots of one block) are never negative.
    """
    w = np.asarray(weights, np.float64)
    quota = w / w.sum() * seats
    counts = np.floor(quota + 0.5).astype(np.int64)
    while counts.sum() > seats:
        cost = np.where(counts > 0, quota / np.maximum(counts - 0.5, 0.5), np.inf)
        counts[int(np.argmin(cost))] -= 1
    while counts.sum() < seats:
        counts[int(np.argmax(quota / (counts + 0.5)))] += 1
    return counts


def derive_seed(*words: int) -> int:
    """A 63-bit seed derived from several ints (for independent sub-permutations)."""
    hi, lo = np.random.SeedSequence([w & 0xFFFFFFFFFFFFFFFF for w in words]).generate_state(2, np.uint32)
    return (int(hi) << 31) ^ int(lo)


@dataclasses.dataclass(frozen=True)
class MixDataSourcesConfig:
    """Configuration of a `MixDataSources`.

    Attributes:
        weights: one non-negative weight per source (normalised); may change on restore.
        seed: the mixing and shuffle seed; None draws it from `rngs` (or uses 0).
        shuffle: walk each component in a shuffled order (else in storage order). Not given, it
            is True with a FutureWarning (docs/sources.md, "Shuffling").
        epoch_length: positions per mixture epoch; None is the total number of records.
        block_size: positions per block in which the weights are met exactly.
        source_field: when set, each record gets an int32 field of this name holding the index
            of the source it came from.
    """

    weights: tuple[float, ...]
    seed: int | None = None
    shuffle: bool | None = None
    epoch_length: int | None = None
    block_size: int = 1024
    source_field: str | None = None

    def __post_init__(self):
        _check_weights(self.weights, "MixDataSourcesConfig")
        if self.seed is not None:
            check_seed(self.seed, "MixDataSourcesConfig.seed")
        check_bool(*field(self, "shuffle"), allow_none=True)
        for name in ("epoch_length", "block_size"):
            check_positive_int(*field(self, name), allow_none=True)
        if self.source_field is not None and not isinstance(self.source_field, str):
            raise TypeError(f"MixDataSourcesConfig.source_field must be a field name or None, "
                            f"got {self.source_field!r}")
        default_shuffle(self, "MixDataSources")


class MixSampler(Sampler):
    """Positions of a mixture epoch -> global record ids of the concatenated components."""

    def __init__(self, lengths: Sequence[int], weights: Sequence[float], *, seed: int = 0, shuffle: bool = True,
                 epoch_length: int | None = None, block_size: int = 1024):
        self.lengths = tuple(int(n) for n in lengths)
        weights = _check_weights(weights, "MixSampler")
        if len(weights) != len(self.lengths):
            raise ValueError(f"MixSampler needs one weight per source: {len(weights)} weights for "
                             f"{len(self.lengths)} sources")
        self.seed, self.shuffle = check_seed(seed), bool(shuffle)
        self.epoch_length = sum(self.lengths) if epoch_length is None else int(epoch_length)
        # A block never exceeds the epoch, so a short epoch meets the weights exactly too.
        self.block_size = min(int(block_size), self.epoch_length)
        self.draws = apportion(self.epoch_length, weights)  # per component and epoch
        starved = [i for i, (w, c) in enumerate(zip(weights, self.draws)) if w > 0 and c == 0]
        if starved:
            needed = math.ceil(sum(weights) / min(w for w in weights if w > 0))
            raise ValueError(f"MixSampler weights {weights} give sources {starved} no draw in an epoch of "
                             f"{self.epoch_length}; make the epoch longer (at least {needed}) or raise their weights")
        self._offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self._perms: dict[tuple, FeistelPermutation] = {}
        self._starts: dict[int, np.ndarray] = {}

    def block_start(self, block: int) -> np.ndarray:
        """Each component's draws before block `block` in an epoch (the same in every epoch)."""
        if block not in self._starts:
            if len(self._starts) > 256:
                self._starts.clear()
            self._starts[block] = webster(min(block * self.block_size, self.epoch_length), self.draws)
        return self._starts[block]

    def __len__(self) -> int:
        return self.epoch_length

    def _perm(self, n: int, *key: int) -> FeistelPermutation:
        if key not in self._perms:
            if len(self._perms) > 64:
                self._perms.clear()
            self._perms[key] = FeistelPermutation(n, derive_seed(self.seed, *key), 0)
        return self._perms[key]

    def indices(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        positions = np.asarray(positions, np.int64)
        flat = positions.reshape(-1)
        block, offset = np.divmod(flat, self.block_size)
        comp = np.empty_like(flat)
        draw = np.empty_like(flat)
        for b in np.unique(block).tolist():
            sel = block == b
            start, end = self.block_start(b), self.block_start(b + 1)
            counts = end - start
            cums = np.concatenate([[0], np.cumsum(counts)])
            slot = self._perm(int(counts.sum()), 0, epoch, b)(offset[sel])
            comp[sel] = np.searchsorted(cums[1:], slot, side="right")
            draw[sel] = start[comp[sel]] + slot - cums[comp[sel]]
        draw = epoch * self.draws[comp] + draw
        lengths = np.asarray(self.lengths, np.int64)[comp]
        comp_epoch, local = np.divmod(draw, lengths)
        if self.shuffle:
            for c, e in np.unique(np.stack([comp, comp_epoch], axis=1), axis=0).tolist():
                sel = (comp == c) & (comp_epoch == e)
                local[sel] = self._perm(self.lengths[c], 1, c, e)(local[sel])
        return (self._offsets[comp] + local).reshape(positions.shape)

    def component_of(self, record_ids: np.ndarray) -> np.ndarray:
        """Which component each global record id belongs to."""
        return np.searchsorted(self._offsets[1:], np.asarray(record_ids), side="right")

    def structure(self) -> str:
        # Weights are left out on purpose: a state may be restored under new weights.
        return (f"MixSampler(lengths={self.lengths}, seed={self.seed}, shuffle={self.shuffle}, "
                f"epoch_length={self.epoch_length}, block_size={self.block_size})")


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
            raise TypeError(f"MixDataSources sources must be a non-empty list of sources, got {describe(sources)}")
        for i, s in enumerate(sources):
            if not isinstance(s, DataSourceModule):
                raise TypeError(f"MixDataSources sources[{i}] must be a random-access DataSourceModule, got "
                                f"{describe(s)}; streams cannot be mixed by index")
        if len(config.weights) != len(sources):
            raise ValueError(f"MixDataSources needs one weight per source: config.weights has "
                             f"{len(config.weights)} for {len(sources)} sources")
        spec = sources[0].element_spec()
        for i, s in enumerate(sources[1:], 1):
            if spec_text(s.element_spec()) != spec_text(spec):
                raise ValueError(f"MixDataSources sources must share one element spec: sources[0] has "
                                 f"{spec_text(spec)}, sources[{i}] has {spec_text(s.element_spec())}; map them to "
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

    def default_sampler(self) -> Sampler:
        c = self.config
        return MixSampler(self._lengths, c.weights, seed=self.seed, shuffle=c.shuffle, epoch_length=c.epoch_length,
                          block_size=c.block_size)

    def structure(self) -> str:
        parts = ", ".join(s.structure() for s in self.sources)
        return f"MixDataSources([{parts}], source_field={self.config.source_field})"
