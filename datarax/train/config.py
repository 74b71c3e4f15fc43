"""The `[trainer]` table of a configuration file: its schema and the `Trainer` it builds.

The configuration layer (`datarax.config`) validates and builds pipelines and knows nothing of the
kit; importing this module registers the `[trainer]` table and the `callback` component kind with
it. `load_trainer(path)` reads a file and builds both pipeline and trainer:

    run = load_trainer("experiment.toml")
    result = run.fit()
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from datarax.checkpoint.policies import check_best, check_max_to_keep, resolve_on_damaged
from datarax.config.build import build_component, build_pipeline, load_spec, takes_argument
from datarax.config.components import ComponentSpec, Context, component
from datarax.config.files import first_line
from datarax.config.registry import Kind, register_kind
from datarax.config.schema import (
    ConfigError,
    FieldError,
    Path,
    Unconvertible,
    build_dataclass,
    check_keys,
    convert,
    field_checked,
    is_table,
    suggestion,
    type_hints,
)
from datarax.config.spec import RunSpec, check_positive, register_section
from datarax.core.checks import is_int
from datarax.monitoring.writers import JsonlWriter
from datarax.train.callbacks import CheckpointCallback, ProfilerConfig, StepGuard, StepGuardConfig
from datarax.train.checkpointing.run_config import NOT_FINGERPRINTED
from datarax.train.loop.compile_cache import default_cache_dir, use_compilation_cache
from datarax.train.loop.settings import check_settings
from datarax.train.loop.trainer import Trainer
from datarax.train.metrics.writers import TensorBoardWriter, WandbWriterConfig

CALLBACK_KIND = Kind("callback", ("datarax.train.callbacks",), "datarax.train.callbacks.base:Callback", ("Callback",))


@dataclasses.dataclass(frozen=True)
class TrainerSection:
    """`[trainer]`: a `datarax.train.Trainer` run (docs/config.md has an annotated table).

    Keys that are `Trainer` arguments (`accumulate_steps`, `ema_decay`, `precision`,
    `param_sharding`, `allow_config_change`, `compilation_cache`, `train_pipeline_params`) mean
    what they mean there; `max_to_keep`, `keep_best`, `best_metric`, `best_mode` and `on_damaged`
    are `CheckpointCallback`'s. A `[trainer.finetune]` sub-table is a
    `datarax.train.pretrained.FinetuneConfig`: its files are read at every start, and a resumed run
    restores its own checkpoint over them. A `[trainer.guard]` sub-table is a
    `datarax.train.callbacks.StepGuardConfig` (`action = "skip"`, `spike = 10.0`, ...): every configured
    run has a `StepGuard` writing into `<run_dir>/incidents` unless `guard = false` (or its callbacks
    list one). A `[trainer.marglik]` sub-table learns the pipeline's
    augmentation by marginal likelihood (docs/invariance.md): its `copies`, `field`,
    `prior_precision`, `prior` and `copies_per_call` build a `datarax.train.invariance.InvariantModel` over the model
    (which then reads untransformed batches, `loss` calling `model(batch)`, and gets the prior's
    penalty added), the other keys are a `MarginalLikelihoodConfig`. Import paths name only
    modules the configuration allows (`datarax.config.allow`).

    Attributes:
        model: import path of a function or class returning the `nnx.Module` to train; it gets
            `model_args` and, if it takes one, `rngs=nnx.Rngs(seed)`.
        loss: import path of `loss_fn(model, batch) -> loss` or `(loss, aux)`.
        optimizer: `{adam = {learning_rate = 1e-3}}` (any optax function by name), an array of such
            tables (chained with `optax.chain`), or an import path of a function returning one.
        steps: train to this many total steps (give exactly one of `steps` and `epochs`).
        epochs: train to this many total epochs.
        metrics: `{name: import path}` of metric functions or `Metric`s.
        checkpoint_dir: checkpoint here, and resume from the newest checkpoint on restart.
        run_dir: where `datarax train` writes metrics.jsonl, goodput.json/png and result.json;
            default `runs/<config file name>` beside the configuration file.
        checkpoint_every: save every N steps (a final save always happens).
        eval_every_steps: evaluate the `[eval]` pipeline every N steps; with an `[eval]` table and
            no interval, once, at the target step.
        callbacks: component tables of `datarax.train.callbacks` classes by name
            (`{ goodput = {} }`) or import paths.
        trainer_class: import path of a `datarax.train.Trainer` subclass to build instead.
        compilation_cache: true (default: `<run_dir>/jax_cache`, or `$DATARAX_COMPILATION_CACHE`),
            a directory relative to the file, or false (JAX's own setting is left alone).
    """

    model: Callable
    loss: Callable
    optimizer: Any
    steps: int | None = None
    epochs: int | None = None
    model_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Callable] = dataclasses.field(default_factory=dict)
    checkpoint_dir: str | None = None
    run_dir: str | None = None
    checkpoint_every: int | None = None
    eval_every_steps: int | None = None
    max_to_keep: int = 3
    train_pipeline_params: bool = False
    callbacks: list[Any] = dataclasses.field(default_factory=list)
    trainer_class: Callable | None = None
    compilation_cache: bool | str = True
    on_damaged: str | None = None
    allow_config_change: bool = False
    accumulate_steps: int = 1
    ema_decay: float | None = None
    precision: str = "f32"
    keep_best: int | None = None
    best_metric: str | None = None
    best_mode: str = "min"
    param_sharding: str | None = None

    def __post_init__(self):
        if (self.steps is None) == (self.epochs is None):
            raise FieldError("steps", f"give exactly one of steps or epochs, got steps={self.steps!r}, "
                                      f"epochs={self.epochs!r}")
        check_positive("steps", self.steps, 0)
        check_positive("epochs", self.epochs, 0)
        check_positive("checkpoint_every", self.checkpoint_every)
        check_positive("eval_every_steps", self.eval_every_steps)
        field_checked(check_max_to_keep, max_to_keep=self.max_to_keep)
        if self.on_damaged is not None:
            field_checked(resolve_on_damaged, on_damaged=self.on_damaged)
        field_checked(check_settings, allow_config_change=self.allow_config_change,
                      accumulate_steps=self.accumulate_steps, ema_decay=self.ema_decay, precision=self.precision,
                      param_sharding=self.param_sharding)
        field_checked(check_best, keep_best=self.keep_best, best_metric=self.best_metric, best_mode=self.best_mode)
        if self.keep_best is not None and self.checkpoint_dir is None:
            raise FieldError("keep_best", "needs checkpoint_dir (the directory the best checkpoints are kept in)")


@dataclasses.dataclass
class TrainerSpec:
    section: TrainerSection
    optimizer: list[tuple[str, Callable, dict[str, Any]]] | Callable
    callbacks: list[ComponentSpec]
    table: dict[str, Any] = dataclasses.field(default_factory=dict)  # the [trainer] table as written
    finetune: Any = None  # datarax.train.pretrained.FinetuneConfig from [trainer.finetune]
    guard: StepGuardConfig | None = None  # [trainer.guard]; None: no guard (guard = false)
    marglik: Any = None  # (InvariantModel settings, MarginalLikelihoodConfig) from [trainer.marglik]


def _validate_optimizer(value: Any, path: Path, ctx: Context):
    import optax  # a core dependency, only needed when a trainer is configured

    if isinstance(value, str):
        return ctx.resolve_callable(value, path, ctx.problems)
    tables = value if isinstance(value, list) else [value]
    chain = []
    public = [n for n in dir(optax) if not n.startswith("_") and callable(getattr(optax, n))]
    for i, table in enumerate(tables):
        here = (*path, i) if isinstance(value, list) else path
        if not is_table(table) or len(table) != 1:
            ctx.problems.add(here, "must be a table naming one optax function, e.g. { adam = { learning_rate = "
                                   f"1e-3 }} }}, or an import path 'package.module:function'; got {table!r}")
            continue
        (name, kwargs), = table.items()
        if name not in public:
            ctx.problems.add((*here, name), f"is not an optax function{suggestion(name, public)}")
            continue
        if not is_table(kwargs):
            ctx.problems.add((*here, name), f"must be a table of keyword arguments, got {kwargs!r}")
            continue
        chain.append((name, getattr(optax, name), convert_kwargs(getattr(optax, name), kwargs, (*here, name), ctx,
                                                                  f"argument of optax.{name}")))
    return chain


def convert_kwargs(fn: Callable, kwargs: dict[str, Any], path: Path, ctx: Context, what: str) -> dict[str, Any]:
    """`kwargs` for `fn`, each key checked against its signature and each value converted by its
    type hint (the function's own schema: a string where optax wants a number is an error here, not
    an error in the first optimizer step). Strings with a ':' may name a callable (a schedule)."""
    def import_path(value: str, where: Path, problems: Any) -> Any:
        if ":" not in value:
            raise Unconvertible  # so the union reports the number it wanted, not an import failure
        return ctx.resolve_callable(value, where, problems)

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check against
        return dict(kwargs)
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        check_keys(kwargs, [n for n in params if n != "self"], path, ctx.problems, what=what)
    hints = type_hints(fn.__init__ if isinstance(fn, type) else fn)
    return {key: convert(value, hints.get(key, Any), (*path, key), ctx.problems, resolve_callable=import_path)
            if key in params else value for key, value in kwargs.items()}


def validate_trainer(value: Any, ctx: Context) -> TrainerSpec | None:
    """Validates a `[trainer]` table (registered with `datarax.config` when this module is imported)."""
    path = ("trainer",)
    if not is_table(value):
        ctx.problems.add(path, f"must be a table, got {value!r}")
        return None
    section = build_dataclass(TrainerSection, value, path, ctx.problems, resolve_callable=ctx.resolve_callable,
                              extra_keys=("finetune", "guard", "marglik"))
    guard = _validate_guard(value.get("guard", True), (*path, "guard"), ctx)
    finetune = _validate_finetune(value["finetune"], (*path, "finetune"), ctx) if "finetune" in value else None
    marglik = _validate_marglik(value["marglik"], (*path, "marglik"), ctx) if "marglik" in value else None
    if marglik is not None and section is not None and section.train_pipeline_params:
        ctx.problems.add((*path, "train_pipeline_params"), "= true would train the stages' magnitudes with the "
                                                           "training loss; [trainer.marglik] learns them: drop it")
        section = None
    cls = section.trainer_class if section is not None else None
    if cls is not None and not (isinstance(cls, type) and issubclass(cls, Trainer)):
        ctx.problems.add((*path, "trainer_class"), f"names {value['trainer_class']!r}, which is not a subclass of "
                                                   "datarax.train.Trainer; it was not called")
        section = None
    optimizer = _validate_optimizer(value["optimizer"], (*path, "optimizer"), ctx) if "optimizer" in value else None
    if section is not None and section.model_args:
        model_args = convert_kwargs(section.model, section.model_args, (*path, "model_args"), ctx,
                                     f"parameter of {value.get('model')!r}")
        section = dataclasses.replace(section, model_args=model_args)
    callbacks = []
    raw = value.get("callbacks", [])
    if isinstance(raw, list):
        callbacks = [component(c, "callback", (*path, "callbacks", i), ctx) for i, c in enumerate(raw)]
        callbacks = [under_config_dir(c, ctx) for c in callbacks]
    if "eval_every_steps" in value and "eval" not in ctx.root:
        ctx.problems.add((*path, "eval_every_steps"), "needs an evaluation pipeline: add an [eval] table (its keys "
                                                      "override the training pipeline's, e.g. [eval.source.hf] with "
                                                      "files = [\"test.parquet\"]) or drop eval_every_steps")
    if section is not None and section.param_sharding is not None and "sharding" not in ctx.root:
        ctx.problems.add((*path, "param_sharding"), f"= {section.param_sharding!r} lays the training state out over "
                                                    "the pipeline's mesh: add a [sharding] table (e.g. "
                                                    "mesh_shape = [8] and axis_names = [\"data\"]) or drop "
                                                    "param_sharding")
        section = None
    batch_size = ctx.root.get("batch_size", 32)
    if section is not None and is_int(batch_size) and batch_size % section.accumulate_steps:
        ctx.problems.add((*path, "accumulate_steps"), f"= {section.accumulate_steps} must divide batch_size = "
                                                      f"{batch_size} (each step's batch is split into that many "
                                                      "equal micro-batches)")
        section = None
    if section is None or optimizer is None or ("finetune" in value and finetune is None) or guard is INVALID or (
            "marglik" in value and marglik is None):
        return None
    return TrainerSpec(section, optimizer, callbacks, dict(value), finetune, guard, marglik)


INVALID = object()


def _validate_guard(value: Any, path: Path, ctx: Context) -> Any:
    """`[trainer.guard]` as a `StepGuardConfig`; None for `guard = false`; `INVALID` after a problem."""
    if value is True:
        return StepGuardConfig()
    if value is False:
        return None
    if not is_table(value):
        ctx.problems.add(path, f"must be true, false or a table of StepGuardConfig settings (e.g. {{ action = "
                               f"\"skip\", spike = 10.0 }}), got {value!r}")
        return INVALID
    config = build_dataclass(StepGuardConfig, value, path, ctx.problems)
    return INVALID if config is None else config


INVARIANT_KEYS = ("copies", "field", "prior_precision", "prior", "copies_per_call")


def _validate_marglik(value: Any, path: Path, ctx: Context) -> Any:
    from datarax.train.invariance import MarginalLikelihoodConfig
    from datarax.train.invariance.model import check_invariance

    if not is_table(value):
        ctx.problems.add(path, f"must be a table (see docs/invariance.md), got {value!r}")
        return None
    table = dict(value)
    invariant = {"copies": 8, "field": "image", "prior_precision": 1.0, "prior": "layerwise", "copies_per_call": None}
    invariant.update({k: table.pop(k) for k in INVARIANT_KEYS if k in table})
    config = build_dataclass(MarginalLikelihoodConfig, table, path, ctx.problems, extra_keys=INVARIANT_KEYS)
    try:
        field_checked(check_invariance, **invariant)
    except FieldError as exc:
        ctx.problems.add((*path, exc.field), str(exc))
        return None
    return None if config is None else (invariant, config)


def _validate_finetune(value: Any, path: Path, ctx: Context) -> Any:
    from datarax.train.pretrained.finetune import LAYOUTS, FinetuneConfig

    if not is_table(value):
        ctx.problems.add(path, f"must be a table (see FinetuneConfig in docs/trainers.md), got {value!r}")
        return None
    table = dict(value)
    layout = table.get("layout")
    if isinstance(layout, str) and layout not in LAYOUTS:
        if ":" not in layout:
            ctx.problems.add((*path, "layout"), f"must be one of {LAYOUTS} or an import path 'package.module:function' "
                                                f"returning the key table of a model, got {layout!r}")
            return None
        table["layout"] = ctx.resolve_callable(layout, (*path, "layout"), ctx.problems)
        if table["layout"] is None:
            return None
    return build_dataclass(FinetuneConfig, table, path, ctx.problems)


@dataclasses.dataclass
class TrainerRun:
    """A built trainer and the target `fit` should reach."""

    trainer: Any
    num_steps: int | None
    num_epochs: int | None
    checkpoint_dir: str | None
    run_dir: str
    finetune: dict[str, Any] | None = None  # what [trainer.finetune] loaded and trains (prepare_finetune's report)

    def fit(self):
        return self.trainer.fit(self.num_steps, num_epochs=self.num_epochs)


def _build_optimizer(trainer: TrainerSpec):
    import optax

    if callable(trainer.optimizer):
        return trainer.optimizer()
    parts = []
    for name, fn, kwargs in trainer.optimizer:
        try:
            parts.append(fn(**kwargs))
        except TypeError as exc:
            raise ConfigError([f"trainer.optimizer.{name} could not be built: {exc}"]) from exc
    return parts[0] if len(parts) == 1 else optax.chain(*parts)


def build_trainer(spec: RunSpec, *, pipeline: Any = None, extra_callbacks: Sequence[Any] = ()) -> TrainerRun:
    """The trainer a configuration's `[trainer]` section describes, over its pipeline (and the
    `[eval]` pipeline, when the file has one).

    With `checkpoint_dir` set, a checkpoint callback restores the newest checkpoint when training
    begins, so running the same configuration again resumes where the last run stopped.
    """
    if spec.trainer is None:
        raise ConfigError(["trainer is missing: add a [trainer] table with model, loss, optimizer and steps "
                           "(see docs/config.md)"], spec.path)
    section = spec.trainer.section
    base_dir = os.path.dirname(os.path.abspath(spec.path))
    cache = section.compilation_cache
    if cache is True:
        cache = default_cache_dir(os.path.join(run_dir_of(spec), "jax_cache")) or False
    elif isinstance(cache, str):
        cache = os.path.normpath(os.path.join(base_dir, os.path.expanduser(cache)))
    # On before the model is built: its initializers run op by op, a dozen small programs whose
    # compilation a rerun (a resume) then loads instead (bitwise the same values).
    use_compilation_cache(cache)
    pipeline = build_pipeline(spec) if pipeline is None else pipeline
    eval_pipeline = build_pipeline(spec.eval) if spec.eval is not None else None
    model = _build_model(spec)
    optimizer = _build_optimizer(spec.trainer)
    finetune = None
    if spec.trainer.finetune is not None:
        optimizer, finetune = _prepare_finetune(spec, model, optimizer)
    callbacks = [build_component(c) for c in spec.trainer.callbacks]
    loss, train_loader = section.loss, pipeline
    if spec.trainer.marglik is not None:
        model, train_loader, loss, eval_pipeline, marglik = _invariance(spec.trainer.marglik, model, pipeline,
                                                                        section.loss, eval_pipeline)
        callbacks.append(marglik)
    checkpoint_dir = None
    if section.checkpoint_dir is not None:
        checkpoint_dir = os.path.normpath(os.path.join(base_dir, os.path.expanduser(section.checkpoint_dir)))
        callbacks.insert(0, CheckpointCallback(checkpoint_dir, every_steps=section.checkpoint_every,
                                               max_to_keep=section.max_to_keep, on_damaged=section.on_damaged,
                                               keep_best=section.keep_best, best_metric=section.best_metric,
                                               best_mode=section.best_mode))
    configured = [*callbacks, *extra_callbacks]
    if spec.trainer.guard is not None and not any(isinstance(cb, StepGuard) for cb in configured):
        callbacks.append(StepGuard(run_dir_of(spec), spec.trainer.guard))
    trainer_cls = section.trainer_class or Trainer
    eval_every = section.eval_every_steps
    if eval_pipeline is not None and eval_every is None:
        eval_every = _target_steps(section, pipeline)  # evaluate once, at the end
    try:
        trainer = trainer_cls(model, optimizer, train_loader, loss, metrics=section.metrics,
                              callbacks=[*callbacks, *extra_callbacks],
                              train_pipeline_params=section.train_pipeline_params, eval_pipeline=eval_pipeline,
                              eval_every_steps=eval_every, compilation_cache=cache,
                              run_config={"trainer": {k: v for k, v in spec.trainer.table.items()
                                                      if k not in NOT_FINGERPRINTED}},
                              allow_config_change=section.allow_config_change,
                              accumulate_steps=section.accumulate_steps, ema_decay=section.ema_decay,
                              precision=section.precision, param_sharding=section.param_sharding)
    except (TypeError, ValueError) as exc:
        raise ConfigError([f"trainer could not be built: {exc}"], spec.path) from exc
    return TrainerRun(trainer, section.steps, section.epochs, checkpoint_dir, run_dir_of(spec), finetune)


def _invariance(marglik: Any, model: Any, pipeline: Any, loss: Callable, eval_pipeline: Any) -> tuple:
    """`[trainer.marglik]` applied: the invariant model over `model`, the untransformed batches it
    trains on, the loss with the prior's penalty, the evaluation's untransformed batches and the
    hyper-step's callback."""
    from datarax.train.invariance import InvariantModel, MarginalLikelihood, with_prior

    settings, config = marglik
    invariant = InvariantModel(model, pipeline, **settings)
    evaluation = eval_pipeline.raw_loader() if eval_pipeline is not None else None
    return (invariant, pipeline.raw_loader(), with_prior(loss), evaluation,
            MarginalLikelihood(invariant, pipeline, config))


