"""Length bucketing: variable-length records in a few fixed shapes, each compiled once.

`BucketedPipeline` puts each record in the smallest bucket that holds its length (longer ones go
to the last bucket and are cut), builds one `Pipeline` per bucket with stages made for its length,
and interleaves their batches in an order drawn from `(seed, epoch)`. Epochs are exact and the
state `{version, epoch, position, fingerprint}` resumes by arithmetic. See docs/sources.md, "Text".

    >>> pipeline = BucketedPipeline(TextSource(documents=documents), lengths, (64, 128, 256),
    ...                             lambda length: [Tokenize(tokenizer=tokenizer, length=length)], batch_size=32)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from datarax.core.checks import check_bool, check_positive_int, check_seed
from datarax.core.source import DataSourceModule
from datarax.pipeline.pipeline import Pipeline
from datarax.pipeline.state import CheckpointableIterator, Epochs, check_state, fingerprint, make_state
from datarax.samplers.keyed import INTERLEAVE_STREAM, keyed_permutation
from datarax.sources.subset import SubsetSource


def assign_buckets(lengths: Sequence[int], boundaries: Sequence[int]) -> np.ndarray:
    """The bucket of each record: the first boundary >= its length (the last for longer ones)."""
    lengths = np.asarray(lengths)
    return np.minimum(np.searchsorted(np.asarray(boundaries), lengths, side="left"), len(boundaries) - 1)


def interleave_permutation(seed: int, epoch: int, size: int) -> np.ndarray:
    """The shuffled interleave order of an epoch's `size` batches, keyed by `(seed, epoch)`."""
    return keyed_permutation(size, seed, epoch, stream=INTERLEAVE_STREAM)


class BucketedPipeline(Epochs):
    """One pipeline per length bucket, interleaved (see the module docstring).

    Args:
        source: a random-access source of the variable-length records.
        lengths: each record's length (e.g. its token count), one per record.
        boundaries: the bucket lengths, increasing (e.g. (64, 128, 256)).
        make_stages: `make_stages(length) -> stages` for the bucket of that length; the stages'
            output must have that fixed shape (e.g. `[Tokenize(tokenizer=tokenizer, length=length)]`).
        batch_size: records per batch (each batch from one bucket).
        shuffle / seed: shuffle each bucket's records and the interleave order every epoch.
        drop_remainder, prefetch: as for `Pipeline`, per bucket.
    """

    def __init__(self, source: DataSourceModule, lengths: Sequence[int], boundaries: Sequence[int],
                 make_stages: Callable[[int], Sequence[Any]], batch_size: int, *, shuffle: bool = True,
                 seed: int = 0, drop_remainder: bool = False, prefetch: int = 2):
        lengths = np.asarray(lengths)
        if lengths.shape != (len(source),) or not np.issubdtype(lengths.dtype, np.integer) or (lengths < 0).any():
            raise ValueError(f"lengths must hold one non-negative int per record ({len(source)}), got "
                             f"shape {lengths.shape} dtype {lengths.dtype}")
        boundaries = tuple(boundaries)
        for i, b in enumerate(boundaries):
            check_positive_int(b, f"boundaries[{i}]")
        if not boundaries or list(boundaries) != sorted(set(boundaries)):
            raise ValueError(f"boundaries must be increasing positive ints, e.g. (64, 128, 256), got {boundaries!r}")
        if not callable(make_stages):
            raise TypeError("make_stages must be a function length -> stages, e.g. "
                            "lambda length: [Tokenize(tokenizer=tokenizer, length=length)]")
        self.seed = check_seed(seed)
        self.shuffle = check_bool(shuffle, "shuffle")
        which = assign_buckets(lengths, boundaries)
        self.boundaries = tuple(int(b) for b in boundaries)
        self.pipelines: list[Pipeline] = []
        self.lengths: list[int] = []
        for b, length in enumerate(self.boundaries):
            members = np.flatnonzero(which == b)
            if members.size == 0:
                continue
            subset = SubsetSource(source, members, shuffle=shuffle, seed=(self.seed + b) % 2**63)
            self.pipelines.append(Pipeline(subset, list(make_stages(length)), batch_size,
                                           drop_remainder=drop_remainder, prefetch=prefetch))
            self.lengths.append(length)
        if not self.pipelines:
            raise ValueError("no bucket holds any record")
        self.counts = np.array([len(p) for p in self.pipelines], np.int64)
        self.fingerprint = fingerprint({"buckets": self.lengths, "shuffle": self.shuffle, "seed": self.seed,
                                        "pipelines": [p.fingerprint for p in self.pipelines]})

    def __len__(self) -> int:
        """Batches per epoch, over all buckets."""
        return int(self.counts.sum())

    def order(self, epoch: int) -> np.ndarray:
        """The bucket of each batch of `epoch`, in the order they are yielded."""
        order = np.repeat(np.arange(len(self.pipelines)), self.counts)
        if self.shuffle:
            order = order[interleave_permutation(self.seed, epoch, order.size)]
        return order

    def __iter__(self) -> BucketedIterator:
        start = self.reserve_epochs(1)
        return BucketedIterator(self, start, start + 1)

    def epochs(self, num_epochs: int | None = None) -> BucketedIterator:
        """One iterator over `num_epochs` epochs from the next one (None: endless)."""
        check_positive_int(num_epochs, "num_epochs", allow_none=True)
        start = self.reserve_epochs(num_epochs)
        return BucketedIterator(self, start, None if num_epochs is None else start + num_epochs)


class BucketedIterator(CheckpointableIterator):
    """Iterates a `BucketedPipeline`; `get_state`/`set_state` (and `save`/`load`) as for a pipeline iterator."""

    def __init__(self, pipeline: BucketedPipeline, epoch: int, end: int | None):
        self.pipeline = pipeline
        self._end = end
        self._iterators = [p.epochs(None) for p in pipeline.pipelines]
        self._move(epoch, 0)

    def _move(self, epoch: int, position: int) -> None:
        self._epoch, self._position = epoch, position
        self._order = self.pipeline.order(epoch)
        taken = np.bincount(self._order[:position], minlength=len(self._iterators))
        for it, count, p in zip(self._iterators, taken, self.pipeline.pipelines):
            it.seek(epoch, int(count) * p.batch_size)

    def __next__(self) -> dict:
        if self._position == self._order.size:
            if self._end is not None and self._epoch + 1 >= self._end:
                raise StopIteration
            self._move(self._epoch + 1, 0)
        if self._end is not None and self._epoch >= self._end:
            raise StopIteration
        bucket = int(self._order[self._position])
        batch = next(self._iterators[bucket])
        self._position += 1
        return batch

    def get_state(self) -> dict[str, Any]:
        """`{version, epoch, position, fingerprint}` after the last batch (JSON-able)."""
        return make_state(epoch=self._epoch, position=self._position, fingerprint=self.pipeline.fingerprint)

    def set_state(self, state: dict[str, Any]) -> None:
        """Continues from `state`; a state of another bucketed pipeline changes nothing and raises."""
        epoch, position = check_state(state, fingerprint=self.pipeline.fingerprint, epoch_length=len(self.pipeline),
                                      owner="bucketed pipeline", unit="batches")
        self._move(epoch, position)

    def close(self) -> None:
        for it in self._iterators:
            it.close()
