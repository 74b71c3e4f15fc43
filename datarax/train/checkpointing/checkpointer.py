"""One Orbax checkpoint per save: model, optimizer, data iterator and run metadata together.

On disk, `<directory>/<step>/` holds:

    model/        nnx.state(model)              Orbax StandardSave (OCDBT + zarr)
    optimizer/    nnx.state(optimizer)          Orbax StandardSave
    pipeline/     nnx.state(pipeline)           only when the pipeline is trained jointly
    ema/          the parameters' moving average  only with Trainer(ema_decay=...)
    loss_scale/   the float16 loss scale        only with Trainer(precision="f16")
    metrics/      {best_metric: value}          Orbax's own item, only with keep_best
    iterator/     process_<i>-of-<n>.json       datarax IteratorSave (epoch, position, fingerprint)
    meta/         JSON metadata                 step, epoch, fingerprints, run configuration,
                                                callbacks' state, integrity hashes

A step directory appears only when its save is complete (Orbax writes into
`<step>.orbax-checkpoint-tmp-<pid>` and renames), so a run killed mid-save leaves the previous
checkpoint as the latest. A latest checkpoint that cannot be read, or reads back other data than
the hashes written with it (`datarax.checkpoint.integrity`), is reported with a warning,
moved aside to `corrupt-<step>-<time>`, and the previous one is restored. When no step can be
restored every run refuses, until the user passes `on_damaged="start_fresh"` or copies an intact
checkpoint in (`datarax.checkpoint.policies`).

One process at a time: an open `Checkpointer` holds an exclusive `flock` on `<directory>/.lock`,
which the operating system releases when the process dies, so a killed run's lock never blocks
the next one (`datarax.checkpoint.locking`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import threading
import time
import warnings
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from datarax.checkpoint import IteratorRestore, IteratorSave
from datarax.checkpoint.errors import (
    CheckpointMismatchError,
    CheckpointRestoreError,
    CheckpointSaveError,
    CorruptCheckpointWarning,
)
from datarax.checkpoint.integrity import arrays_sha256, iterator_integrity, verify_arrays, verify_iterator
from datarax.checkpoint.locking import DirectoryLock, ProcessTemporaryPath
from datarax.checkpoint.policies import (
    ON_DAMAGED_ENV,
    check_best,
    check_max_to_keep,
    metric_value,
    quiet_missing_metrics,
    resolve_on_damaged,
    retention,
)
from datarax.checkpoint.trees import (
    abstract_target,
    layout,
    load_into,
    savable,
    structure_differences,
    tree_differences,
    tree_layout,
    tree_shapes,
)
from datarax.core.checks import check_bool
from datarax.pipeline.state import IteratorStateError
from datarax.train.checkpointing.run_config import RESUME_ANYWAY, config_differences

# 2: meta carries "integrity" (array and iterator hashes written at save time).
FORMAT_VERSION = 2
# The items every checkpoint has; any other array item (ema, loss_scale) is optional training state.
CORE_ITEMS = ("model", "optimizer", "pipeline")
CORRUPT_PREFIX = "corrupt-"


@dataclasses.dataclass(frozen=True)
class RestoredCheckpoint:
    """What `Checkpointer.restore_latest` restored.

    Attributes:
        step: the restored step.
        metadata: the JSON metadata saved with it.
        skipped: (step, reason) for each newer checkpoint that could not be restored.
    """

    step: int
    metadata: dict
    skipped: tuple[tuple[int, str], ...] = ()


class _FrozenIteratorState:
    """The iterator's state captured at save time, so a background write cannot see a later one."""

    def __init__(self, state: dict):
        self._state = state

    def get_state(self) -> dict:
        return self._state