def _prepare_finetune(spec: RunSpec, model: Any, optimizer: Any, *, check_only: bool = False) -> Any:
    """`[trainer.finetune]` applied to `model`: `(optimizer, report)` (`prepare_finetune`); or only
    checked, on an abstract model (`check_only`: the optimizer)."""
    from datarax.train.pretrained.finetune import check_finetune, prepare_finetune

    base_dir = os.path.dirname(os.path.abspath(spec.path))
    try:
        if check_only:
            check_finetune(model, spec.trainer.finetune, base_dir=base_dir)
            return optimizer
        return prepare_finetune(model, optimizer, spec.trainer.finetune, base_dir=base_dir)
    except FieldError as exc:
        raise ConfigError([f"trainer.finetune.{exc.field} {exc}"], spec.path) from exc
    except (ValueError, TypeError, OSError) as exc:  # add_lora finding no layer, a warm start that does not fit
        raise ConfigError([f"trainer.finetune could not be applied: {exc}"], spec.path) from exc


def _target_steps(section: TrainerSection, pipeline: Any) -> int | None:
    """The step `fit` ends at (None for epochs of a stream, whose length is not known)."""
    if section.steps is not None:
        return section.steps or None
    try:
        return section.epochs * len(pipeline) or None
    except TypeError:
        return None


