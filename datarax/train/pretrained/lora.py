"""LoRA fine-tuning of `nnx.Linear` and `nnx.Conv` layers: add adapters, train only them, merge them back.

`add_lora` swaps chosen `nnx.Linear` layers for flax's `nnx.LoRALinear` (and, with `kinds=("conv",)`,
chosen `nnx.Conv` layers for `LoRAConv`) holding the same `kernel` and `bias`, so the base weights
keep their state paths and the key tables still apply, plus a rank-r pair `lora.lora_a`
`(fan_in, r)` / `lora.lora_b` `(r, out)` of `nnx.LoRAParam`s, `lora_b` zero so the model starts
exactly where it was. A convolution's kernel `(*k, in, out)` is seen as a `(prod(k) * in, out)`
matrix and the layer convolves with `kernel + (lora_a @ lora_b).reshape(kernel.shape)` (one
convolution per call). `lora_optimizer` builds the `nnx.Optimizer` over the adapters only (plus,
with `head=`, the plain parameters under those path prefixes); `merge_lora` folds the update back
into plain layers, the form to export:

    add_lora(model, rank=8, where=lambda path: path.startswith("layers."))
    trainer = Trainer(model, lora_optimizer(model, optax.adam(1e-3)), pipeline, loss_fn)
    trainer.fit(num_steps=500)
    merge_lora(model)
    save_safetensors(export_table(model, bert_table(model)), "merged.safetensors")
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from datarax.core.checks import check_positive_int
from datarax.train.pretrained.tables import dotted, path_prefixes

KINDS = {"linear": nnx.Linear, "conv": nnx.Conv}


class _MergedKernel:
    """`layer` as `nnx.Conv.__call__` reads it, with `kernel` replaced by an array (the merged kernel).

    Calling flax's own `nnx.Conv.__call__` on this view keeps every convolution option it supports
    (padding modes, dilation, groups, mask, dtype promotion) without a copy of its code.
    """

    def __init__(self, layer: nnx.Conv, kernel: jax.Array):
        self._layer = layer
        self.kernel = kernel

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)


class LoRAConv(nnx.Conv):
    """An `nnx.Conv` whose kernel gets a trainable low-rank update: `kernel + (lora_a @ lora_b).reshape(kernel.shape)`.

    The state is an `nnx.Conv`'s (`kernel`, `bias`, same paths) plus `lora.lora_a`
    `(prod(kernel_size) * in_features // feature_group_count, lora_rank)` and `lora.lora_b`
    `(lora_rank, out_features)`, both `nnx.LoRAParam` (`lora_b` starts at zero). Takes
    `nnx.Conv`'s arguments plus `lora_rank`.

    Example:
        >>> layer = LoRAConv(3, 8, (5,), lora_rank=2, rngs=nnx.Rngs(0))
        >>> layer(np.ones((1, 16, 3), np.float32)).shape
        (1, 16, 8)
    """

    def __init__(self, in_features: int, out_features: int, kernel_size: int | tuple[int, ...],
                 strides: int | tuple[int, ...] | None = 1, *, lora_rank: int, rngs: nnx.Rngs, **kwargs: Any):
        check_positive_int(lora_rank, "lora_rank")
        super().__init__(in_features, out_features, kernel_size, strides, rngs=rngs, **kwargs)
        fan_in = int(np.prod(self.kernel_shape[:-1]))
        self.lora = nnx.LoRA(fan_in, lora_rank, out_features, param_dtype=self.param_dtype, rngs=rngs)

    def merged_kernel(self) -> jax.Array:
        """`kernel + (lora_a @ lora_b).reshape(kernel.shape)`, in the kernel's dtype."""
        kernel = self.kernel[...]
        delta = (self.lora.lora_a[...] @ self.lora.lora_b[...]).reshape(kernel.shape)
        return (kernel + delta).astype(kernel.dtype)

    def __call__(self, inputs: jax.Array, out_sharding: Any = None) -> jax.Array:
        return nnx.Conv.__call__(_MergedKernel(self, self.merged_kernel()), inputs, out_sharding=out_sharding)


def _layers(model: nnx.Module, kind: type) -> list[tuple[tuple, nnx.Module]]:
    return [(path, node) for path, node in nnx.iter_graph(model) if type(node) is kind and path]


def _replace(model: nnx.Module, path: tuple, new: nnx.Module) -> None:
    parent = model
    for part in path[:-1]:
        parent = parent[part] if isinstance(part, int) else getattr(parent, part)
    if isinstance(path[-1], int):
        parent[path[-1]] = new
    else:
        setattr(parent, path[-1], new)


def _conv_settings(conv: nnx.Conv) -> dict[str, Any]:
    """The constructor arguments that rebuild `conv` (its weights aside)."""
    return {name: getattr(conv, name) for name in (
        "padding", "input_dilation", "kernel_dilation", "feature_group_count", "use_bias", "mask", "dtype",
        "param_dtype", "precision", "conv_general_dilated", "promote_dtype", "preferred_element_type")}


def _lora_layer(layer: nnx.Module, rank: int, rngs: nnx.Rngs) -> nnx.Module:
    if isinstance(layer, nnx.Conv):
        return LoRAConv(layer.in_features, layer.out_features, layer.kernel_size, layer.strides, lora_rank=rank,
                        rngs=rngs, **_conv_settings(layer))
    return nnx.LoRALinear(layer.in_features, layer.out_features, lora_rank=rank, use_bias=layer.use_bias,
                          dtype=layer.dtype, param_dtype=layer.param_dtype, rngs=rngs)


