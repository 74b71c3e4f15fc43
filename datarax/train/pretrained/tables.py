"""Key/transpose tables: how a checkpoint's tensors map onto an NNX module's variables, both ways.

A table is a tuple of `KeyMap(key, path, transform)`: the checkpoint key (`layer1.0.conv1.weight`),
the dotted NNX state path (`layer1.0.conv1.kernel`) and the layout change between them, the whole
difference between PyTorch's and Flax's layouts:

| transform | checkpoint (PyTorch) | NNX |
|---|---|---|
| `copy` | any | the same |
| `linear` | `(out, in)` | `(in, out)` |
| `conv` | `(out, in, *kernel)` | `(*kernel, in, out)` |

`load_table` checks everything before it writes anything and raises one `LayoutError` listing every
problem; `export_table` is its exact inverse, so load-then-export gives back the checkpoint's arrays
bit for bit.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from datarax.core.errors import DataraxError

TRANSFORMS = ("copy", "linear", "conv")


class LayoutError(DataraxError, ValueError):
    """A checkpoint does not fit a module through its table (keys missing, unexpected or misshapen)."""


@dataclasses.dataclass(frozen=True)
class KeyMap:
    """One checkpoint tensor and the NNX variable it fills.

    Attributes:
        key: the checkpoint key, e.g. "encoder.layer.0.attention.self.query.weight".
        path: the dotted NNX state path, e.g. "layers.0.query.kernel".
        transform: "copy", "linear" (transpose a 2-d weight) or "conv" (PyTorch `(out, in,
            *kernel)` to Flax `(*kernel, in, out)`).
    """

    key: str
    path: str
    transform: str = "copy"

    def __post_init__(self):
        if self.transform not in TRANSFORMS:
            raise ValueError(f"KeyMap.transform must be one of {TRANSFORMS}, got {self.transform!r} (key {self.key!r})")


def to_nnx(array: np.ndarray, transform: str) -> np.ndarray:
    """A checkpoint array in the NNX layout."""
    if transform == "linear":
        return array.T
    if transform == "conv":
        return np.transpose(array, (*range(2, array.ndim), 1, 0))
    return array


def from_nnx(array: np.ndarray, transform: str) -> np.ndarray:
    """An NNX array in the checkpoint layout (the inverse of `to_nnx`)."""
    if transform == "linear":
        return array.T
    if transform == "conv":
        n = array.ndim
        return np.transpose(array, (n - 1, n - 2, *range(n - 2)))
    return array


def dotted(path: tuple) -> str:
    return ".".join(str(part) for part in path)


def selected(path: str, include: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    """Whether dotted `path` starts with one of `include` (empty: any) and none of `exclude`."""
    return (not include or path.startswith(include)) and not path.startswith(exclude)


def check_prefixes(name: str, prefixes: Iterable[str], where: str) -> tuple[str, ...]:
    """`prefixes` as a tuple of non-empty strings; TypeError naming `where`'s `name` otherwise."""
    prefixes = (prefixes,) if isinstance(prefixes, str) else tuple(prefixes)
    if not all(isinstance(p, str) and p for p in prefixes):
        raise TypeError(f"{where}: {name} must be dotted path prefixes (strings), e.g. ('fc.',), got {prefixes!r}")
    return prefixes


def weight_variables(model: nnx.Module) -> dict[str, nnx.Variable]:
    """The module's `nnx.Param`s and `nnx.BatchStat`s by dotted path, LoRA adapters left out."""
    return {dotted(path): node for path, node in nnx.iter_graph(model)
            if isinstance(node, (nnx.Param, nnx.BatchStat)) and not isinstance(node, nnx.LoRAParam)}


