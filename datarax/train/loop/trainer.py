"""The Trainer: a Flax NNX model, an optax optimizer and datarax pipelines in one resumable loop."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import optax
from flax import nnx

from datarax.batching import batch_at
from datarax.core.checks import check_bool, check_int
from datarax.pipeline.pipeline import Pipeline
from datarax.pipeline.replay import ReplayedBatch, check_replayable, draw_keys, stage_draws
from datarax.sharding.placement import committed_together
from datarax.train.callbacks.base import Callback, CallbackList, CheckpointInfo, Schedule, StepLogs
from datarax.train.checkpointing.checkpointer import Checkpointer, RestoredCheckpoint
from datarax.train.checkpointing.run_config import flat_config, optimizer_fingerprint
from datarax.train.loop.compile_cache import use_compilation_cache
from datarax.train.loop.ema import ParamEMA, param_paths
from datarax.train.loop.evaluation import eval_epoch, eval_summary
from datarax.train.loop.fused import FusedCall, FusedSteps
from datarax.train.loop.guard import GUARD, GuardState, reset_guard
from datarax.train.loop.guardrails import (
    CompileCauses,
    batch_rows,
    check_training_pipeline,
    epoch_length_known,
    warn_unknown_epoch_length,
)
from datarax.train.loop.optimizers import check_optimizer_filter, trained_params
from datarax.train.loop.param_sharding import keep_layout, place, state_shardings
from datarax.train.loop.precision import LossScale
from datarax.train.loop.settings import check_inputs
from datarax.train.loop.signals import StopOnSignals
from datarax.train.loop.step import (
    EPOCH,
    RECORD_IDS,
    HostMetrics,
    JointModule,
    TimedJit,
    TrainState,
    VariableBinding,
    batch_signature,
    make_eval_step,
    make_train_step,
    scan_steps,
)

logger = logging.getLogger("datarax.train")


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What `Trainer.fit` returns.

    Attributes:
        step: the step the run ended at.
        stop_reason: None when the target was reached, else "SIGTERM", "SIGINT" or the reason
            given to `request_stop`.
        metrics: host values of the final step's metrics.
        eval_metrics: the last evaluation's metrics ({} if none ran).
        resumed_from: the checkpoint step this run continued from (None: a fresh start).
    """

    step: int
    stop_reason: str | None
    metrics: dict[str, float]
    eval_metrics: dict[str, float]
    resumed_from: int | None = None


