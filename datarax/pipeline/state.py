"""Iterator state: tiny, JSON-able, validated, and tied to the pipeline that produced it.

Every iterator (`PipelineIterator`, `CachingIterator`, `BucketedIterator`) builds its state with
`make_state`, checks a state with `check_state`, and gets its context-manager and Orbax methods
from `CheckpointableIterator`; every pipeline claims epochs for its iterators through `Epochs`.
"""

from __future__ import annotations

import abc
import hashlib
import json
from collections.abc import Iterator
from typing import Any

# The compiled program receives epoch and position as int32 (the `BatchContext`), so a state past
# this would be accepted and then fail in `next()`.
from datarax.core.checks import MAX_INT32 as MAX_INT32
from datarax.core.checks import check_int, is_int
from datarax.core.errors import DataraxError

STATE_VERSION = 1
_KEYS = ("version", "epoch", "position", "fingerprint")
_SIZES = {"num_records": "from a pipeline over {saved} records, this one has {here}; restore into a pipeline "
                         "over the same dataset",
          "batch_size": "with batch_size={saved}, this pipeline has batch_size={here}; rebuild the pipeline with "
                        "the saved batch size"}


class IteratorStateError(DataraxError, ValueError):
    """A state that cannot be restored into this pipeline (foreign, corrupt or from a newer version)."""


def fingerprint(parts: dict[str, Any]) -> str:
    """A short stable hash of a pipeline's identifying structure."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_state(*, epoch: int, position: int, fingerprint: str, **sizes: int) -> dict:
    """`{version, epoch, position, fingerprint}` plus `sizes` (e.g. `num_records`, `batch_size`)."""
    return {"version": STATE_VERSION, "epoch": int(epoch), "position": int(position), "fingerprint": fingerprint,
            **{k: int(v) for k, v in sizes.items()}}


def check_state(state: Any, *, fingerprint: str, epoch_length: int, owner: str = "pipeline", unit: str = "records",
                **sizes: int) -> tuple[int, int]:
    """Validates a state against this `owner` and returns (epoch, position).

    `epoch_length` is the epoch's length in `unit` (what a position counts); `sizes` are the
    `make_state` sizes the state must match (`num_records`, `batch_size`).
    """
    if not isinstance(state, dict):
        raise IteratorStateError(f"iterator state must be a dict from get_state(), got {type(state).__name__}: "
                                 f"{state!r:.200}")
    missing = [k for k in (*_KEYS, *sizes) if k not in state]
    if missing:
        raise IteratorStateError(f"iterator state is missing {missing}; it is corrupt or not from a datarax "
                                 f"{owner} iterator (got keys {sorted(state)})")
    if state["version"] != STATE_VERSION:
        raise IteratorStateError(f"iterator state has version {state['version']!r}, this datarax reads version "
                                 f"{STATE_VERSION}; restore with the datarax version that saved it")
    for key in ("epoch", "position", *sizes):
        value = state[key]
        if not is_int(value) or value < 0:
            raise IteratorStateError(f"iterator state {key} must be an int >= 0, got {value!r}; the state is corrupt")
    for key, here in sizes.items():
        if state[key] != here:
            raise IteratorStateError("iterator state was saved " + _SIZES[key].format(saved=state[key], here=here))
    if state["fingerprint"] != fingerprint:
        raise IteratorStateError(
            f"iterator state fingerprint {state['fingerprint']!r} does not match this {owner}'s {fingerprint!r}: "
            f"it was saved from another {owner}, with a different source, shuffle seed, sampler or stages. "
            f"Rebuild the {owner} exactly as it was when the state was saved"
        )
    for key in ("epoch", "position"):
        check_program_int(state[key], f"iterator state {key}", "the state is corrupt")
    if state["position"] > epoch_length:
        raise IteratorStateError(f"iterator state position {state['position']} is past the end of the epoch "
                                 f"({epoch_length} {unit}): a position in [0, {epoch_length}] is expected; the "
                                 "state is corrupt")
    return state["epoch"], state["position"]


def check_program_int(value: int, name: str, fix: str) -> None:
    """Raises `IteratorStateError` unless `value` fits the int32 the compiled program holds it in."""
    if value > MAX_INT32:
        raise IteratorStateError(f"{name} must be <= {MAX_INT32} (the program holds it as int32), got {value}; {fix}")


class Epochs:
    """A pipeline's epoch counter: each iterator claims its epochs, later ones start after them."""

    _next_epoch = 0

    @property
    def next_epoch(self) -> int:
        """The epoch the next `iter(pipeline)` or `pipeline.epochs(...)` starts at."""
        return self._next_epoch

    def reserve_epochs(self, num_epochs: int | None, *, start: int | None = None) -> int:
        """Claims epochs for an iterator and returns the first; later iterators start after them.

        Claims `[start, start + num_epochs)`, from the next epoch when `start` is None.
        `num_epochs=None` is an endless iterator, which claims none (an iterator made after it
        starts at the same epoch). A restored iterator claims from its state's epoch, so
        `for batch in pipeline` afterwards continues after the epochs it covers.

        Example:
            >>> first = pipeline.reserve_epochs(3)  # what pipeline.epochs(3) does
            >>> pipeline.next_epoch == first + 3
            True
        """
        check_int(num_epochs, "num_epochs", 0, allow_none=True)
        check_int(start, "start", 0, allow_none=True)
        first = self._next_epoch if start is None else start
        self._next_epoch = first + (num_epochs or 0)
        return first


class CheckpointableIterator(Iterator[dict], abc.ABC):
    """An iterator whose state is `get_state()`/`set_state()`: a context manager that closes it, and
    an Orbax v1 `StatefulCheckpointable` (`save`/`load`, see `datarax.checkpoint`)."""

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]: ...

    @abc.abstractmethod
    def set_state(self, state: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def save(self, directory):
        from datarax.checkpoint.orbax import iterator_save

        return await iterator_save(self, directory)

    async def load(self, directory):
        from datarax.checkpoint.orbax import iterator_load

        return await iterator_load(self, directory)
