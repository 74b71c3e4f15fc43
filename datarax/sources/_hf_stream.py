"""`HFStreamSource` and its reader: block-shuffled, resumable reading of an IterableDataset.

An epoch visits parts (the shards in a seeded per-epoch order when shuffling, else the whole
dataset), each read in Arrow blocks of `block_size` rows emitted in a permutation keyed by (seed,
epoch, shard, block). State `{"part", "block", "offset", "hf"}` re-reads one block on restore
(docs/sources.md).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.fields import check_columns, spec_table
from datarax.core.source import Handles, seed_from_rngs
from datarax.samplers.keyed import SHARD_ORDER_WORD, keyed_permutation
from datarax.sources._arrow import TableConverter
from datarax.sources._hf_config import Convert, HFSourceConfig, check_arguments
from datarax.sources.stream import ChunkReader, StreamSourceModule, check_stream_state

_KEYS = ("part", "block", "offset")


class HFBlockReader(ChunkReader):
    """Reads one epoch of an `HFStreamSource` from a state (see the module docstring)."""

    def __init__(self, source: HFStreamSource, epoch: int, state: dict[str, Any] | None):
        self._source, self._epoch = source, int(epoch)
        config = source.config
        self._shuffle, self._block_size = config.shuffle, config.block_size
        shards = source.num_shards
        if self._shuffle and shards > 1:
            self._order = keyed_permutation(shards, source.seed, self._epoch, words=(SHARD_ORDER_WORD,)).tolist()
        else:
            self._order = None
        self._parts = len(self._order) if self._order is not None else 1
        if state is None:
            state = {"part": 0, "block": 0, "offset": 0, "hf": None}
        check_stream_state(state, _KEYS, "HFStreamSource")
        if state["part"] >= self._parts or not (state.get("hf") is None or isinstance(state.get("hf"), dict)):
            raise ValueError(f"HFStreamSource stream state {state!r:.200} does not fit this dataset "
                             f"({self._parts} parts); it is corrupt or from another dataset")
        self._part, self._block, self._offset = state["part"], state["block"], 0
        self._arrays: dict[str, np.ndarray] | None = None
        self._perm: np.ndarray | None = None
        self._open_part(state["hf"])
        if self._next_block(first_index=state["block"]) and self._part == state["part"]:
            self._offset = min(state["offset"], len(self._perm))

    def _open_part(self, hf_state: dict | None) -> None:
        dataset = self._source.dataset
        if self._order is not None:
            dataset = dataset.shard(num_shards=len(self._order), index=self._order[self._part], contiguous=True)
        self._formatted = dataset.with_format("arrow")
        if hf_state is not None:
            self._formatted.load_state_dict(hf_state)
        self._block_start = hf_state
        self._blocks = iter(self._formatted.iter(batch_size=self._block_size))

    def _next_block(self, first_index: int | None = None) -> bool:
        """Loads the next block (moving on to later parts as they run out); False at the end."""
        start = self._block_start if first_index is not None else self._formatted.state_dict()
        index = first_index if first_index is not None else self._block + 1
        while True:
            table = next(self._blocks, None)
            if table is not None and len(table):
                break
            if table is None:
                if self._part + 1 >= self._parts:
                    self._arrays, self._perm = None, None
                    return False
                self._part += 1
                self._open_part(None)
                start, index = None, 0
        self._block_start, self._block, self._offset = start, index, 0
        self._arrays = self._source.converter.arrays(table)
        n = len(table)
        if self._shuffle:
            shard = self._order[self._part] if self._order is not None else 0
            self._perm = keyed_permutation(n, self._source.seed, self._epoch, words=(shard, index))
        else:
            self._perm = np.arange(n)
        return True

    def remaining(self) -> int:
        return 0 if self._perm is None else len(self._perm) - self._offset

    def next_chunk(self) -> bool:
        return self._perm is not None and self._next_block()

    def take(self, out: dict[str, np.ndarray], count: int) -> None:
        rows = self._perm[self._offset:self._offset + count]
        for name, values in self._arrays.items():
            np.take(values, rows, axis=0, out=out[name])
        self._offset += count

    def get_state(self) -> dict[str, Any]:
        return {"part": self._part, "block": self._block, "offset": self._offset, "hf": self._block_start}

    def close(self) -> None:
        self._blocks = iter(())
        self._arrays = None


class HFStreamSource(StreamSourceModule):
    """A streaming `datasets.IterableDataset` as a stream source with exact resume.

    Args:
        config: columns, shuffling and the block size (the shuffle window).
        dataset: one split of a streaming dataset (e.g. `load_files(..., streaming=True)`). Do not
            apply HF's `.shuffle()` to it: its buffer is lost on restore; use `config.shuffle`.
        convert: optional function turning a batch of non-numeric columns into arrays.
        rngs: draws the shuffle seed when `config.seed` is None.
    """

    def __init__(self, config: HFSourceConfig | None = None, *, dataset: Any, convert: Convert | None = None,
                 rngs: nnx.Rngs | None = None, **settings: Any):
        config = check_arguments(config, settings, dataset, convert, "HFStreamSource", "IterableDataset")
        if config.encoded:
            raise ValueError(f"HFStreamSource cannot read encoded columns {config.encoded}: the host stages that "
                             "decode them need random access. For shards on a remote store or the Hub (parquet "
                             "with Image/Audio columns), use datarax.sources.ShardedSource(urls=[...], "
                             f"encoded={tuple(config.encoded)!r}), which reads them by byte range with exact resume; "
                             "for local files, HFSource on a map-style dataset (load_files(...) without "
                             "streaming=True)")
        self.config = config
        probe = dataset.with_format("arrow")
        sample = next(iter(probe.iter(batch_size=min(config.block_size, 256))), None)
        if sample is None:
            raise ValueError("HFStreamSource dataset yields no rows; give it at least one")
        names = check_columns(config.fields, sample.column_names, "HFStreamSource")
        if list(names) != sample.column_names:
            dataset = dataset.select_columns(list(names))
        converter = TableConverter(sample.select(list(names)), names, convert, "HFStreamSource")
        self._io = Handles(dataset=dataset, converter=converter)
        self.seed = seed_from_rngs(config.seed, rngs)
        self._names, self._shards = names, int(dataset.num_shards)
        splits = getattr(dataset.info, "splits", None) or {}
        split = splits.get(str(dataset.split)) if dataset.split is not None else None
        self._num_records = None if split is None or not split.num_examples else int(split.num_examples)
        self._identity = (getattr(dataset.info, "dataset_name", None), str(dataset.split))

    def num_records(self) -> int | None:
        return self._num_records

    @property
    def num_shards(self) -> int:
        """The stream's shards (files or HF shards), the unit of the seeded shard order."""
        return self._shards

    @property
    def dataset(self) -> Any:
        """The HF `IterableDataset` read, restricted to the selected columns."""
        return self._io.dataset

    @property
    def converter(self) -> TableConverter:
        """Turns an Arrow table of the selected columns into the source's arrays."""
        return self._io.converter

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return dict(self._io.converter.spec)

    def open(self, epoch: int, state: dict[str, Any] | None) -> HFBlockReader:
        return HFBlockReader(self, epoch, state)

    def structure(self) -> str:
        name, split = self._identity
        return (f"HFStreamSource(records={self._num_records}, spec={spec_table(self.element_spec())}, dataset={name}, "
                f"split={split}, shards={self._shards}, columns={list(self._names)}, shuffle={self.config.shuffle}, "
                f"seed={self.seed}, block_size={self.config.block_size})")