class Trainer:
    """Trains a Flax NNX model on a datarax pipeline with a jitted, buffer-donating step.

    docs/trainers.md is the guide; the modules named below hold each option's rules.

    Args:
        model: the `nnx.Module` to train.
        optimizer: an optax `GradientTransformation`, or an `nnx.Optimizer` built over `model`.
        train_pipeline: iterated endlessly (`pipeline.epochs(None)`); its iterator is checkpointed.
        loss_fn: `loss_fn(model, batch) -> loss` or `-> (loss, aux)`, a scalar loss; `loss_fn(model, batch, mask)`
            masks the records a host stage skipped itself, any other is averaged over the valid records
            (`datarax.train.loop.masking`).
        eval_pipeline: the pipeline of `evaluate()` (one epoch per evaluation).
        metrics: `{name: fn(batch, aux) -> scalar}` (a value may be a `datarax.train.metrics.Metric`), or a
            CLU `clu.metrics.Collection` subclass.
        callbacks: `datarax.train.callbacks.Callback`s (checkpointing, goodput, logging, ...).
        train_pipeline_params: also optimise the pipeline's `nnx.Param`s; needs an optax transformation. The
            step then reads untransformed batches from `pipeline.raw_loader()` (the same source and sampler,
            so the same record ids and keys) and runs the pipeline's stages inside the gradient.
        eval_every_steps: evaluate every N steps during `fit` (needs `eval_pipeline`).
        compilation_cache: True (default): JAX's persistent cache in `$DATARAX_COMPILATION_CACHE`, else
            `~/.cache/datarax/jax`; a path: that directory; False: JAX's setting is left alone
            (`datarax.train.loop.compile_cache`).
        run_config: the run's settings (plain values), written into every checkpoint; restoring one written
            under another configuration raises `CheckpointMismatchError` naming each difference
            (`datarax.train.checkpointing.run_config`).
        allow_config_change: resume a checkpoint written under another configuration anyway.
        accumulate_steps: micro-batches per optimizer step, gradients averaged; must divide `batch_size`.
        ema_decay: keep a checkpointed moving average of the parameters (e.g. 0.999; None: off), used by
            `evaluate(ema=True)` (`datarax.train.loop.ema`).
        precision: "f32" (default), "bf16" or "f16" (with dynamic loss scaling); master parameters stay f32
            (`datarax.train.loop.precision`).
        param_sharding: None (the state stays where the model's arrays are), "replicated" or "fsdp" over the
            training pipeline's mesh (needs its `sharding`; `datarax.train.loop.param_sharding`).
        steps_per_execution: optimizer steps per jitted call (default 1), run as one `jax.lax.scan`
            (`datarax.train.loop.step.scan_steps`) over the steps (m*K, (m+1)*K], so a run resumes bitwise on
            K = 1's batches and keys; callbacks see one call. Keep 1 for convolutional models on the CPU
            backend. Over a device-resident, unsharded training source the pipeline's gather and stages run
            inside that call too (`datarax.train.loop.fused.FusedSteps`).

    Metrics stay on the device until read (`StepLogs.metrics`). Construction warns
    (`datarax.train.loop.guardrails.TrainerWarning`) about a training pipeline that does not shuffle or
    whose epoch ends in a short batch.

    Example:
        >>> trainer = Trainer(model, optax.adam(1e-3), pipeline, loss_fn,  # doctest: +SKIP
        ...                   callbacks=[CheckpointCallback("ckpt", every_steps=100)])
        >>> result = trainer.fit(num_steps=1000)  # doctest: +SKIP
    """

    def __init__(self, model: nnx.Module, optimizer: optax.GradientTransformation | nnx.Optimizer,
                 train_pipeline: Pipeline, loss_fn: Callable, *, eval_pipeline: Pipeline | None = None,
                 metrics: Mapping[str, Callable] | type | None = None, callbacks: Iterable[Callback] = (),
                 train_pipeline_params: bool = False, eval_every_steps: int | None = None,
                 compilation_cache: bool | str | os.PathLike = True, run_config: Mapping[str, Any] | None = None,
                 allow_config_change: bool = False, accumulate_steps: int = 1, ema_decay: float | None = None,
                 precision: str = "f32", param_sharding: str | None = None, steps_per_execution: int = 1):
        metrics = check_inputs(model, train_pipeline, loss_fn, eval_pipeline=eval_pipeline, metrics=metrics,
                               eval_every_steps=eval_every_steps, run_config=run_config,
                               train_pipeline_params=train_pipeline_params, allow_config_change=allow_config_change,
                               accumulate_steps=accumulate_steps, ema_decay=ema_decay, precision=precision,
                               param_sharding=param_sharding, steps_per_execution=steps_per_execution)
        self.accumulate_steps, self.steps_per_execution = int(accumulate_steps), int(steps_per_execution)
        self.precision = precision
        self.allow_config_change = allow_config_change
        self._run_config = dict(run_config or {})
        self._config_fingerprint: dict[str, str] | None = None
        self.param_sharding = param_sharding
        self.compilation_cache_dir = use_compilation_cache(compilation_cache)
        check_training_pipeline(train_pipeline)
        self.model = model
        self.loss_fn = loss_fn
        self.train_pipeline = train_pipeline
        self.eval_pipeline = eval_pipeline
        self.joint = train_pipeline_params
        self.trainable = JointModule(model, train_pipeline) if self.joint else model
        mesh = train_pipeline.sharding.mesh if param_sharding is not None else None
        # Under the mesh: variables annotated with a partition spec need it to be created (the
        # optimizer's and the average's copies of them included).
        with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
            self.optimizer = self._build_optimizer(optimizer)
            self.ema = ParamEMA(model, ema_decay) if ema_decay is not None else None
        self.loss_scale = LossScale() if self.precision == "f16" else None
        self.callbacks = CallbackList(callbacks)
        from datarax.train.callbacks.guard import StepGuard  # the callbacks import the loop's guard module

        guards = [cb for cb in self.callbacks if isinstance(cb, StepGuard)]
        if len(guards) > 1:
            raise ValueError(f"callbacks hold {len(guards)} StepGuards; one guard decides per step, pass one")
        # The bad-step guard: its check is compiled into the step (datarax.train.loop.guard).
        self.guard = guards[0] if guards else None
        self.guard_state = GuardState(self.guard.config.window) if self.guard is not None else None
        self._eval_schedule = Schedule(every_steps=eval_every_steps)
        # The joint mode reads untransformed batches plus their BatchContext from a loader over the
        # same source and sampler (no stages); its iterator state is what the checkpoint holds.
        self._loader = train_pipeline.raw_loader(ids_key=RECORD_IDS, epoch_key=EPOCH) if self.joint else train_pipeline
        state = TrainState(self.trainable, self.optimizer, ema=self.ema, loss_scale=self.loss_scale,
                           guard=self.guard_state)
        self._binding = VariableBinding(state)
        self.state_shardings = None
        if param_sharding is not None:
            # Every array of the state on its sharding (param_sharding.state_shardings), kept by
            # the step: the model's own arrays are the ones placed, so eval and checkpoints see them.
            self.state_shardings = state_shardings(state, mesh, train_pipeline.sharding.batch_axes, param_sharding)
            self._binding.assign(place(self._binding.values(), self.state_shardings))
        self._model_binding = VariableBinding(model)
        # Where each averaged parameter sits among the model's variables, for evaluate(ema=True).
        self._ema_positions = [self._model_binding.paths.index(path) for path in param_paths(model)]
        self.metrics = metrics
        step = make_train_step(self._binding, loss_fn, metrics, self.joint, accumulate_steps=self.accumulate_steps,
                               precision=self.precision, guard=None if self.guard is None else self.guard.config)
        if self.state_shardings is not None:
            step = keep_layout(step, self.state_shardings)
        self._train_step = TimedJit(step, donate_values=True)
        k = self.steps_per_execution
        self._train_steps = TimedJit(scan_steps(step), donate_values=True) if k > 1 else None
        self._fused = FusedSteps(self._loader, step, k) if k > 1 and FusedSteps.supports(self._loader) else None
        self._eval_step = TimedJit(make_eval_step(self._model_binding, loss_fn, metrics, self.precision),
                                   donate_values=False)
        self._train_causes = CompileCauses(train_pipeline.batch_size, "step" if k == 1 else
                                           f"single step (a call of fewer than {k} steps, or of batches of "
                                           "different shapes)")
        self._execution_causes = CompileCauses(train_pipeline.batch_size, f"call of {k} steps")
        self._eval_causes = CompileCauses(eval_pipeline.batch_size if eval_pipeline is not None else 0,
                                          "evaluation batch")
        self.step = 0
        self.resumed_from: int | None = None
        self.target_step = 0
        self.fit_began_at: float | None = None
        self.stop_reason: str | None = None
        self.last_eval_metrics: dict[str, float] = {}
        self.last_eval_results: dict[str, Any] = {}
        self.last_eval_records = 0  # records the last evaluation scored
        self.target_epoch: int | None = None
        self._iterator = None
        self._resume_state: dict | None = None  # the state of an iterator closed by `close`
        # (step, metrics) of the newest call, which the next call's logs show, and of the one before.
        self._pending: tuple[int, HostMetrics] | None = None
        self._shown: tuple[int, HostMetrics] | None = None

    @property
    def last_metrics(self) -> dict[str, float]:
        """Host values of the newest metrics callbacks were shown (during `fit` the previous call's
        last step; after it the final step); reading them waits for that step."""
        return {} if self._shown is None else dict(self._shown[1])

    @property
    def config_fingerprint(self) -> dict[str, str]:
        """The flat configuration text written into checkpoints and checked on restore."""
        if self._config_fingerprint is None:
            fingerprint = flat_config(self._run_config) if self._run_config else {}
            fingerprint["model.class"] = f"{type(self.model).__module__}:{type(self.model).__qualname__}"
            fingerprint.update(optimizer_fingerprint(self.optimizer.tx, nnx.state(self.trainable, nnx.Param)))
            # Only settings away from their defaults, so checkpoints written before these options still match.
            for key, value, default in (("accumulate_steps", self.accumulate_steps, 1),
                                        ("ema_decay", None if self.ema is None else self.ema.decay, None),
                                        ("precision", self.precision, "f32")):
                if value != default:
                    fingerprint[f"step.{key}"] = repr(value)
            self._config_fingerprint = fingerprint
        return dict(self._config_fingerprint)

    def _build_optimizer(self, optimizer: Any) -> nnx.Optimizer:
        wrt = trained_params(self.model, self.joint)
        if isinstance(optimizer, nnx.Optimizer):
            if self.joint:
                raise TypeError(
                    "train_pipeline_params=True needs an optax transformation (e.g. optax.adam(1e-3)), not an "
                    "nnx.Optimizer: the trainer builds the optimizer over the model and the pipeline together")
            check_optimizer_filter(optimizer, wrt)
            return optimizer
        if isinstance(optimizer, optax.GradientTransformation):
            return nnx.Optimizer(self.trainable, optimizer, wrt=wrt)
        raise TypeError(f"optimizer must be an optax GradientTransformation or an nnx.Optimizer, got "
                        f"{type(optimizer).__name__}; pass e.g. optax.adam(1e-3)")

    @property
    def iterator(self):
        """The training data iterator (created on first use; its state is checkpointed)."""
        if self._iterator is None:
            self._iterator = self._loader.epochs(None)
            if self._resume_state is not None:
                self._iterator.set_state(self._resume_state)
                self._resume_state = None
        return self._iterator

    def close(self) -> None:
        """Stops the training iterator's background reader and waits for it (idempotent); a later
        `fit` resumes from the iterator's state. Call it (or use a `with` block) before the process
        ends, so no reader thread is still in native code at exit."""
        iterator, self._iterator = self._iterator, None
        if iterator is None:
            return
        state = iterator.get_state()
        close = getattr(iterator, "close", None)
        if close is not None:
            close()
        self._resume_state = state

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def epoch(self) -> int:
        """The data epoch of the last batch trained on."""
        return int(self.iterator.get_state()["epoch"])

    def replay(self, step: int) -> ReplayedBatch:
        """The batch training step `step` (1-based, any step of this run, past or coming) received,
        rebuilt bitwise without reading the batches before it (`Pipeline.replay`: record ids,
        origins, every stochastic stage's draws, the batch). Steps map to batches by arithmetic from
        the iterator's cursor: one batch per step, whatever `accumulate_steps` or
        `steps_per_execution`. With `train_pipeline_params` the batch is the raw loader's (what the
        step received) and the draws include those of the stages the step runs.
        """
        check_int(step, "step", 1, why=" (steps count from 1)")
        loader = self._loader
        check_replayable(loader)
        state = self.iterator.get_state()
        epoch, position, num_valid = batch_at(len(loader.sampler), loader.batch_size,
                                              drop_remainder=loader.drop_remainder, epoch=state["epoch"],
                                              position=state["position"], offset=step - self.step - 1)
        replayed = loader.replay(epoch, position)
        if self.joint:  # the step runs the pipeline's stages on the raw batch: their draws too
            draws = stage_draws(self.train_pipeline, replayed.record_ids, epoch, num_valid)
            replayed = dataclasses.replace(replayed, draws={**replayed.draws, **draws})
        return replayed

    def rewind(self, step: int, iterator_state: dict | None = None) -> None:
        """Goes back to the end of `step` after the steps past it changed nothing (a `StepGuard` held
        them): the step counter, and the data iterator to the batch of step `step + 1`, so a
        checkpoint saved next holds a state whose model and data position agree.

        `iterator_state`: the iterator's state after `step` (`get_state`); None computes it by
        arithmetic, which a stream cannot do.
        """
        check_int(step, "step", 0, high=self.step, why=" (a step this run has reached)")
        if iterator_state is None:
            loader = self._loader
            check_replayable(loader)
            state = self.iterator.get_state()
            epoch, position, _ = batch_at(len(loader.sampler), loader.batch_size, drop_remainder=loader.drop_remainder,
                                          epoch=state["epoch"], position=state["position"], offset=step - self.step)
            self.iterator.seek(epoch, position)
        else:
            self.iterator.set_state(iterator_state)
        self.step = step
        self._pending = None
        if self.guard_state is not None:
            reset_guard(self.guard_state, step, keep_losses=True)

    def request_stop(self, reason: str) -> None:
        """Asks `fit` to stop after the current step (a final checkpoint is still saved)."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def reader_timings(self) -> list[dict]:
        """The training pipeline's background reader time per part so far (`Pipeline.reader_timings`)."""
        return self._loader.reader_timings()

    def _target(self, num_steps: int | None, num_epochs: int | None) -> int | None:
        """The step to reach (None: a stream of unknown epoch length, stopped by `target_epoch`)."""
        if (num_steps is None) == (num_epochs is None):
            raise ValueError(f"give exactly one of num_steps or num_epochs, got num_steps={num_steps!r}, "
                             f"num_epochs={num_epochs!r}")
        value, name = (num_steps, "num_steps") if num_steps is not None else (num_epochs, "num_epochs")
        check_int(value, name, 0, why=" (the total to reach, counted from step 0)")
        self.target_epoch = None
        if num_steps is not None:
            return value
        if epoch_length_known(self._loader):
            return value * len(self._loader)
        warn_unknown_epoch_length(self._loader, value)
        self.target_epoch = value
        return None

    def fit(self, num_steps: int | None = None, *, num_epochs: int | None = None) -> FitResult:
        """Trains until `num_steps` total steps (or `num_epochs` total epochs) are done.

        Totals count from step 0, so a resumed run stops where an uninterrupted one would; on a
        stream of unknown length training stops before the first batch of epoch `num_epochs`.
        SIGTERM/SIGINT stop the loop after the current call (checkpoint callbacks then save) and
        set `stop_reason`. The step donates the state's buffers: copy any array you take from the
        model or optimizer during training.
        """
        target = self._target(num_steps, num_epochs)
        self.target_step = target
        self.fit_began_at = time.perf_counter()
        self.stop_reason = None
        iterator = self.iterator
        # The step donates its inputs; train on copies so arrays the caller still holds (e.g. the
        # initial parameters) stay valid. Arrays read from the modules during training do not.
        # Weakly typed values (a Param made from a Python float) come back strongly typed from the
        # step, which would recompile it once more: make them strong now.
        values = jax.device_put(self._binding.values(), may_alias=False)
        self._binding.assign([v.astype(v.dtype) if getattr(v, "weak_type", False) else v for v in values])
        self._commit_state()
        try:
            with StopOnSignals(self):
                self.callbacks("on_train_begin", self)
                self._commit_state()  # a restore's arrays are committed, the state it leaves alone is not
                self._eval_schedule.reset(self.step)
                while (target is None or self.step < target) and self.stop_reason is None:
                    if not self._train_one(iterator, target):
                        break
                    if self._eval_schedule.due(self.step):
                        self.evaluate()
                logs = self._final_logs()
                self.callbacks("on_train_end", self, logs)
        except BaseException:
            for cb in self.callbacks:
                try:
                    cb.close()
                except Exception:  # the original error matters more; a close error must not hide it
                    pass
            raise
        return FitResult(self.step, self.stop_reason, dict(self.last_metrics), dict(self.last_eval_metrics),
                         self.resumed_from)

    def _commit_state(self) -> None:
        """Commits the state's uncommitted arrays beside its committed ones (`committed_together`)."""
        self._binding.assign(committed_together(self._binding.values()))

    def _train_one(self, iterator, target: int | None) -> bool:
        """Trains one call of up to `steps_per_execution` steps; False (nothing trained) when the next
        batch is past `target_epoch`."""
        first = self.step + 1
        # Calls cover the steps (m*K, (m+1)*K]: a resumed run groups its steps as an uninterrupted one.
        count = self.steps_per_execution - self.step % self.steps_per_execution
        if target is not None:
            count = min(count, target - self.step)
        self.callbacks("on_data_wait_begin", self, first)
        begin = time.perf_counter()
        with jax.profiler.TraceAnnotation("datarax/next"):
            fused = count == self.steps_per_execution and self._fused is not None and self.target_epoch is None
            batches = (fused and self._fused.take(iterator, count)) or self._next_batches(iterator, count)
        end = time.perf_counter()
        if not batches:
            return False
        self.callbacks("on_data_wait_end", self, first, end - begin)
        self.callbacks("on_step_begin", self, first)
        values, compile_seconds, cause = self._binding.values(), 0.0, None
        with jax.profiler.TraceAnnotation("datarax/step"):
            if isinstance(batches, FusedCall):
                (values, out), compile_seconds = self._fused(values, batches, iterator)
                cause = self._fused.causes.cause(batches.inputs[2:]) if compile_seconds > 0 else None
            elif len(batches) == self.steps_per_execution > 1 and len(set(map(batch_signature, batches))) == 1:
                (values, out), compile_seconds = self._train_steps(values, batches)
                cause = self._execution_causes.cause(batches[0]) if compile_seconds > 0 else None
            else:
                for batch in batches:
                    (values, out), seconds = self._train_step(values, batch)
                    if seconds > 0:
                        compile_seconds += seconds
                        cause = self._train_causes.cause(batch)
        self._binding.assign(values)
        dispatched = time.perf_counter()
        guard = out.pop(GUARD, None)
        self.step += len(batches)
        previous, self._pending = self._pending, (self.step, HostMetrics(out, self.metrics))
        if previous is not None:
            self._shown = previous
        # Step `self.step` is already queued, so reading the previous call's metrics never idles the device.
        rows = batches.rows if isinstance(batches, FusedCall) else sum(map(batch_rows, batches))
        epoch = iterator.get_state()["epoch"]
        logs = StepLogs(step=self.step, steps=len(batches), batch_size=rows,
                        metrics=previous[1] if previous is not None else {},
                        metrics_step=previous[0] if previous is not None else None, data_wait=(begin, end),
                        dispatched_at=dispatched, compile_seconds=compile_seconds, output=out["loss"], epoch=epoch,
                        compile_cause=cause, guard=guard)
        self.callbacks("on_step_end", self, logs)
        return True

    def _next_batches(self, iterator, count: int) -> list:
        """Up to `count` batches; with `target_epoch`, the first batch of that epoch is put back for a later fit."""
        batches = []
        for _ in range(count):
            before = iterator.get_state() if self.target_epoch is not None else None
            batch = next(iterator)
            if self.target_epoch is not None and iterator.get_state()["epoch"] >= self.target_epoch:
                # The stream's epoch ended with the previous batch.
                iterator.set_state(before)
                break
            batches.append(batch)
        return batches

    def _final_logs(self) -> StepLogs:
        if self._pending is not None:
            self._shown, self._pending = self._pending, None
            step, metrics = self._shown
            return StepLogs(step=self.step, metrics=dict(metrics), metrics_step=step)
        metrics = self.last_metrics
        return StepLogs(step=self.step, metrics=metrics, metrics_step=self.step if metrics else None)

    def evaluate(self, pipeline: Pipeline | None = None, *, ema: bool = False) -> dict[str, float]:
        """The loss and metrics over one epoch of the eval pipeline (`evaluation.eval_summary` says how
        they are reduced; a `Metric`'s full `result` goes to `last_eval_results[name]`). With
        `ema=True` the parameters' moving averages stand in for the parameters (needs `ema_decay`)."""
        pipeline = self.eval_pipeline if pipeline is None else pipeline
        if not isinstance(pipeline, Pipeline):
            raise ValueError(f"evaluate needs a pipeline: pass one, or build the Trainer with eval_pipeline=..., "
                             f"got {pipeline!r:.60}")
        check_bool(ema, "ema")
        if ema and self.ema is None:
            raise ValueError("evaluate(ema=True) needs the parameters' moving average: build the Trainer with "
                             "ema_decay=... (e.g. 0.999)")
        self.callbacks("on_eval_begin", self, self.step)
        values = self._model_binding.values()
        if ema:
            for position, average in zip(self._ema_positions, self.ema.values()):
                values[position] = average
        # A restore's arrays are committed, a fresh model's (and what a restore leaves alone) not: the
        # eval step would compile again for each mix it is given.
        values = committed_together(values)
        outs, sizes = eval_epoch(pipeline, values, self._eval_step, self._eval_causes,
                                 lambda logs: self.callbacks("on_eval_step_end", self, logs))
        metrics, results, records = eval_summary(outs, sizes, self.metrics)
        self.last_eval_metrics = metrics
        self.last_eval_results = results
        self.last_eval_records = records
        self.callbacks("on_eval_end", self, self.step, dict(metrics))
        return metrics

    def eval_reader_timings(self) -> list[dict]:
        """The eval pipeline's background reader time per part so far ([] without one)."""
        return [] if self.eval_pipeline is None else self.eval_pipeline.reader_timings()

    def logged_metrics(self) -> dict[str, float]:
        """The newest metrics as loggers name them: `train/<name>` (the last step's read, one step late
        during `fit`) and `eval/<name>` (the last evaluation)."""
        out = {f"train/{k}": v for k, v in self.last_metrics.items()}
        out.update({f"eval/{k}": v for k, v in self.last_eval_metrics.items()})
        return out

    def _extras(self) -> dict[str, nnx.Module]:
        """Training state beyond model and optimizer, each saved as its own checkpoint item."""
        extras = {}
        if self.ema is not None:
            extras["ema"] = self.ema
        if self.loss_scale is not None:
            extras["loss_scale"] = self.loss_scale
        return extras

    def save_checkpoint(self, checkpointer: Checkpointer, *, forced: bool = False, wait: bool = False) -> bool:
        """Saves the current step (model, optimizer, iterator, metadata, and the moving average and
        loss scale when on; with `logged_metrics` when the checkpointer keeps the best); False if it
        exists already. `on_checkpoint_save` reports the time the loop was blocked."""
        if self.guard is not None:
            self.guard.settle(self)  # a bad step not seen yet is handled first: no checkpoint holds it
        began = time.perf_counter()
        metadata = {"epoch": self.epoch, "pipeline_fingerprint": self.train_pipeline.fingerprint,
                    "pipeline_structure": self.train_pipeline.structure_parts,
                    "pipeline_keys": draw_keys(self.train_pipeline),
                    "callbacks": self.callbacks.states(), "saved_at": time.time(),
                    "run_config": self.config_fingerprint}
        saved = checkpointer.save(self.step, model=self.model, optimizer=self.optimizer, iterator=self.iterator,
                                  metadata=metadata, pipeline=self.train_pipeline if self.joint else None,
                                  extras=self._extras(),
                                  metrics=self.logged_metrics() if checkpointer.best_metric is not None else None)
        if wait:
            checkpointer.wait()
        if saved or wait:
            info = CheckpointInfo(self.step, time.perf_counter() - began, began, str(checkpointer.directory), forced)
            self.callbacks("on_checkpoint_save", self, info)
        return saved

    def restore_checkpoint(self, checkpointer: Checkpointer, *, best: bool = False) -> RestoredCheckpoint | None:
        """Restores the latest readable checkpoint into this trainer's objects (None if none exists);
        with `best=True` the best one by the checkpointer's `best_metric` (`Checkpointer.restore_best`)."""
        began = time.perf_counter()
        restore = checkpointer.restore_best if best else checkpointer.restore_latest
        restored = restore(
            model=self.model, optimizer=self.optimizer, iterator=self.iterator,
            pipeline=self.train_pipeline if self.joint else None, fingerprint=self.train_pipeline.fingerprint,
            structure=self.train_pipeline.structure_parts,
            run_config=None if self.allow_config_change else self.config_fingerprint, extras=self._extras())
        if restored is None:
            return None
        self.step = restored.step
        self.resumed_from = restored.step
        self._pending = None
        self.callbacks.set_states(restored.metadata.get("callbacks", {}))
        info = CheckpointInfo(restored.step, time.perf_counter() - began, began, str(checkpointer.directory))
        logger.info("resumed from the checkpoint at step %d in %s (restored in %.2f s)", restored.step,
                    checkpointer.directory, info.seconds)
        self.callbacks("on_checkpoint_restore", self, info)
        return restored