def add_lora(model: nnx.Module, rank: int, *, where: Callable[[str], bool] | None = None,
             rngs: nnx.Rngs | None = None, kinds: Iterable[str] = ("linear",)) -> list[str]:
    """Adds rank-`rank` adapters to the layers of the chosen `kinds` whose dotted path passes `where`.

    Args:
        model: the module to change in place.
        rank: the adapters' rank.
        where: a test on a layer's dotted path (None: every layer of the chosen kinds).
        rngs: the keys of `lora_a`'s initialisation (None: `nnx.Rngs(0)`).
        kinds: which layers: "linear" (`nnx.Linear` -> `nnx.LoRALinear`) and/or "conv"
            (`nnx.Conv` -> `LoRAConv`).

    Returns the replaced paths, sorted. Raises ValueError when none matched (a `where` that
    selects nothing would otherwise train nothing).
    """
    check_positive_int(rank, "rank")
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    found = _targets(model, where, kinds)
    for path, layer in found:
        lora = _lora_layer(layer, rank, rngs)
        lora.kernel.set_value(layer.kernel.get_value())
        if layer.use_bias:
            lora.bias.set_value(layer.bias.get_value())
        _replace(model, path, lora)
    return sorted(dotted(path) for path, _ in found)


def lora_targets(model: nnx.Module, *, where: Callable[[str], bool] | None = None,
                 kinds: Iterable[str] = ("linear",)) -> list[str]:
    """The dotted paths of the layers `add_lora` would give adapters (sorted), changing nothing;
    `model` may be abstract (`nnx.eval_shape`)."""
    return sorted(dotted(path) for path, _ in _targets(model, where, kinds))


def _targets(model: nnx.Module, where: Callable[[str], bool] | None, kinds: Iterable[str]) -> list[tuple]:
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"add_lora: kinds must name layers among {tuple(KINDS)}, got {kinds!r}; e.g. "
                         "kinds=('conv',) for a convolutional backbone")
    candidates = [pair for kind in kinds for pair in _layers(model, KINDS[kind])]
    found = [(path, node) for path, node in candidates if where is None or where(dotted(path))]
    if not found:
        names = " / ".join(f"nnx.{KINDS[k].__name__}" for k in kinds)
        raise ValueError(f"add_lora: no {names} in {type(model).__name__} matched where=; its layers of those kinds "
                         f"are {[dotted(p) for p, _ in candidates][:10]}")
    return found


def merge_lora(model: nnx.Module) -> list[str]:
    """Replaces each `nnx.LoRALinear` / `LoRAConv` by a plain `nnx.Linear` / `nnx.Conv` holding the
    updated kernel (`kernel + lora_a @ lora_b`, reshaped for a convolution); returns their paths."""
    found = _layers(model, nnx.LoRALinear) + _layers(model, LoRAConv)
    for path, layer in found:
        if isinstance(layer, LoRAConv):
            merged = nnx.Conv(layer.in_features, layer.out_features, layer.kernel_size, layer.strides,
                              rngs=nnx.Rngs(0), **_conv_settings(layer))
            kernel = layer.merged_kernel()
        else:
            merged = nnx.Linear(layer.in_features, layer.out_features, use_bias=layer.use_bias, dtype=layer.dtype,
                                param_dtype=layer.param_dtype, rngs=nnx.Rngs(0))
            delta = layer.lora.lora_a.get_value() @ layer.lora.lora_b.get_value()
            kernel = (layer.kernel.get_value() + delta).astype(layer.kernel.dtype)
        merged.kernel.set_value(kernel)
        if layer.use_bias:
            merged.bias.set_value(layer.bias.get_value())
        _replace(model, path, merged)
    return sorted(dotted(path) for path, _ in found)


def lora_optimizer(model: nnx.Module, tx: optax.GradientTransformation, *, head: Iterable[str] = ()
                   ) -> nnx.Optimizer:
    """An `nnx.Optimizer` over the model's `nnx.LoRAParam`s only, or with `head=("head.",)` also over
    the parameters under those dotted path prefixes (a new task head trained with the adapters).
    Pass it to `Trainer`."""
    if not any(isinstance(v, nnx.LoRAParam) for _, v in nnx.iter_graph(model)):
        raise ValueError(f"lora_optimizer: {type(model).__name__} has no nnx.LoRAParam; call add_lora(model, rank) "
                         "first")
    head = (head,) if isinstance(head, str) else tuple(head)
    if not head:
        return nnx.Optimizer(model, tx, wrt=nnx.LoRAParam)
    selected = [p for p, v in nnx.iter_graph(model) if isinstance(v, nnx.Param) and not isinstance(v, nnx.LoRAParam)
                and dotted(p).startswith(head)]
    if not selected:
        raise ValueError(f"lora_optimizer: head={head!r} selects no nnx.Param of {type(model).__name__}; pass the "
                         "dotted path prefix of the new head, e.g. head=('head.',)")
    return nnx.Optimizer(model, tx, wrt=nnx.Any(nnx.LoRAParam, nnx.All(nnx.Param, path_prefixes(*head))))