def _model_args(spec: RunSpec) -> dict[str, Any]:
    from flax import nnx

    section = spec.trainer.section
    model_args = dict(section.model_args)
    if takes_argument(section.model, "rngs") and "rngs" not in model_args:
        model_args["rngs"] = nnx.Rngs(spec.run.seed)
    return model_args


def _build_model(spec: RunSpec) -> Any:
    try:
        return spec.trainer.section.model(**_model_args(spec))
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError([f"trainer.model could not be built: {type(exc).__name__}: {exc}"], spec.path) from exc


def check_trainer(spec: RunSpec, pipeline: Any) -> None:
    """What `datarax validate` checks of `[trainer]` without training: the model is built
    abstractly (`nnx.eval_shape`: shapes, no parameters allocated), the optimizer is built, and
    the loss is traced (`jax.eval_shape`) on the pipeline's output batch, so a model or loss that
    cannot run on this data is an error at its key."""
    import jax
    from flax import nnx

    section = spec.trainer.section
    try:
        model = nnx.eval_shape(lambda: section.model(**_model_args(spec)))
    except Exception as exc:  # whatever the user's model function raised, named at its key
        raise ConfigError([f"trainer.model could not be built: {type(exc).__name__}: {first_line(exc)}"],
                          spec.path) from exc
    if not isinstance(model, nnx.Module):
        raise ConfigError([f"trainer.model must return an nnx.Module, got {type(model).__name__}"], spec.path)
    optimizer = _build_optimizer(spec.trainer)
    if spec.trainer.finetune is not None:
        _prepare_finetune(spec, model, optimizer, check_only=True)
    loss_fn, trained = section.loss, nnx.Param
    if spec.trainer.marglik is not None:
        from datarax.train.invariance import InvariantModel, with_prior

        try:
            model = InvariantModel(model, pipeline, **spec.trainer.marglik[0])
        except (TypeError, ValueError) as exc:
            raise ConfigError([f"trainer.marglik could not be applied: {exc}"], spec.path) from exc
        pipeline, loss_fn, trained = pipeline.raw_loader(), with_prior(section.loss), InvariantModel.trained
    params = nnx.state(model, trained)
    try:  # a first update, abstractly: an argument the optimizer takes but cannot use fails here, not at step 1
        jax.eval_shape(lambda p: optimizer.update(p, optimizer.init(p), p), params)
    except Exception as exc:  # whatever the optimizer raised, named at its key
        raise ConfigError([f"trainer.optimizer cannot update the model's parameters: {type(exc).__name__}: "
                           f"{first_line(exc)}"], spec.path) from exc
    graphdef, state = nnx.split(model)
    batch = pipeline.output_spec()

    def loss(state, batch):
        out = loss_fn(nnx.merge(graphdef, state), batch)
        return out[0] if isinstance(out, tuple) else out

    try:
        value = jax.eval_shape(loss, state, batch)
    except Exception as exc:  # the user's loss on this batch, named at its key
        fields = ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in batch.items())
        raise ConfigError([f"trainer.loss fails on the pipeline's output batch ({fields}): {type(exc).__name__}: "
                           f"{first_line(exc)}"], spec.path) from exc
    rows = next(iter(batch.values())).shape[0]
    if getattr(value, "shape", None) not in ((), (rows,)):
        raise ConfigError([f"trainer.loss must return a scalar loss or one loss per record (shape ({rows},)), "
                           f"alone or as (loss, aux), got shape {getattr(value, 'shape', type(value).__name__)}"],
                          spec.path)


