"""A stable fingerprint of a module's state: sha256 over its leaves in a fixed order."""

from __future__ import annotations

import hashlib

import jax
import numpy as np
from flax import nnx


def state_sha256(module: nnx.Module) -> str:
    """sha256 over every Variable of `module`, in sorted path order: path, dtype, shape, raw bytes.

    Equal hashes mean bitwise-equal state (PRNG keys are hashed as their raw key data).

    Example:
        >>> state_sha256(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))[:8]  # doctest: +SKIP
        '5f0c...'
    """
    digest = hashlib.sha256()
    for path, value in sorted(nnx.to_flat_state(nnx.state(module)), key=lambda item: tuple(map(str, item[0]))):
        leaf = value.get_value() if isinstance(value, nnx.Variable) else value
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update("/".join(map(str, path)).encode())
        digest.update(f"|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
