"""Which parameters a fine-tune trains, and at what rate: by dotted state path.

* A *linear probe* freezes the backbone: `probe_optimizer(model, tx, head=("fc.",))` builds the
  `nnx.Optimizer` over the `nnx.Param`s under the head's path prefixes only, so the backbone gets
  no update and no optimizer state.
* *Discriminative learning rates* train each part at its own rate: `discriminative(("stages.0.",
  optax.adam(1e-5)), ("fc.", optax.adam(1e-3)), default=optax.adam(1e-4))` is one
  `optax.multi_transform` whose rule for a parameter is the first prefix its path starts with.
* `FinetuneConfig` + `prepare_finetune` put the whole set-up in one value, the form a
  configuration file's `[trainer.finetune]` table takes: where the starting weights come from,
  which parts are loaded (`include` / `exclude`), and how it trains (`mode` full, probe or lora).

Example:

    config = FinetuneConfig(weights="resnet18.safetensors", layout="resnet", exclude=("fc.",),
                            mode="lora", lora_rank=8, lora_where=("layer4.",), head=("fc.",))
    optimizer, report = prepare_finetune(model, optax.adam(1e-3), config)
    trainer = Trainer(model, optimizer, pipeline, loss_fn)
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from datarax.config.schema import FieldError
from datarax.core.checks import is_int, is_number
from datarax.core.errors import DataraxWarning
from datarax.train.pretrained.lora import KINDS, add_lora, lora_optimizer, lora_targets
from datarax.train.pretrained.tables import KeyMap, LayoutError, dotted, load_table, path_prefixes, selected


def probe_optimizer(model: nnx.Module, tx: optax.GradientTransformation, *, head: Iterable[str]) -> nnx.Optimizer:
    """An `nnx.Optimizer` over the `nnx.Param`s under the `head` path prefixes only (a frozen backbone)."""
    head = tuple(head)
    params = [dotted(p) for p, v in nnx.iter_graph(model) if isinstance(v, nnx.Param)]
    selected = [p for p in params if p.startswith(head)] if head and all(isinstance(h, str) for h in head) else []
    if not selected:
        raise ValueError(f"probe_optimizer: head={head!r} selects no nnx.Param of {type(model).__name__}; its "
                         f"parameters start with {sorted({p.split('.')[0] for p in params})}")
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


MODES = ("full", "probe", "lora")
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt")


def _layouts() -> dict[str, tuple[type, Callable[[nnx.Module], Iterable[KeyMap]], tuple[str, ...]]]:
    """The named key tables: `name -> (model class, its table, checkpoint keys ignored by default)`."""
    from datarax.train.pretrained.bert import BertEncoder, bert_table
    from datarax.train.pretrained.crepe import Crepe, crepe_table
    from datarax.train.pretrained.resnet import ResNet, resnet_table

    running = ("*.num_batches_tracked",)  # PyTorch's BatchNorm counter: no NNX counterpart
    return {"crepe": (Crepe, lambda model: crepe_table(model.capacity), running),
            "resnet": (ResNet, resnet_table, running), "bert": (BertEncoder, bert_table, ())}


LAYOUTS = ("crepe", "resnet", "bert")


def _prefixes(name: str, value: Any) -> tuple[str, ...]:
    value = (value,) if isinstance(value, str) else value
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) and p for p in value):
        raise FieldError(name, f"must be a list of dotted path prefixes, e.g. [\"fc.\"], got {value!r}")
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class FinetuneConfig:
    """Where a fine-tune's weights come from and what it trains (`[trainer.finetune]` in a file).

    Attributes:
        weights: a `.safetensors` or `.pth` file loaded through the `layout` key table (relative to
            `prepare_finetune`'s `base_dir`).
        layout: "crepe", "resnet" or "bert", or a function `model -> KeyMaps`.
        ignore: checkpoint key globs with no counterpart in the model (added to the layout's own).
        warm_start: instead of weights, a datarax checkpoint directory whose model weights are copied
            where paths and shapes agree (`warm_start`).
        step: with `warm_start`, the checkpoint step (None: the newest).
        strict: with `warm_start`, refuse a missing, unexpected or mismatched entry (default true).
        include / exclude: the model's dotted path prefixes loaded / not loaded (a new head: `["fc."]`).
        mode: "full", "probe" (only `head` trains) or "lora" (adapters on `lora_where`, plus `head`).
        head: the dotted path prefixes of the new head.
        backbone_lr_factor: mode "full": everything outside `head` learns at this factor of the rate.
        lora_rank: the adapters' rank (mode "lora").
        lora_where: the dotted path prefixes of the layers given adapters (empty: every layer of `lora_kinds`).
        lora_kinds: "linear" (the default) and/or "conv".
    """

    weights: str | None = None
    layout: Any = None
    ignore: tuple[str, ...] = ()
    warm_start: str | None = None
    step: int | None = None
    strict: bool | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    mode: str = "full"
    head: tuple[str, ...] = ()
    backbone_lr_factor: float | None = None
    lora_rank: int | None = None
    lora_where: tuple[str, ...] = ()
    lora_kinds: tuple[str, ...] = ("linear",)

    def __post_init__(self):
        for name in ("ignore", "include", "exclude", "head", "lora_where", "lora_kinds"):
            object.__setattr__(self, name, _prefixes(name, getattr(self, name)))
        if self.weights is not None and self.warm_start is not None:
            raise FieldError("warm_start", "give weights (a .safetensors/.pth file) or warm_start (a datarax "
                                           "checkpoint directory), not both")
        if self.weights is not None:
            if not isinstance(self.weights, (str, os.PathLike)) or not str(self.weights).endswith(WEIGHT_SUFFIXES):
                raise FieldError("weights", f"must be a file ending in {WEIGHT_SUFFIXES}, got {self.weights!r}")
            if self.layout is None:
                raise FieldError("layout", f"is needed with weights: the key table, one of {LAYOUTS} or an import "
                                           "path of a function model -> KeyMaps")
        elif self.layout is not None or self.ignore:
            raise FieldError("layout" if self.layout is not None else "ignore",
                             "applies to weights only (a .safetensors/.pth file); add weights or drop it")
        if self.layout is not None and not callable(self.layout) and self.layout not in LAYOUTS:
            raise FieldError("layout", f"must be one of {LAYOUTS} or a function model -> KeyMaps, got {self.layout!r}")
        if self.warm_start is None and (self.step is not None or self.strict is not None):
            raise FieldError("step" if self.step is not None else "strict",
                             "applies to warm_start only (a datarax checkpoint directory); add warm_start or drop it")
        if self.step is not None and not (is_int(self.step) and self.step >= 0):
            raise FieldError("step", f"must be an integer >= 0, got {self.step!r}")
        if self.strict is not None and not isinstance(self.strict, bool):
            raise FieldError("strict", f"must be true or false, got {self.strict!r}")
        if (self.include or self.exclude) and self.weights is None and self.warm_start is None:
            raise FieldError("include" if self.include else "exclude",
                             "selects what weights or warm_start load; add one of them or drop it")
        if self.mode not in MODES:
            raise FieldError("mode", f"must be one of {MODES}, got {self.mode!r}")
        if self.mode == "probe" and not self.head:
            raise FieldError("head", 'is needed with mode = "probe": the path prefixes that train, e.g. ["fc."]')
        if self.mode == "lora":
            if self.lora_rank is None:
                raise FieldError("lora_rank", 'is needed with mode = "lora", e.g. 8')
            if not is_int(self.lora_rank) or self.lora_rank < 1:
                raise FieldError("lora_rank", f"must be an integer >= 1, got {self.lora_rank!r}")
        elif self.lora_rank is not None or self.lora_where or self.lora_kinds != ("linear",):
            name = "lora_rank" if self.lora_rank is not None else "lora_where" if self.lora_where else "lora_kinds"
            raise FieldError(name, f'applies to mode = "lora" only, got mode = {self.mode!r}')

        if not self.lora_kinds or any(k not in KINDS for k in self.lora_kinds):
            raise FieldError("lora_kinds", f"must name layer kinds among {tuple(KINDS)}, got {list(self.lora_kinds)!r}")
        if self.backbone_lr_factor is not None:
            if self.mode != "full":
                raise FieldError("backbone_lr_factor", f'applies to mode = "full" only, got mode = {self.mode!r} '
                                                       "(probe and lora freeze the backbone)")
            factor = self.backbone_lr_factor
            if not (is_number(factor) and factor > 0):
                raise FieldError("backbone_lr_factor", f"must be a number > 0, e.g. 0.1, got {factor!r}")
            if not self.head:
                raise FieldError("head", "is needed with backbone_lr_factor: the path prefixes that learn at the "
                                         'full rate, e.g. ["fc."]')


class FinetuneWarning(DataraxWarning):
    """A fine-tune that runs but does not train what its configuration suggests (LoRA adapters only
    on the new head: a probe in disguise)."""


def _lora_where(config: FinetuneConfig) -> Any:
    return (lambda path: selected(path, config.lora_where, ())) if config.lora_where else None


def _check_adapters(model: nnx.Module, config: FinetuneConfig) -> list[str]:
    """The layers LoRA adapts; warns (`FinetuneWarning`) when every one is in the new head (the
    `head` prefixes, or the layers `exclude` leaves out of the load): the backbone then trains
    nothing, which is a probe, not a LoRA fine-tune."""

    targets = lora_targets(model, where=_lora_where(config), kinds=config.lora_kinds)
    new = (*config.head, *config.exclude)
    if new and all(selected(f"{path}.kernel", new, ()) for path in targets):  # prefixes name parameters
        warnings.warn(f"every LoRA adapter sits in the new head ({', '.join(targets)}): the pretrained backbone "
                      f"trains nothing, so this is a probe in disguise. Put adapters on the backbone: lora_kinds = "
                      '["linear", "conv"] for a convolutional one, or lora_where = [...] naming its layers '
                      f"(the layers of kinds {list(config.lora_kinds)} are {targets})", FinetuneWarning, stacklevel=3)
    return targets


def finetune_summary(report: dict[str, Any]) -> str:
    """One line of what `prepare_finetune` did (its `report`), for a log or a terminal."""
    parts = [f"mode {report['mode']}"]
    if "loaded" in report:
        skipped = report.get("skipped", [])
        parts.append(f"{len(report['loaded'])} keys loaded from {report['source']}"
                     + (f", {len(skipped)} skipped ({', '.join(skipped[:6])}{', ...' if len(skipped) > 6 else ''})"
                        if skipped else ""))
    elif "restored" in report:
        left = {k: report.get(k, []) for k in ("missing", "unexpected", "mismatched")}
        parts.append(f"{len(report['restored'])} entries restored from {report['source']}"
                     + "".join(f", {len(v)} {k}" for k, v in left.items() if v))
    if "lora" in report:
        parts.append(f"LoRA adapters on {len(report['lora'])} layer(s): {', '.join(report['lora'])}")
    parts.append(f"{report['trained']:,} parameters train, {report['frozen']:,} frozen")
    return "; ".join(parts)


def read_weights(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """`{key: array}` of a `.safetensors` file or a PyTorch `.pth` / `.pt` state dict (no torch needed)."""
    from datarax.train.pretrained.safetensors import load_safetensors
    from datarax.train.pretrained.torch_pickle import read_pth

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pretrained weights {path} do not exist (a .safetensors or .pth file)")
    return load_safetensors(path) if path.suffix == ".safetensors" else read_pth(path)


def _table(model: nnx.Module, config: FinetuneConfig) -> tuple[tuple[KeyMap, ...], tuple[str, ...]]:
    if callable(config.layout):
        return tuple(config.layout(model)), config.ignore
    cls, make, ignore = _layouts()[config.layout]
    if not isinstance(model, cls):
        raise FieldError("layout", f"= {config.layout!r} is the table of datarax.train.pretrained.{cls.__name__}, but "
                                   f"the model is a {type(model).__name__}: name your own table function "
                                   "('package.module:function', model -> KeyMaps)")
    return tuple(make(model)), (*ignore, *config.ignore)


def _check_selects(model: nnx.Module, name: str, prefixes: tuple[str, ...], kind: type = nnx.Param) -> None:
    paths = [dotted(p) for p, v in nnx.iter_graph(model) if isinstance(v, kind)]
    if not any(selected(p, prefixes, ()) for p in paths):
        roots = sorted({p.split(".")[0] + "." for p in paths})
        raise FieldError(name, f"= {list(prefixes)!r} selects no parameter of {type(model).__name__}; its parameters "
                               f"start with {roots}")


def _resolve(path: str | os.PathLike, base_dir: str | os.PathLike | None) -> Path:
    path = Path(os.path.expanduser(str(path)))
    return path if path.is_absolute() or base_dir is None else Path(base_dir) / path


def check_finetune(model: nnx.Module, config: FinetuneConfig, *, base_dir: str | os.PathLike | None = None) -> None:
    """Every check `prepare_finetune` makes, writing nothing (`model` may be an `nnx.eval_shape` one).

    Raises:
        FieldError: naming the `FinetuneConfig` field: a file that does not fit the model through
            its table, a checkpoint directory with no step, prefixes that select nothing.
    """
    if config.weights is not None:
        path = _resolve(config.weights, base_dir)
        try:
            tensors = read_weights(path)
            table, ignore = _table(model, config)
            load_table(model, tensors, table, ignore=ignore, source=str(path), include=config.include,
                       exclude=config.exclude, check_only=True)
        except FieldError:
            raise
        except LayoutError as exc:
            raise FieldError("weights", f"{exc}. Leave a new head out of the load with exclude = [\"fc.\"] (the "
                                        "model's dotted path prefixes), or checkpoint keys with ignore = "
                                        "[\"classifier.*\"]") from exc
        except (OSError, ValueError, TypeError) as exc:
            raise FieldError("weights", str(exc)) from exc
    if config.warm_start is not None:
        directory = _resolve(config.warm_start, base_dir)
        steps = sorted(p.name for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []
        if not steps:
            raise FieldError("warm_start", f"{directory} holds no checkpoint step (a CheckpointCallback directory)")
        if config.step is not None and str(config.step) not in steps:
            raise FieldError("step", f"= {config.step}: {directory} holds steps {steps}")
    if config.head:
        _check_selects(model, "head", config.head)
    if config.lora_where:
        _check_selects(model, "lora_where", config.lora_where)
    if config.mode == "lora":
        try:
            _check_adapters(model, config)
        except ValueError as exc:  # no layer of lora_kinds (at lora_where)
            raise FieldError("lora_kinds" if not config.lora_where else "lora_where", str(exc)) from exc


def prepare_finetune(model: nnx.Module, tx: optax.GradientTransformation, config: FinetuneConfig, *,
                     base_dir: str | os.PathLike | None = None) -> tuple[Any, dict[str, Any]]:
    """Loads the starting weights into `model`, sets it up for `config.mode` and builds the optimizer.

    Args:
        model: the model to fine-tune (changed in place: weights loaded, LoRA layers swapped in).
        tx: the optimizer's transformation (the head's rate; everything's in plain "full" mode).
        config: what to load and train.
        base_dir: where relative `weights` / `warm_start` paths are taken from.

    Returns:
        `(optimizer, report)`: what to pass to `Trainer` as its optimizer (an optax transformation for
        "full", an `nnx.Optimizer` over the trained variables otherwise) and a dict of what was loaded
        and trained: `restored`, `missing`, `unexpected`, `mismatched` for a warm start, `loaded` and
        `skipped` paths for weights, `lora` layers, `trained` and `frozen` parameter counts
        (`finetune_summary(report)` words it in one line). Warns (`FinetuneWarning`) when every LoRA
        adapter sits in the new head: the backbone then trains nothing, a probe in disguise.
    """
    with warnings.catch_warnings():  # the adapters are checked once more below, on the real model
        warnings.simplefilter("ignore", FinetuneWarning)
        check_finetune(model, config, base_dir=base_dir)
    report: dict[str, Any] = {"mode": config.mode}
    if config.weights is not None:
        path = _resolve(config.weights, base_dir)
        table, ignore = _table(model, config)
        load_table(model, read_weights(path), table, ignore=ignore, source=str(path), include=config.include,
                   exclude=config.exclude)
        report |= {"source": str(path), "loaded": sorted(m.path for m in table
                                                         if selected(m.path, config.include, config.exclude)),
                   "skipped": sorted(m.path for m in table if not selected(m.path, config.include, config.exclude))}
    elif config.warm_start is not None:
        from datarax.train.pretrained.warm_start import warm_start

        directory = _resolve(config.warm_start, base_dir)
        done = warm_start(model, directory, step=config.step, include=config.include, exclude=config.exclude,
                          strict=True if config.strict is None else config.strict)
        report |= {"source": str(directory)} | dataclasses.asdict(done)
    if config.mode == "full":
        optimizer: Any = tx
        trained: Any = nnx.Param
        if config.backbone_lr_factor is not None:
            optimizer = discriminative(*((h, tx) for h in config.head),
                                       default=optax.chain(tx, optax.scale(config.backbone_lr_factor)))
    elif config.mode == "probe":
        optimizer = probe_optimizer(model, tx, head=config.head)
        trained = nnx.All(nnx.Param, path_prefixes(*config.head))
    else:

        _check_adapters(model, config)
        report["lora"] = add_lora(model, config.lora_rank, where=_lora_where(config), kinds=config.lora_kinds)
        optimizer = lora_optimizer(model, tx, head=config.head)
        trained = nnx.LoRAParam if not config.head else nnx.Any(nnx.LoRAParam,
                                                                nnx.All(nnx.Param, path_prefixes(*config.head)))
    report["trained"] = int(sum(np.size(x) for x in jax.tree_util.tree_leaves(nnx.state(model, trained))))
    total = int(sum(np.size(x) for x in jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))))
    report["frozen"] = total - report["trained"]
    return optimizer, report
