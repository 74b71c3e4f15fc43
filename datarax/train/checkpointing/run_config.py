"""The configuration fingerprint a checkpoint is written under, so no run adopts another's checkpoint.

A checkpoint's metadata holds `run_config`, flat `{"key": "value"}` text of

* what the user passed as the run's configuration (`Trainer(run_config=...)`; for `datarax train`
  the `[trainer]` table), nested keys joined with dots (`trainer.optimizer.adam.learning_rate`);
* what the trainer sees itself: the model's class, a digest of the optimizer state's structure, and
  the update the optimizer makes for a fixed probe gradient (`optimizer.probe_updates`), which shows
  its learning rate at step 0 whatever the optimizer is. A schedule that starts at 0 (a warmup from
  0) shows none there: pass the rate in `run_config` too.

Restoring a checkpoint whose `run_config` differs raises `CheckpointMismatchError` naming every key
that differs, unless the trainer was built with `allow_config_change=True`. The keys in
`NOT_FINGERPRINTED` only say how long, where or how often to run, so a run may be extended or moved.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

# [trainer] keys that say how long, where or how often, not what is trained: a resumed run may change them.
NOT_FINGERPRINTED = frozenset({"steps", "epochs", "checkpoint_dir", "run_dir", "checkpoint_every", "max_to_keep",
                               "eval_every_steps", "callbacks", "compilation_cache", "allow_config_change", "guard",
                               "on_damaged", "keep_best", "best_metric", "best_mode", "param_sharding"})
RESUME_ANYWAY = ("start fresh in a new checkpoint directory (or empty this one), resume with the configuration the "
                 "checkpoint was written with, or resume anyway with Trainer(..., allow_config_change=True) "
                 "(in a configuration file: allow_config_change = true under [trainer])")


def flat_config(config: Any, prefix: str = "") -> dict[str, str]:
    """`{"a": {"b": 1e-3}}` -> `{"a.b": "0.001"}`; callables by their import path, lists by position."""
    if isinstance(config, Mapping):
        out: dict[str, str] = {}
        for key in sorted(config, key=str):
            out.update(flat_config(config[key], f"{prefix}{key}."))
        return out or {prefix.rstrip("."): "{}"}
    if isinstance(config, (list, tuple)):
        out = {}
        for i, value in enumerate(config):
            out.update(flat_config(value, f"{prefix}{i}."))
        return out or {prefix.rstrip("."): "[]"}
    if callable(config) and hasattr(config, "__qualname__"):
        text = f"{getattr(config, '__module__', '?')}:{config.__qualname__}"
    else:
        text = repr(config)
    return {prefix.rstrip("."): text}


def optimizer_fingerprint(tx: Any, params: Any) -> dict[str, str]:
    """The optimizer state's structure (a digest) and its update for a fixed probe gradient."""
    import jax

    out = {}
    try:
        structure = str(jax.tree.structure(jax.eval_shape(tx.init, params)))
        out["optimizer.state_structure"] = hashlib.sha256(structure.encode()).hexdigest()[:16]
    except Exception as exc:  # an optimizer that cannot be traced abstractly: say so, do not guess
        out["optimizer.state_structure"] = f"unavailable ({type(exc).__name__})"
    probe = {"probe": np.array([1.0, -2.0, 0.5], np.float32)}
    try:
        # One step only: the learning rate at step 0. Later steps of a schedule may depend on the
        # run's length (a warmup of steps // 20), which a resumed run may extend.
        updates, _ = tx.update({"probe": np.array([0.5, -1.0, 2.0], np.float32)}, tx.init(probe), probe)
        out["optimizer.probe_updates"] = " ".join(f"{float(v):.4g}" for v in np.asarray(updates["probe"]))
    except Exception as exc:  # e.g. a masked optimizer keyed on the model's own tree
        out["optimizer.probe_updates"] = f"unavailable ({type(exc).__name__})"
    return out


def config_differences(saved: Mapping[str, str], here: Mapping[str, str], limit: int = 8) -> str:
    """`trainer.optimizer.adam.learning_rate: saved 0.001, this run 0.01; ...`."""
    lines = []
    for key in sorted(set(saved) | set(here)):
        if saved.get(key) != here.get(key):
            old = saved.get(key, "(not set)")
            new = here.get(key, "(not set)")
            lines.append(f"{key}: saved {old}, this run {new}")
    more = f" (and {len(lines) - limit} more)" if len(lines) > limit else ""
    return "; ".join(lines[:limit]) + more