def _problems(tensors: Mapping[str, np.ndarray], variables: Mapping[str, nnx.Variable], table: Iterable[KeyMap],
              ignore: Iterable[str]) -> list[str]:
    table = tuple(table)
    keys = {m.key for m in table}
    paths = {m.path for m in table}
    problems = [f"checkpoint key {k!r} is not in the table" for k in tensors
                if k not in keys and not any(fnmatch.fnmatchcase(k, pattern) for pattern in ignore)]
    problems += [f"the module's {p!r} is not in the table" for p in variables if p not in paths]
    for m in table:
        if m.key not in tensors:
            problems.append(f"checkpoint key {m.key!r} (for {m.path!r}) is missing from the checkpoint")
        elif m.path not in variables:
            problems.append(f"the table maps {m.key!r} to {m.path!r}, which the module does not have")
        else:
            shape = to_nnx(np.asarray(tensors[m.key]), m.transform).shape
            if shape != tuple(variables[m.path].shape):
                problems.append(f"{m.key!r} {tuple(np.shape(tensors[m.key]))} -> {m.path!r} gives {shape} "
                                f"({m.transform}), the module has {tuple(variables[m.path].shape)}")
    return problems


def load_table(model: nnx.Module, tensors: Mapping[str, np.ndarray], table: Iterable[KeyMap], *,
               ignore: Iterable[str] = (), source: str = "checkpoint", include: Iterable[str] = (),
               exclude: Iterable[str] = (), check_only: bool = False) -> None:
    """Writes `tensors` into `model` through `table`, after checking that everything fits.

    Every checkpoint key must be mapped (or match `ignore`), every `nnx.Param` / `nnx.BatchStat` of
    the module filled (LoRA adapters excepted: a pretrained checkpoint has none), and every shape
    agree after the transform.

    Args:
        model: the NNX module to fill (its variables keep their dtypes: values are cast to them).
        tensors: `{checkpoint key: array}`, e.g. from `read_pth` or `load_safetensors`.
        table: the `KeyMap`s, e.g. `resnet_table(model)`.
        ignore: glob patterns of checkpoint keys with no NNX counterpart (`"*.num_batches_tracked"`).
        source: the checkpoint's name in error messages (its file).
        include: the model's dotted path prefixes to load (empty: all).
        exclude: the model's dotted path prefixes not loaded, e.g. `("fc.",)` for a new head; their
            table entries and checkpoint keys are left out of every check.
        check_only: run every check and write nothing (an abstract `nnx.eval_shape` model will do).

    Raises:
        LayoutError: listing every unmapped, missing or misshapen key; the module is unchanged.
    """
    include = check_prefixes("include", include, "load_table")
    exclude = check_prefixes("exclude", exclude, "load_table")
    table = tuple(table)
    dropped = {m.key for m in table if not selected(m.path, include, exclude)}
    table = tuple(m for m in table if selected(m.path, include, exclude))
    if not table:
        raise LayoutError(f"load_table: include={include!r} / exclude={exclude!r} leave nothing of the table to load "
                          f"into {type(model).__name__}")
    ignore = tuple(ignore)
    tensors = {k: v for k, v in tensors.items() if k not in dropped}
    variables = {p: v for p, v in weight_variables(model).items() if selected(p, include, exclude)}
    problems = _problems(tensors, variables, table, ignore)
    if problems:
        more = f" (and {len(problems) - 20} more)" if len(problems) > 20 else ""
        raise LayoutError(f"{source} does not fit {type(model).__name__} through its table: "
                          + "; ".join(problems[:20]) + more)
    if check_only:
        return
    for m in table:
        variable = variables[m.path]
        variable.set_value(jnp.asarray(to_nnx(np.asarray(tensors[m.key]), m.transform), dtype=variable.dtype))


def export_table(model: nnx.Module, table: Iterable[KeyMap]) -> dict[str, np.ndarray]:
    """`{checkpoint key: array}` of `model` in the checkpoint's layout (the inverse of `load_table`)."""
    variables = weight_variables(model)
    out = {}
    for m in table:
        if m.path not in variables:
            raise LayoutError(f"the table maps {m.key!r} to {m.path!r}, which {type(model).__name__} does not have")
        out[m.key] = np.ascontiguousarray(from_nnx(np.asarray(variables[m.path].get_value()), m.transform))
    return out


def path_prefixes(*prefixes: str) -> Any:
    """An NNX filter: variables whose dotted path starts with one of `prefixes`."""
    if not prefixes or not all(isinstance(p, str) and p for p in prefixes):
        raise ValueError(f"path_prefixes needs dotted path prefixes such as 'fc.', got {prefixes!r}")
    return lambda path, _value: dotted(path).startswith(prefixes)