def run_dir_of(spec: RunSpec) -> str:
    """The `[trainer]` run directory: `run_dir` resolved against the config file's folder, or
    `runs/<config file name>` there."""
    base_dir = os.path.dirname(os.path.abspath(spec.path))
    section = spec.trainer.section
    if section.run_dir is None:
        return os.path.join(base_dir, "runs", os.path.splitext(os.path.basename(spec.path))[0])
    return os.path.normpath(os.path.join(base_dir, os.path.expanduser(section.run_dir)))


def load_trainer(path: str | os.PathLike, *, environ: Mapping[str, str] | None = None,
                 overrides: Sequence[str] = (), allow: Sequence[str] = (),
                 extra_callbacks: Sequence[Any] = ()) -> TrainerRun:
    """`build_trainer(load_spec(path, ...))`: the pipeline and trainer a configuration file describes
    (`allow` as for `datarax.config.load_spec`)."""
    return build_trainer(load_spec(path, environ=environ, overrides=overrides, allow=allow),
                         extra_callbacks=extra_callbacks)


register_kind(CALLBACK_KIND)


# Metric writers as components of a callback's `writers` (`{ metric_logger = { writers = [{ wandb =
# { project = "exp1" } }] } }`), and the folders callbacks and writers write into, which a
# configuration gives relative to its own file (as `checkpoint_dir`).
WRITER_KIND = Kind("writer", ("datarax.monitoring.writers", "datarax.train.metrics.writers"),
                   "datarax.monitoring.writers:MetricWriter", ("Writer",))
CONFIG_PATHS = {ProfilerConfig: "log_dir", WandbWriterConfig: "dir"}
ARGUMENT_PATHS = {JsonlWriter: "path", TensorBoardWriter: "logdir"}


def under_config_dir(spec: ComponentSpec | None, ctx: Context) -> ComponentSpec | None:
    """`spec` with the folders it (or a writer inside it) writes into resolved against the config's folder."""
    if spec is None:
        return None
    name = CONFIG_PATHS.get(type(spec.config))
    if name is not None and getattr(spec.config, name) is not None:
        spec.config = dataclasses.replace(spec.config, **{name: ctx.path_of(getattr(spec.config, name))})
    name = ARGUMENT_PATHS.get(spec.factory)
    if name is not None and isinstance(spec.kwargs.get(name), str):
        spec.kwargs[name] = ctx.path_of(spec.kwargs[name])
    for key, value in spec.kwargs.items():
        if isinstance(value, list):
            spec.kwargs[key] = [under_config_dir(v, ctx) if isinstance(v, ComponentSpec) else v for v in value]
    return spec


register_kind(WRITER_KIND)
register_section("trainer", validate_trainer)
