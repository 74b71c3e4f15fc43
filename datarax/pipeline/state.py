"""Iterator state: tiny, JSON-able, validated, and tied to the pipeline that produced it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from datarax.core.checks import is_int

STATE_VERSION = 1
# The compiled program receives epoch and position as int32 (the `BatchContext`), so a state past
# this would be accepted and then fail in `next()`.
MAX_INT32 = 2**31 - 1
_KEYS = ("version", "epoch", "position", "fingerprint", "num_records", "batch_size")


class IteratorStateError(ValueError):
    """A state that cannot be restored into this pipeline (foreign, corrupt or from a newer version)."""


def fingerprint(parts: dict[str, Any]) -> str:
    """A short stable hash of a pipeline's identifying structure."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_state(*, epoch: int, position: int, fingerprint: str, num_records: int, batch_size: int) -> dict:
    return {"version": STATE_VERSION, "epoch": int(epoch), "position": int(position),
            "fingerprint": fingerprint, "num_records": int(num_records), "batch_size": int(batch_size)}


def check_state(state: Any, *, fingerprint: str, num_records: int, batch_size: int, epoch_length: int) -> tuple[int, int]:
    """Validates a state against this pipeline and returns (epoch, position)."""
    if not isinstance(state, dict):
        raise IteratorStateError(f"iterator state must be a dict from get_state(), got {type(state).__name__}: {state!r:.200}")
    missing = [k for k in _KEYS if k not in state]
    if missing:
        raise IteratorStateError(f"iterator state is missing {missing}; it is corrupt or not from a datarax "
                                 f"pipeline iterator (got keys {sorted(state)})")
    if state["version"] != STATE_VERSION:
        raise IteratorStateError(f"iterator state has version {state['version']!r}, this datarax reads version "
                                 f"{STATE_VERSION}; restore with the datarax version that saved it")
    for key in ("epoch", "position", "num_records", "batch_size"):
        value = state[key]
        if not is_int(value) or value < 0:
            raise IteratorStateError(f"iterator state {key} must be an int >= 0, got {value!r}; the state is corrupt")
    if state["num_records"] != num_records:
        raise IteratorStateError(f"iterator state was saved from a pipeline over {state['num_records']} records, "
                                 f"this one has {num_records}; restore into a pipeline over the same dataset")
    if state["batch_size"] != batch_size:
        raise IteratorStateError(f"iterator state was saved with batch_size={state['batch_size']}, this pipeline "
                                 f"has batch_size={batch_size}; rebuild the pipeline with the saved batch size")
    if state["fingerprint"] != fingerprint:
        raise IteratorStateError(
            f"iterator state fingerprint {state['fingerprint']!r} does not match this pipeline's {fingerprint!r}: "
            "it was saved from a pipeline with a different source, shuffle seed, sampler or stages. "
            "Rebuild the pipeline exactly as it was when the state was saved"
        )
    for key in ("epoch", "position"):
        check_program_int(state[key], f"iterator state {key}", "the state is corrupt")
    if state["position"] > epoch_length:
        raise IteratorStateError(f"iterator state position {state['position']} is past the end of the epoch "
                                 f"({epoch_length} records); the state is corrupt")
    return state["epoch"], state["position"]


def check_program_int(value: int, name: str, fix: str) -> None:
    """Raises `IteratorStateError` unless `value` fits the int32 the compiled program holds it in."""
    if value > MAX_INT32:
        raise IteratorStateError(f"{name} must be <= {MAX_INT32} (the program holds it as int32), got {value}; {fix}")
