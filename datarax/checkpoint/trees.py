"""A module's state as the checkpoint holds it: pure dicts of fresh arrays, their layout hash, and
the differences between a saved tree and this run's, named path by path."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
from flax import nnx


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def savable(module: nnx.Module) -> dict:
    """The module's state as a pure dict of fresh arrays (PRNG keys as raw key data).

    The copies matter: the train step donates its inputs, so an asynchronous save must not hold
    the arrays the next step will overwrite.
    """
    pure = nnx.to_pure_dict(nnx.state(module))
    pure = jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, pure)
    return jax.device_put(pure, may_alias=False)


def abstract_target(module: nnx.Module) -> dict:
    """Shape/dtype/sharding of `savable(module)`, the restore target."""

    def spec(x):
        x = jax.random.key_data(x) if _is_key(x) else x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))

    return jax.tree.map(spec, nnx.to_pure_dict(nnx.state(module)))


def tree_shapes(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """`{state path: (shape, dtype)}` of a state tree's arrays or their specs."""
    return {jax.tree_util.keystr(path): (tuple(x.shape), str(x.dtype))
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def tree_layout(tree: dict) -> str:
    """A short hash of a state tree's paths, shapes and dtypes (arrays or their specs alike)."""
    text = json.dumps([(path, list(shape), dtype) for path, (shape, dtype) in tree_shapes(tree).items()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def layout(module: nnx.Module) -> str:
    """`tree_layout` of the module's saved state, to tell a foreign checkpoint from a corrupt one."""
    return tree_layout(abstract_target(module))


def load_into(module: nnx.Module, restored: dict) -> None:
    """Writes a restored pure dict into `module`'s existing Variables (keys re-wrapped)."""
    state = nnx.state(module)
    current = nnx.to_pure_dict(state)
    fixed = jax.tree.map(
        lambda cur, new: jax.random.wrap_key_data(new, impl=jax.random.key_impl(cur)) if _is_key(cur) else new,
        current, restored)
    nnx.replace_by_pure_dict(state, fixed)
    nnx.update(module, state)


def _short(value: Any, width: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def structure_differences(saved: Any, here: dict | None) -> str:
    """`batch_size differs: saved 32, this run 64` for each part of a pipeline structure that differs."""
    if not isinstance(saved, dict) or not isinstance(here, dict):
        return ""
    parts = [f"{key} differs: saved {_short(saved.get(key))}, this run {_short(here.get(key))}"
             for key in sorted(set(saved) | set(here)) if saved.get(key) != here.get(key)]
    return "; ".join(parts)


def tree_differences(saved: dict[str, tuple], here: dict[str, tuple], name: str, limit: int = 5) -> str:
    """The paths of `name` whose (shape, dtype) differ, or that only one side has (at most `limit`)."""
    lines = []
    for path in sorted(set(saved) | set(here)):
        if path not in here:
            lines.append(f"{name}{path} is in the checkpoint only ({saved[path][0]} {saved[path][1]})")
        elif path not in saved:
            lines.append(f"{name}{path} is in this run only ({here[path][0]} {here[path][1]})")
        elif saved[path] != here[path]:
            lines.append(f"{name}{path}: saved {saved[path][0]} {saved[path][1]}, this run {here[path][0]} "
                         f"{here[path][1]}")
    more = f" (and {len(lines) - limit} more)" if len(lines) > limit else ""
    return "; ".join(lines[:limit]) + more
