"""Warm start: a datarax training checkpoint's model weights, or a part of them, in a new model.

A fine-tune often starts from another run's model with a new head or a subset of its layers.
`warm_start` reads only the `model` item of a `Checkpointer` step (optimizer, iterator and run
configuration are left behind: this is a new run), checks the arrays against the integrity hash
written with them, and copies each entry whose dotted state path and shape match the new model.
With `strict=True` (the default) anything not restored is an error that names the paths:

    model = ResNet("basic", (2, 2, 2, 2), num_classes=5)             # a new 5-class head
    report = warm_start(model, "old_run/ckpt", exclude=("fc.",), strict=False)
    print(report.missing)      # ('fc.bias', 'fc.kernel'): the new head keeps its initialisation
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from datarax.checkpoint.integrity import verify_arrays
from datarax.checkpoint.orbax import finalized_steps
from datarax.checkpoint.trees import abstract_target
from datarax.core.errors import DataraxError
from datarax.train.pretrained.tables import check_prefixes, dotted, selected


class WarmStartError(DataraxError, ValueError):
    """`warm_start(strict=True)` found entries it could not restore; the message names them."""


@dataclasses.dataclass(frozen=True)
class WarmStartReport:
    """What `warm_start` did, as sorted dotted state paths.

    Attributes:
        step: the checkpoint step read.
        restored: the model's entries now holding the checkpoint's values.
        missing: the model's entries (within the selection) the checkpoint does not hold; they
            keep their values (e.g. a new head).
        unexpected: the checkpoint's entries (within the selection) the model does not have.
        mismatched: entries both have with different shapes or dtypes, `path: saved ..., model ...`.
    """

    step: int
    restored: tuple[str, ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    mismatched: tuple[str, ...]


def _latest_step(directory: epath.Path) -> int:
    steps = [step for step in finalized_steps(directory) if (directory / str(step) / "model").exists()]
    if not steps:
        raise FileNotFoundError(f"warm_start: {directory} holds no checkpoint step with a model (a Checkpointer or "
                                "CheckpointCallback directory)")
    return steps[-1]


def _int_keys(tree: Any) -> Any:
    """Orbax reads the integer keys of `nnx.to_pure_dict` (list indices) back as strings; the
    integrity hash was taken over the integers. (NNX attribute names are never all digits.)"""
    if isinstance(tree, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k: _int_keys(v) for k, v in tree.items()}
    return tree


def _flat(tree: Any) -> dict[str, Any]:
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out[".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)] = leaf
    return out


def warm_start(model: nnx.Module, directory: str | os.PathLike, *, step: int | None = None,
               include: Iterable[str] = (), exclude: Iterable[str] = (), strict: bool = True) -> WarmStartReport:
    """Copies a datarax checkpoint's model weights into `model` where paths and shapes agree.

    Args:
        model: the new model (its variables are overwritten in place).
        directory: a `Checkpointer` / `CheckpointCallback` directory (not locked: the run that
            wrote it may still be running).
        step: the step to read (None: the newest).
        include: dotted path prefixes to restore (empty: everything), e.g. `("backbone.",)`.
        exclude: dotted path prefixes never restored, e.g. `("fc.",)` for a new head.
        strict: raise `WarmStartError` when any selected entry is missing, unexpected or
            mismatched, instead of listing it in the report.

    Raises:
        WarmStartError: with `strict=True`, naming the paths; the model is then unchanged.
        CheckpointIntegrityError: the arrays read differ from those written.
    """
    include = check_prefixes("include", include, "warm_start")
    exclude = check_prefixes("exclude", exclude, "warm_start")
    directory = epath.Path(directory).absolute()
    step = _latest_step(directory) if step is None else step
    where = f"checkpoint step {step} in {directory}"
    if not (directory / str(step) / "model").exists():
        raise FileNotFoundError(f"warm_start: {where} does not exist (steps with a model: "
                                f"{sorted(p.name for p in directory.iterdir() if p.name.isdigit())})")
    metadata = json.loads((directory / str(step) / "meta" / "metadata").read_text())
    saved = _int_keys(ocp.StandardCheckpointer().restore(directory / str(step) / "model"))
    verify_arrays({"integrity": {"model": metadata.get("integrity", {}).get("model")}}, {"model": saved}, where)
    checkpoint = {p: np.asarray(v) for p, v in _flat(saved).items() if selected(p, include, exclude)}
    here = {p: v for p, v in _flat(abstract_target(model)).items() if selected(p, include, exclude)}
    mismatched = tuple(sorted(
        f"{p}: saved {checkpoint[p].shape} {checkpoint[p].dtype}, model {here[p].shape} {here[p].dtype}"
        for p in set(checkpoint) & set(here)
        if (checkpoint[p].shape, checkpoint[p].dtype) != (tuple(here[p].shape), np.dtype(here[p].dtype))))
    bad = {m.split(":")[0] for m in mismatched}
    report = WarmStartReport(step=step, restored=tuple(sorted(set(checkpoint) & set(here) - bad)),
                             missing=tuple(sorted(set(here) - set(checkpoint))),
                             unexpected=tuple(sorted(set(checkpoint) - set(here))), mismatched=mismatched)
    if strict and (report.missing or report.unexpected or report.mismatched):
        parts = [f"{label} {list(values)[:8]}" + (f" (+{len(values) - 8})" if len(values) > 8 else "")
                 for label, values in (("missing from the checkpoint:", report.missing),
                                       ("in the checkpoint only:", report.unexpected),
                                       ("shape/dtype differs:", report.mismatched)) if values]
        raise WarmStartError(f"warm_start from {where} into {type(model).__name__}: " + "; ".join(parts)
                             + ". Restore what fits with strict=False (the report lists the rest), or narrow the "
                             "selection with include=/exclude= path prefixes")
    variables = {dotted(path): v for path, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)}
    for path in report.restored:
        variable, value = variables[path], checkpoint[path]
        current = variable.get_value()
        if jax.dtypes.issubdtype(current.dtype, jax.dtypes.prng_key):
            value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(current))
        variable.set_value(jax.numpy.asarray(value))
    return report
