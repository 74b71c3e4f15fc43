"""LoRA fine-tuning with flax's `nnx.LoRALinear`: add adapters, train only them, merge them back.

`add_lora` swaps chosen `nnx.Linear` layers for `nnx.LoRALinear` ones holding the same `kernel`
and `bias` (so the base weights keep their state paths, and the key tables still apply) plus a
rank-`r` pair `lora.lora_a` `(in, r)` / `lora.lora_b` `(r, out)` of `nnx.LoRAParam`s, `lora_b`
zero so the model starts exactly where it was. `lora_optimizer` builds the `nnx.Optimizer` over the
`nnx.LoRAParam`s only, to pass to `Trainer` as its optimizer: the base weights get no update (and
XLA drops their unused gradients). `merge_lora` folds `kernel + lora_a @ lora_b` back into plain
`nnx.Linear` layers, the form to export. Example::

    add_lora(model, rank=8, where=lambda path: path.startswith("layers."))
    trainer = Trainer(model, lora_optimizer(model, optax.adam(1e-3)), pipeline, loss_fn)
    trainer.fit(num_steps=500)
    merge_lora(model)
    save_safetensors(export_table(model, bert_table(model)), "merged.safetensors")
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import optax
from flax import nnx

from datarax.core.checks import check_positive_int
from datarax.train.pretrained.tables import dotted


def _linears(model: nnx.Module, kind: type) -> list[tuple[tuple, nnx.Module]]:
    return [(path, node) for path, node in nnx.iter_graph(model) if type(node) is kind and path]


def _replace(model: nnx.Module, path: tuple, new: nnx.Module) -> None:
    parent = model
    for part in path[:-1]:
        parent = parent[part] if isinstance(part, int) else getattr(parent, part)
    if isinstance(path[-1], int):
        parent[path[-1]] = new
    else:
        setattr(parent, path[-1], new)


def add_lora(model: nnx.Module, rank: int, *, where: Callable[[str], bool] | None = None,
             rngs: nnx.Rngs | None = None) -> list[str]:
    """Replaces each `nnx.Linear` whose dotted path passes `where` (None: all) by an `nnx.LoRALinear`.

    Returns the replaced paths, sorted. Raises ValueError when none matched (a `where` that
    selects nothing would otherwise train nothing).
    """
    check_positive_int(rank, "rank")
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    found = [(path, node) for path, node in _linears(model, nnx.Linear) if where is None or where(dotted(path))]
    if not found:
        raise ValueError(f"add_lora: no nnx.Linear in {type(model).__name__} matched where=; the Linear layers are "
                         f"{[dotted(p) for p, _ in _linears(model, nnx.Linear)][:10]}")
    for path, linear in found:
        lora = nnx.LoRALinear(linear.in_features, linear.out_features, lora_rank=rank, use_bias=linear.use_bias,
                              dtype=linear.dtype, param_dtype=linear.param_dtype, rngs=rngs)
        lora.kernel.set_value(linear.kernel.get_value())
        if linear.use_bias:
            lora.bias.set_value(linear.bias.get_value())
        _replace(model, path, lora)
    return sorted(dotted(path) for path, _ in found)


def merge_lora(model: nnx.Module) -> list[str]:
    """Replaces each `nnx.LoRALinear` by an `nnx.Linear` with `kernel + lora_a @ lora_b`; returns their paths."""
    found = _linears(model, nnx.LoRALinear)
    for path, layer in found:
        merged = nnx.Linear(layer.in_features, layer.out_features, use_bias=layer.use_bias, dtype=layer.dtype,
                            param_dtype=layer.param_dtype, rngs=nnx.Rngs(0))
        delta = jnp.matmul(layer.lora.lora_a.get_value(), layer.lora.lora_b.get_value())
        merged.kernel.set_value((layer.kernel.get_value() + delta).astype(layer.kernel.dtype))
        if layer.use_bias:
            merged.bias.set_value(layer.bias.get_value())
        _replace(model, path, merged)
    return sorted(dotted(path) for path, _ in found)


def lora_optimizer(model: nnx.Module, tx: optax.GradientTransformation) -> nnx.Optimizer:
    """An `nnx.Optimizer` over the model's `nnx.LoRAParam`s only (pass it to `Trainer`)."""
    if not any(isinstance(v, nnx.LoRAParam) for _, v in nnx.iter_graph(model)):
        raise ValueError(f"lora_optimizer: {type(model).__name__} has no nnx.LoRAParam; call add_lora(model, rank) "
                         "first")
    return nnx.Optimizer(model, tx, wrt=nnx.LoRAParam)
