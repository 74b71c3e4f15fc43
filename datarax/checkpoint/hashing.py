"""A stable fingerprint of a module's state: sha256 over its leaves in a fixed order."""

from __future__ import annotations

import hashlib

import jax
import numpy as np
from flax import nnx


def state_sha256(module: nnx.Module) -> str:
    """sha256 over every Variable of `module`, in sorted path order: path, dtype, shape, raw bytes.

    Equal hashes mean bitwise-equal state (PRNG keys are hashed as their raw key data).
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


def tree_sha256(tree) -> str:
    """sha256 over a pytree of arrays, in sorted key-path order: path, dtype, shape, raw bytes.

    The checkpoint's integrity hash: `Checkpointer` hashes the pure dict it writes and the one it
    reads back, so equal hashes mean the arrays restored are bitwise the arrays saved.
    """
    digest = hashlib.sha256()
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    for path, leaf in sorted(flat, key=lambda item: jax.tree_util.keystr(item[0])):
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(f"|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()
