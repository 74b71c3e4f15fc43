"""The stream contract: sources read in order, resumed from a small JSON state.

A `StreamSourceModule`'s `open(epoch, state)` returns a `RecordReader` positioned at `state` (None:
the epoch's start) that copies the next records into the caller's buffers and reports its state
after them. An epoch ends when the reader runs out; an unknown length is `UNBOUNDED`.
docs/sources.md ("Streams") has the contract.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import check_int
from datarax.core.fields import spec_table
from datarax.samplers.base import Sampler
from datarax.samplers.simple import SequentialSampler

UNBOUNDED = 2**62


class RecordReader(abc.ABC):
    """Reads one epoch of a stream in order, from the position it was opened at."""

    @abc.abstractmethod
    def read(self, out: dict[str, np.ndarray], start: int, count: int) -> int:
        """Copies up to `count` next records into rows `start:start+count` of `out`; returns how many
        (fewer than `count` only at the end of the epoch)."""

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]:
        """A JSON-able state: `open(epoch, state)` continues right after the records read so far."""

    def close(self) -> None:
        """Releases the reader's resources (idempotent)."""


class ChunkReader(RecordReader):
    """Abstract base of the readers that hold one chunk of records at a time (a block of a file, a
    batch of an iterator): `read` copies from the chunk and loads the next one when it runs out."""

    @abc.abstractmethod
    def remaining(self) -> int:
        """Records left in the current chunk (0 when there is none)."""

    @abc.abstractmethod
    def next_chunk(self) -> bool:
        """Loads the next chunk; False at the end of the epoch."""

    @abc.abstractmethod
    def take(self, out: dict[str, np.ndarray], count: int) -> None:
        """Copies the chunk's next `count` records into the rows of `out` and moves past them."""

    def read(self, out: dict[str, np.ndarray], start: int, count: int) -> int:
        done = 0
        while done < count:
            if self.remaining() == 0 and not self.next_chunk():
                break
            step = min(count - done, self.remaining())
            self.take({k: v[start + done:start + done + step] for k, v in out.items()}, step)
            done += step
        return done


class StreamSourceModule(nnx.Module, abc.ABC):
    """Abstract base of sources that are read in order, not by index."""

    # The settings a constructor takes by position, in order (`datarax.core.construct`).
    positional: ClassVar[tuple[str, ...]] = ()

    @abc.abstractmethod
    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        """Shape and dtype of one record's fields (no batch axis)."""

    @abc.abstractmethod
    def open(self, epoch: int, state: dict[str, Any] | None) -> RecordReader:
        """A reader over `epoch`, at `state` (from `RecordReader.get_state`) or at its start."""

    def num_records(self) -> int | None:
        """Records per epoch when known, else None (an epoch ends when the stream does)."""
        return None

    def __len__(self) -> int:
        n = self.num_records()
        return UNBOUNDED if n is None else n

    def device_arrays(self) -> None:
        """Streams are host-resident."""
        return None

    def sampler(self) -> Sampler:
        """Positions in order: a stream record's id is its position in the epoch."""
        return SequentialSampler(len(self))

    def structure(self) -> str:
        return f"{type(self).__qualname__}(records={self.num_records()}, spec={spec_table(self.element_spec())})"


def check_stream_state(state: Any, keys: tuple[str, ...], owner: str) -> dict[str, Any]:
    """Validates a reader state dict holding (at least) the int fields `keys`."""
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise ValueError(f"{owner} stream state must be a dict with keys {list(keys)} from get_state(), got "
                         f"{state!r:.200}; it is corrupt or from another source")
    for k in keys:
        check_int(state[k], f"{owner} stream state {k}", 0, hint="; the state is corrupt")
    return state

