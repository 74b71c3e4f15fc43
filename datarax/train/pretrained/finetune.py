"""Which parameters a fine-tune trains, and at what rate: by dotted state path.

* A *linear probe* freezes the backbone: `probe_optimizer(model, tx, head=("fc.",))` builds the
  `nnx.Optimizer` over the `nnx.Param`s under the head's path prefixes only, so the backbone
  gets no update at all (not a zero learning rate: no optimizer state either).
* *Discriminative learning rates* train everything, each part at its own rate:
  `discriminative(("stages.0.", optax.adam(1e-5)), ("fc.", optax.adam(1e-3)), default=optax.adam(1e-4))`
  is one optax transformation (an `optax.multi_transform`) whose rule for a parameter is the
  first prefix its path starts with. Pass it to `Trainer` as the optimizer.

Example::

    trainer = Trainer(model, probe_optimizer(model, optax.adam(1e-3), head=("fc.",)), pipeline, loss_fn)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jax
import optax
from flax import nnx

from datarax.train.pretrained.tables import dotted


def path_prefixes(*prefixes: str) -> Any:
    """An NNX filter: variables whose dotted path starts with one of `prefixes`."""
    if not prefixes or not all(isinstance(p, str) and p for p in prefixes):
        raise ValueError(f"path_prefixes needs dotted path prefixes such as 'fc.', got {prefixes!r}")
    return lambda path, _value: dotted(path).startswith(prefixes)


def probe_optimizer(model: nnx.Module, tx: optax.GradientTransformation, *, head: Iterable[str]) -> nnx.Optimizer:
    """An `nnx.Optimizer` over the `nnx.Param`s under the `head` path prefixes only (a frozen backbone)."""
    head = tuple(head)
    selected = [dotted(p) for p, v in nnx.iter_graph(model) if isinstance(v, nnx.Param)
                and dotted(p).startswith(head)] if head and all(isinstance(h, str) for h in head) else []
    if not selected:
        raise ValueError(f"probe_optimizer: head={head!r} selects no nnx.Param of {type(model).__name__}; its "
                         f"parameters start with {sorted({dotted(p).split('.')[0] for p, v in nnx.iter_graph(model) if isinstance(v, nnx.Param)})}")
    return nnx.Optimizer(model, tx, wrt=nnx.All(nnx.Param, path_prefixes(*head)))


def _key(k: Any) -> str:
    return str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))


def discriminative(*rules: tuple[str, optax.GradientTransformation],
                   default: optax.GradientTransformation) -> optax.GradientTransformation:
    """One optax transformation applying each `(prefix, tx)` rule to the parameters under `prefix`
    (the first matching rule wins) and `default` to the rest."""
    for rule in rules:
        if not (isinstance(rule, tuple) and len(rule) == 2 and isinstance(rule[0], str) and rule[0]
                and isinstance(rule[1], optax.GradientTransformation)):
            raise TypeError(f"discriminative: each rule must be (path prefix, optax transformation), got {rule!r:.80}")
    if not isinstance(default, optax.GradientTransformation):
        raise TypeError(f"discriminative: default must be an optax transformation, got {type(default).__name__}")
    transforms = {f"rule{i}": tx for i, (_, tx) in enumerate(rules)} | {"default": default}

    def label(path, _leaf) -> str:
        name = ".".join(_key(k) for k in path)
        return next((f"rule{i}" for i, (prefix, _) in enumerate(rules) if name.startswith(prefix)), "default")

    return optax.multi_transform(transforms, lambda params: jax.tree_util.tree_map_with_path(label, params))
