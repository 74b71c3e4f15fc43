"""Checkpoint integrity: hashes of exactly what was saved, compared on restore.

Orbax restores flipped bytes in array data without an error, so a save records in its metadata the
sha256 of the model, optimizer (and pipeline) arrays as handed to Orbax, and the iterator's epoch,
position and the sha256 of its state; a restore checks what it read against them and treats a
mismatch like an unreadable step.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import Any

import jax

from datarax.checkpoint.hashing import tree_sha256
from datarax.core.errors import DataraxError, DataraxWarning


class CheckpointIntegrityError(DataraxError, RuntimeError):
    """A checkpoint reads back other data than was written (treated as an unreadable step)."""


class UnverifiedCheckpointWarning(DataraxWarning):
    """A checkpoint written before integrity data existed was restored without verification."""


def arrays_sha256(tree: dict) -> str | None:
    """The integrity hash of a pure dict of arrays; None when this process cannot see every shard.

    Arrays sharded over several hosts are not hashed (no process holds all their bytes); Orbax's
    own checks are all that guard them.
    """
    if not all(getattr(leaf, "is_fully_addressable", True) for leaf in jax.tree.leaves(tree)):
        return None
    return tree_sha256(tree)


def iterator_integrity(state: dict) -> dict:
    text = json.dumps(state, sort_keys=True, separators=(",", ":"))
    return {"epoch": state.get("epoch"), "position": state.get("position"),
            "sha256": hashlib.sha256(text.encode()).hexdigest()}


def _differs(what: str, saved: Any, read: Any) -> CheckpointIntegrityError:
    if isinstance(saved, str) and len(saved) == 64:
        saved, read = saved[:16], str(read)[:16]
        return CheckpointIntegrityError(f"{what} differs from what was written: sha256 at save time {saved}..., "
                                        f"read {read}...")
    return CheckpointIntegrityError(f"{what} differs from what was written: {saved!r} at save time, read {read!r}")


def verify_iterator(metadata: dict, iterator_state: dict) -> None:
    """Raises `CheckpointIntegrityError` when the iterator state read differs from the one saved."""
    saved = metadata.get("integrity", {}).get("iterator")
    if saved is None:
        return
    read = iterator_integrity(iterator_state)
    for key in ("epoch", "position", "sha256"):
        if saved.get(key) != read[key]:
            raise _differs(f"iterator {key}" if key != "sha256" else "iterator state", saved.get(key), read[key])


def verify_arrays(metadata: dict, restored: dict, where: str) -> None:
    """Raises `CheckpointIntegrityError` when restored arrays differ from those saved (`where`: the step)."""
    integrity = metadata.get("integrity")
    if integrity is None:
        warnings.warn(
            f"{where} carries no integrity data (written by an older "
            "datarax); restored without verifying its arrays", UnverifiedCheckpointWarning, stacklevel=4)
        return
    for name, tree in restored.items():
        saved = integrity.get(name)
        if saved is None:  # sharded over hosts at save time: not hashed
            continue
        read = arrays_sha256(tree)
        if read is not None and read != saved:
            raise _differs(f"{name} data", saved, read)