class Checkpointer:
    """Saves and restores a training run's state through one Orbax `CheckpointManager`.

    Args:
        directory: the checkpoint root (created if missing).
        max_to_keep: how many of the newest checkpoints to keep (None: all).
        asynchronous: `save` only makes device copies of the arrays (the next step donates the
            originals) and captures the iterator state and metadata; a thread of this Checkpointer
            fetches the copies, hashes them and has Orbax write the step. One write is in flight at a
            time: the next `save` waits for the previous one. Its errors are raised by the next
            `save`, `wait` or `close`, never swallowed. False: `save` writes before it returns.
        on_damaged: what `restore_latest` does when no checkpoint can be restored: "refuse" (default:
            raise `CheckpointRestoreError`) or "start_fresh" (warn, start from step 0); None reads
            `$DATARAX_ON_DAMAGED_CHECKPOINTS`, else "refuse".
        keep_best: also keep the k best checkpoints by `best_metric` (None: only the newest).
        best_metric: "eval/<name>" or "train/<name>", as loggers name it; needs `keep_best`.
        best_mode: "min" (lower is better) or "max".

    Raises:
        CheckpointLockedError: another open `Checkpointer` (in any process) holds `directory`; the
            message names its pid and host.
    """

    def __init__(self, directory: Any, *, max_to_keep: int | None = 3, asynchronous: bool = True,
                 on_damaged: str | None = None, keep_best: int | None = None, best_metric: str | None = None,
                 best_mode: str = "min"):
        check_max_to_keep(max_to_keep)
        self.keep_best, self.best_metric, self.best_mode = check_best(keep_best, best_metric, best_mode)
        self.on_damaged = resolve_on_damaged(on_damaged)
        self.directory = epath.Path(directory).absolute()
        local = "://" not in str(self.directory)
        if local:
            self.directory.mkdir(parents=True, exist_ok=True)
            # Before the manager exists: its start-up deletes temporary directories, which would
            # destroy a save another run has in flight.
            self._lock: DirectoryLock | None = DirectoryLock(self.directory, self)
        else:
            self._lock = None
            warnings.warn(f"checkpoint directory {self.directory} is not on a local file system: it is not locked "
                          "against a second run writing to it", UserWarning, stacklevel=2)
        temporary = ProcessTemporaryPath if local and jax.process_count() == 1 else None
        try:
            self._manager = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(
                    preservation_policy=retention(max_to_keep, self.keep_best, self.best_mode),
                    best_fn=metric_value if self.keep_best is not None else None, best_mode=self.best_mode,
                    # The background write is this class's own thread, so Orbax writes synchronously on it.
                    enable_async_checkpointing=False, cleanup_tmp_directories=True, create=True,
                    temporary_path_class=temporary),
            )
        except BaseException:
            self._release_lock()
            raise
        self.asynchronous = check_bool(asynchronous, "asynchronous")
        self._in_flight: int | None = None
        self._writer: threading.Thread | None = None
        self._write_error: BaseException | None = None

    @property
    def lock_path(self) -> str | None:
        """The lock file held while this Checkpointer is open (None on non-local file systems)."""
        return None if self._lock is None else self._lock.path

    def _release_lock(self) -> None:
        if self._lock is not None:
            lock, self._lock = self._lock, None
            lock.release()

    def damaged_steps(self) -> list[str]:
        """Names of the `corrupt-<step>-<time>` directories earlier restores moved aside, oldest first."""
        if not self.directory.exists():
            return []
        return sorted(p.name for p in self.directory.iterdir() if p.name.startswith(CORRUPT_PREFIX))

    def steps(self) -> list[int]:
        """Complete checkpoints on disk, oldest first."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, *, model: nnx.Module, optimizer: nnx.Optimizer, iterator: Any,
             metadata: dict, pipeline: nnx.Module | None = None, extras: dict[str, nnx.Module] | None = None,
             metrics: dict[str, float] | None = None) -> bool:
        """Starts saving `step` (always, whatever the interval); False if it already exists.

        `extras` are further training state saved as items of their own (`{"ema": ...}`);
        `metrics` the run's newest metrics by logged name, of which `best_metric` ranks the step.
        Waits for the previous background save first and raises its error; when asynchronous,
        returns once the arrays' device copies are dispatched (see `asynchronous`).
        """
        self.wait()
        if step in self._manager.all_steps():
            return False
        extras = dict(extras or {})
        for name in extras:
            if name in CORE_ITEMS or name in ("iterator", "meta", "metrics"):
                raise ValueError(f"extras may not be named {name!r} (a checkpoint item of its own)")
        modules = {"model": model, "optimizer": optimizer, **({"pipeline": pipeline} if pipeline is not None else {}),
                   **extras}
        # Device copies (dispatched, not waited for): the next step donates the live arrays.
        arrays = {name: savable(module) for name, module in modules.items()}
        ranked = self._ranking_value(metrics or {})
        meta = copy.deepcopy({**metadata, "step": step, "format_version": FORMAT_VERSION, "joint": pipeline is not None,
                              "best_metric": None if ranked is None else {self.best_metric: ranked}})
        write = (step, arrays, iterator.get_state(), meta, ranked)
        if not self.asynchronous:
            try:
                self._write(*write)
            except Exception as exc:
                raise CheckpointSaveError(f"saving checkpoint step {step} to {self.directory} failed: "
                                          f"{type(exc).__name__}: {exc}") from exc
            return True
        self._in_flight = step
        self._writer = threading.Thread(target=self._write_in_background, args=write,
                                        name=f"datarax-checkpoint-save-{step}")
        self._writer.start()
        return True

    def _write(self, step: int, arrays: dict, iterator_state: dict, meta: dict, ranked: float | None) -> None:
        """Fetches, hashes and writes one checkpoint (on the background thread when asynchronous)."""
        # Hashes of exactly the arrays and state handed to Orbax: restore compares what it reads.
        integrity = {name: arrays_sha256(tree) for name, tree in arrays.items()}
        integrity["iterator"] = iterator_integrity(iterator_state)
        meta.update(integrity=integrity, layout={name: tree_layout(tree) for name, tree in arrays.items()})
        items = {name: ocp.args.StandardSave(tree) for name, tree in arrays.items()}
        items["iterator"] = IteratorSave(_FrozenIteratorState(iterator_state))
        items["meta"] = ocp.args.JsonSave(meta)
        with quiet_missing_metrics() if ranked is None else contextlib.nullcontext():
            self._manager.save(step, args=ocp.args.Composite(**items), force=True,
                               metrics=None if ranked is None else {self.best_metric: ranked})

    def _write_in_background(self, *write) -> None:
        try:
            self._write(*write)
        except BaseException as exc:  # raised on the training thread by the next save, wait or close
            self._write_error = exc

    def _ranking_value(self, metrics: dict[str, float]) -> float | None:
        """The value of `best_metric` among `metrics` (None: not tracking, not there yet, or not finite)."""
        if self.best_metric is None or self.best_metric not in metrics:
            return None
        value = float(metrics[self.best_metric])
        return value if math.isfinite(value) else None

    def best_step(self) -> int | None:
        """The best step on disk by `best_metric` (Orbax's `best_step`); None when no step carries a value."""
        if self.best_metric is None:
            raise ValueError("best_step needs the metric that ranks checkpoints: open the Checkpointer with "
                             "keep_best=k and best_metric='eval/<name>'")
        self.wait()
        self._manager.reload()
        return self._manager.best_step()

    def step_metrics(self, step: int) -> dict | None:
        """The ranking metric Orbax recorded with `step` (None when it has none)."""
        self.wait()
        return self._manager.metrics(step)

    def wait(self) -> None:
        """Blocks until the background write finishes; raises `CheckpointSaveError` if it failed."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.join()
        step, self._in_flight = self._in_flight, None
        error, self._write_error = self._write_error, None
        if error is not None:
            raise CheckpointSaveError(
                f"the background write of checkpoint step {step} to {self.directory} failed: "
                f"{type(error).__name__}: {error}; the checkpoint was not committed (the previous one is intact)"
            ) from error

    def close(self) -> None:
        """Waits for background writes (raising their error), releases the manager and the lock."""
        try:
            self.wait()
        finally:
            try:
                self._manager.close()
            finally:
                self._release_lock()

    def read_metadata(self, step: int) -> tuple[dict, dict]:
        """(metadata, iterator state) of `step`, without touching any arrays."""
        out = self._manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore(), iterator=IteratorRestore(None)))
        return dict(out["meta"]), dict(out["iterator"])

    def _restore_step(self, step: int, *, model, optimizer, iterator, pipeline, fingerprint, structure=None,
                      run_config=None, extras=None) -> dict:
        metadata, iterator_state = self.read_metadata(step)
        # Before any set-up check: a tampered state must count as damage, not as a foreign run.
        verify_iterator(metadata, iterator_state)
        joint = pipeline is not None
        if metadata.get("joint", False) != joint:
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {self.directory} was written with train_pipeline_params="
                f"{metadata.get('joint')}, this trainer has train_pipeline_params={joint}; use the same "
                "setting to resume, or start in a new directory")
        saved = metadata.get("pipeline_fingerprint")
        if fingerprint is not None and saved is not None and saved != fingerprint:
            differs = structure_differences(metadata.get("pipeline_structure"), structure)
            what = (f"another training pipeline: its {differs}" if differs else
                    f"a training pipeline with fingerprint {saved!r}, this one has {fingerprint!r} (different "
                    "source, shuffle seed, sampler, batch size or stages)")
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {self.directory} was written for {what}; rebuild the pipeline as it was, "
                "or use a new directory")
        saved_config = metadata.get("run_config")
        if run_config is not None and saved_config is not None and saved_config != run_config:
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {self.directory} was written under another configuration: "
                f"{config_differences(saved_config, run_config)}. A run must not adopt another run's checkpoint: "
                f"{RESUME_ANYWAY}")
        saved_layout = metadata.get("layout", {})
        extras = dict(extras or {})
        saved_extras = sorted(set(saved_layout) - set(CORE_ITEMS))
        if saved_extras != sorted(extras):
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {self.directory} holds the optional training state {saved_extras}, this "
                f"run has {sorted(extras)} (ema: Trainer(ema_decay=...), loss_scale: Trainer(precision='f16')); "
                "use the settings it was written with, or a new directory")
        modules = {"model": model, "optimizer": optimizer, **({"pipeline": pipeline} if joint else {}), **extras}
        for name, module in modules.items():
            current = layout(module)
            if saved_layout.get(name) != current:
                differs = self._layout_differences(step, name, module)
                raise CheckpointMismatchError(
                    f"checkpoint step {step} in {self.directory} holds a {name} state of a different structure: "
                    f"{differs or f'layout {saved_layout.get(name)!r}, this run has {current!r}'}; the {name} "
                    "was built differently (layers, sizes, dtypes or optimizer); rebuild it as it was, or use a new "
                    "directory")
        try:
            iterator.set_state(iterator_state)
        except IteratorStateError as exc:
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {self.directory} does not fit the training pipeline: {exc}") from exc
        items = {name: ocp.args.StandardRestore(abstract_target(module)) for name, module in modules.items()}
        out = self._manager.restore(step, args=ocp.args.Composite(**items))
        verify_arrays(metadata, {name: out[name] for name in items}, f"checkpoint step {step} in {self.directory}")
        for name, module in modules.items():
            load_into(module, out[name])
        return metadata

    def _layout_differences(self, step: int, name: str, module: nnx.Module) -> str:
        """The state paths whose shape or dtype differ between checkpoint `step`'s `name` and `module`
        (read from Orbax's array metadata, no array data); "" when they cannot be read."""
        try:
            saved_tree = ocp.StandardCheckpointHandler().metadata(self.directory / str(step) / name)
        except Exception:  # only the error message loses detail; the mismatch is still raised
            return ""
        return tree_differences(tree_shapes(saved_tree), tree_shapes(abstract_target(module)), name)

    def restore_best(self, *, model: nnx.Module, optimizer: nnx.Optimizer, iterator: Any,
                     pipeline: nnx.Module | None = None, fingerprint: str | None = None,
                     structure: dict | None = None, run_config: dict | None = None,
                     extras: dict[str, nnx.Module] | None = None) -> RestoredCheckpoint | None:
        """Restores the best checkpoint by `best_metric` (`best_step`), checked as `restore_latest`
        checks, into freshly built objects; None when no checkpoint carries a value of the metric.

        Raises:
            CheckpointMismatchError: the best step belongs to another set-up.
            CheckpointRestoreError: the best step cannot be read or fails its integrity check (it is
                not moved aside: it is not the run's resume point).
        """
        step = self.best_step()
        if step is None:
            return None
        initial_iterator_state = iterator.get_state()
        try:
            metadata = self._restore_step(step, model=model, optimizer=optimizer, iterator=iterator, pipeline=pipeline,
                                          fingerprint=fingerprint, structure=structure, run_config=run_config,
                                          extras=extras)
        except CheckpointMismatchError:
            raise
        except Exception as exc:
            iterator.set_state(initial_iterator_state)
            raise CheckpointRestoreError(f"the best checkpoint, step {step} in {self.directory} by "
                                         f"{self.best_metric}, could not be restored: {type(exc).__name__}: {exc}"
                                         ) from exc
        return RestoredCheckpoint(step=step, metadata=metadata)

    def restore_latest(self, *, model: nnx.Module, optimizer: nnx.Optimizer, iterator: Any,
                       pipeline: nnx.Module | None = None, fingerprint: str | None = None,
                       structure: dict | None = None, run_config: dict | None = None,
                       extras: dict[str, nnx.Module] | None = None) -> RestoredCheckpoint | None:
        """Restores the newest intact checkpoint into freshly built objects (None if there is none).

        An unreadable or damaged checkpoint warns (`CorruptCheckpointWarning`), is moved aside to
        `corrupt-<step>-<time>` and the previous one is tried. One written under another set-up
        raises `CheckpointMismatchError` naming what differs: a part of the pipeline's `structure`
        (`Pipeline.structure_parts`: source, sampler, num_records, batch_size, drop_remainder,
        stages), the state paths whose shape or dtype differ, or a key of `run_config`
        (`datarax.train.checkpointing.run_config`; None skips that check). When none can be restored this raises
        `CheckpointRestoreError`, unless `on_damaged="start_fresh"` (then it warns and returns None).
        """
        self.wait()
        self._manager.reload()
        initial_iterator_state = iterator.get_state()
        skipped = []
        steps = self.steps()
        for step in reversed(steps):
            try:
                metadata = self._restore_step(step, model=model, optimizer=optimizer, iterator=iterator,
                                              pipeline=pipeline, fingerprint=fingerprint, structure=structure,
                                              run_config=run_config, extras=extras)
            except CheckpointMismatchError:
                raise
            except Exception as exc:  # anything unreadable or damaged: report it and fall back
                reason = f"{type(exc).__name__}: {exc}"
                skipped.append((step, reason))
                aside = self._move_aside(step)
                warnings.warn(
                    f"checkpoint step {step} in {self.directory} could not be restored ({reason:.300}); "
                    f"moved it to {aside} and "
                    + ("falling back to the previous checkpoint" if step != steps[0]
                       else "no earlier checkpoint is left"),
                    CorruptCheckpointWarning, stacklevel=2)
                continue
            return RestoredCheckpoint(step=step, metadata=metadata, skipped=tuple(skipped))
        moved_earlier = [name for name in self.damaged_steps()
                         if not any(name.startswith(f"{CORRUPT_PREFIX}{s}-") for s, _ in skipped)]
        if not skipped and not moved_earlier:
            return None  # an empty directory: a first run
        iterator.set_state(initial_iterator_state)  # a damaged step may have set it
        details = "; ".join([f"step {s}: {r:.200}" for s, r in skipped]
                            + [f"{name} (moved aside by an earlier run)" for name in moved_earlier])
        if self.on_damaged == "start_fresh":
            warnings.warn(
                f"no checkpoint in {self.directory} could be restored ({details}); starting fresh from step 0 "
                "because on_damaged='start_fresh'; the damaged steps stay in corrupt-* for inspection",
                CorruptCheckpointWarning, stacklevel=2)
            return None
        raise CheckpointRestoreError(
            f"no checkpoint in {self.directory} could be restored ({details}); every run on this directory "
            "refuses to start rather than silently train from step 0. Copy an intact checkpoint into it, or "
            "start from step 0 on purpose with on_damaged='start_fresh' (an argument of CheckpointCallback and "
            f"Checkpointer, or the environment variable {ON_DAMAGED_ENV}=start_fresh)")

    def _move_aside(self, step: int) -> epath.Path:
        source = self.directory / str(step)
        target = self.directory / f"{CORRUPT_PREFIX}{step}-{time.strftime('%Y%m%d-%H%M%S')}"
        n = 1
        while target.exists():  # the same step damaged twice within a second (after a fresh start)
            n += 1
            target = self.directory / f"{CORRUPT_PREFIX}{step}-{time.strftime('%Y%m%d-%H%M%S')}-{n}"
        if source.exists():
            source.rename(target)
        self._manager.reload()
        return target
