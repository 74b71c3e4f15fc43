"""`SubsetSource`: some records of a random-access source, as a source of their own."""

from __future__ import annotations

import hashlib

import jax
import numpy as np

from datarax.core.checks import check_seed
from datarax.core.source import DataSourceModule, ShuffleConfig


class SubsetSource(DataSourceModule):
    """The records of `source` at `indices`, as a source of their own (record i is `indices[i]`).

    A view, so it takes its data and the two shuffle settings directly; they are kept as a
    `ShuffleConfig`, which `datarax.samplers.default_sampler` reads.
    """

    def __init__(self, source: DataSourceModule, indices: np.ndarray, *, shuffle: bool = False, seed: int = 0):
        if not isinstance(source, DataSourceModule):
            raise TypeError(f"SubsetSource needs a random-access source, got {type(source).__name__}")
        indices = np.asarray(indices, np.int64)
        if indices.ndim != 1 or indices.size == 0 or indices.min() < 0 or indices.max() >= len(source):
            raise ValueError(f"indices must be a non-empty 1-D array of record ids in [0, {len(source)}), "
                             f"got shape {indices.shape}")
        self.source = source
        self.indices = indices
        self.seed = check_seed(seed, "seed")
        self.config = ShuffleConfig(shuffle=shuffle, seed=self.seed)

    def __len__(self) -> int:
        return int(self.indices.size)

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return self.source.element_spec()

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return self.source.get_batch(self.indices[np.asarray(indices, np.int64)], out)

    def describe_record(self, record_id: int) -> str:
        original = int(self.indices[record_id])
        return f"{self.source.describe_record(original)} (record {original} of the full source)"

    @property
    def shuffle(self) -> bool:
        return self.config.shuffle

    def structure(self) -> str:
        digest = hashlib.sha256(self.indices.tobytes()).hexdigest()[:12]
        return f"SubsetSource({self.source.structure()}, n={len(self)}, indices={digest}, shuffle={self.shuffle})"
