"""One Orbax checkpoint per save: model, optimizer, data iterator and run metadata together.

On disk (`<directory>/<step>/`):

    model/        nnx.state(model)            Orbax StandardSave (OCDBT + zarr)
    optimizer/    nnx.state(optimizer)        Orbax StandardSave
    pipeline/     nnx.state(pipeline)         only when the pipeline is trained jointly
    iterator/     process_<i>-of-<n>.json     datarax IteratorSave (epoch, position, fingerprint)
    meta/         metadata                    JSON: step, epoch, pipeline fingerprint, callbacks

A step directory appears only when its save is complete (Orbax writes into
`<step>.orbax-checkpoint-tmp-*` and renames), so a run killed mid-save leaves the previous
checkpoint as the latest. A complete but unreadable latest checkpoint is reported with a warning,
moved aside to `corrupt-<step>-<time>`, and the previous one is restored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import warnings
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from datarax.core.checks import check_int
from datarax.checkpoint import IteratorRestore, IteratorSave
from datarax.pipeline.state import IteratorStateError

FORMAT_VERSION = 1


class CheckpointMismatchError(ValueError):
    """A checkpoint that is intact but was written by a different run set-up (data, batch size, model)."""


class CheckpointRestoreError(RuntimeError):
    """No checkpoint in the directory could be restored."""


class CheckpointSaveError(RuntimeError):
    """A checkpoint write failed (raised from the next save, `wait` or `close` when asynchronous)."""


class CorruptCheckpointWarning(UserWarning):
    """The latest checkpoint could not be read; an earlier one is used instead."""


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


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def savable(module: nnx.Module) -> dict:
    """The module's state as a pure dict of fresh arrays (PRNG keys as raw key data).

    The copies matter: the train step donates its inputs, so an asynchronous save must not hold
    the arrays the next step will overwrite.
    """
    pure = nnx.to_pure_dict(nnx.state(module))
    pure = jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, pure)
    return jax.device_put(pure, may_alias=False)


def abstract_target(module: nnx.Module) -> dict:
    """Shape/dtype/sharding of `savable(module)`, the restore target."""

    def spec(x):
        x = jax.random.key_data(x) if _is_key(x) else x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))

    return jax.tree.map(spec, nnx.to_pure_dict(nnx.state(module)))


def layout(module: nnx.Module) -> str:
    """A short hash of the state's paths, shapes and dtypes, to tell a foreign checkpoint from a corrupt one."""
    spec = jax.tree_util.tree_flatten_with_path(abstract_target(module))[0]
    text = json.dumps([(jax.tree_util.keystr(path), list(x.shape), str(x.dtype)) for path, x in spec])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_into(module: nnx.Module, restored: dict) -> None:
    """Writes a restored pure dict into `module`'s existing Variables (keys re-wrapped)."""
    state = nnx.state(module)
    current = nnx.to_pure_dict(state)
    fixed = jax.tree.map(
        lambda cur, new: jax.random.wrap_key_data(new, impl=jax.random.key_impl(cur)) if _is_key(cur) else new,
        current, restored)
    nnx.replace_by_pure_dict(state, fixed)
    nnx.update(module, state)


class Checkpointer:
    """Saves and restores a training run's state through one Orbax `CheckpointManager`.

    Args:
        directory: the checkpoint root (created if missing).
        max_to_keep: how many of the newest checkpoints to keep (None: all).
        asynchronous: write arrays in the background; errors of a background write are raised
            by the next `save`, by `wait`, or by `close`, never swallowed.
    """

    def __init__(self, directory: Any, *, max_to_keep: int | None = 3, asynchronous: bool = True):
        check_int(max_to_keep, "max_to_keep", 1, allow_none=True, why=" (keep all)")
        self.directory = epath.Path(directory).absolute()
        policy = None if max_to_keep is None else ocp.checkpoint_managers.LatestN(max_to_keep)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                preservation_policy=policy, enable_async_checkpointing=asynchronous,
                cleanup_tmp_directories=True, create=True),
        )
        self._in_flight: int | None = None

    def steps(self) -> list[int]:
        """Complete checkpoints on disk, oldest first."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, *, model: nnx.Module, optimizer: nnx.Optimizer, iterator: Any,
             metadata: dict, pipeline: nnx.Module | None = None) -> bool:
        """Starts saving `step` (always, whatever the interval); False if it already exists.

        Waits for the previous background save first (as Orbax does) and raises its error.
        """
        self.wait()
        if step in self._manager.all_steps():
            return False
        items = {
            "model": ocp.args.StandardSave(savable(model)),
            "optimizer": ocp.args.StandardSave(savable(optimizer)),
            "iterator": IteratorSave(_FrozenIteratorState(iterator.get_state())),
            "meta": ocp.args.JsonSave({**metadata, "step": step, "format_version": FORMAT_VERSION,
                                       "joint": pipeline is not None,
                                       "layout": self._layouts(model, optimizer, pipeline)}),
        }
        if pipeline is not None:
            items["pipeline"] = ocp.args.StandardSave(savable(pipeline))
        try:
            saved = bool(self._manager.save(step, args=ocp.args.Composite(**items), force=True))
        except Exception as exc:
            raise CheckpointSaveError(f"saving checkpoint step {step} to {self.directory} failed: "
                                      f"{type(exc).__name__}: {exc}") from exc
        self._in_flight = step if saved else None
        return saved

    @staticmethod
    def _layouts(model, optimizer, pipeline) -> dict:
        out = {"model": layout(model), "optimizer": layout(optimizer)}
        if pipeline is not None:
            out["pipeline"] = layout(pipeline)
        return out

    def wait(self) -> None:
        """Blocks until background writes finish; raises `CheckpointSaveError` if one failed."""
        step, self._in_flight = self._in_flight, None
        try:
            self._manager.wait_until_finished()
            self._manager.check_for_errors()
        except Exception as exc:
            raise CheckpointSaveError(
                f"the background write of checkpoint step {step} to {self.directory} failed: "
                f"{type(exc).__name__}: {exc}; the checkpoint was not committed (the previous one is intact)"
            ) from exc

    def close(self) -> None:
        """Waits for background writes (raising their error) and releases the manager."""
        try:
            self.wait()
        finally:
            self._manager.close()

    def read_metadata(self, step: int) -> tuple[dict, dict]:
        """(metadata, iterator state) of `step`, without touching any arrays."""
        out = self._manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore(), iterator=IteratorRestore(None)))
        return dict(out["meta"]), dict(out["iterator"])

    def _restore_step(self, step: int, *, model, optimizer, iterator, pipeline, fingerprint) -> dict:
        metadata, iterator_state = self.read_metadata(step)
        joint = pipeline is not None
        if metadata.get("joint", False) != joint:
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {self.directory} was written with train_pipeline_params="
                f"{metadata.get('joint')}, this trainer has train_pipeline_params={joint}; use the same "
                "setting to resume, or start in a new directory")
        saved = metadata.get("pipeline_fingerprint")
        if fingerprint is not None and saved is not None and saved != fingerprint:
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {self.directory} was written for a training pipeline with "
                f"fingerprint {saved!r}, this one has {fingerprint!r} (different source, shuffle seed, "
                "sampler, batch size or stages); rebuild the pipeline as it was, or use a new directory")
        saved_layout = metadata.get("layout", {})
        for name, current in self._layouts(model, optimizer, pipeline).items():
            if saved_layout.get(name) != current:
                raise CheckpointMismatchError(
                    f"checkpoint step {step} in {self.directory} holds a {name} state of a different structure "
                    f"(layout {saved_layout.get(name)!r}, this run's is {current!r}): the {name} was built "
                    "differently (layers, sizes, dtypes or optimizer); rebuild it as it was, or use a new directory")
        try:
            iterator.set_state(iterator_state)
        except IteratorStateError as exc:
            raise CheckpointMismatchError(
                f"checkpoint step {step} in {self.directory} does not fit the training pipeline: {exc}") from exc
        items = {"model": ocp.args.StandardRestore(abstract_target(model)),
                 "optimizer": ocp.args.StandardRestore(abstract_target(optimizer))}
        if joint:
            items["pipeline"] = ocp.args.StandardRestore(abstract_target(pipeline))
        out = self._manager.restore(step, args=ocp.args.Composite(**items))
        load_into(model, out["model"])
        load_into(optimizer, out["optimizer"])
        if joint:
            load_into(pipeline, out["pipeline"])
        return metadata

    def restore_latest(self, *, model: nnx.Module, optimizer: nnx.Optimizer, iterator: Any,
                       pipeline: nnx.Module | None = None, fingerprint: str | None = None
                       ) -> RestoredCheckpoint | None:
        """Restores the newest readable checkpoint into freshly built objects (None if there is none).

        A checkpoint that cannot be read is reported with a `CorruptCheckpointWarning`, moved
        aside, and the previous one is tried. A checkpoint that reads fine but belongs to a
        different set-up raises `CheckpointMismatchError`.
        """
        self._manager.reload()
        skipped = []
        for step in reversed(self.steps()):
            try:
                metadata = self._restore_step(step, model=model, optimizer=optimizer, iterator=iterator,
                                              pipeline=pipeline, fingerprint=fingerprint)
            except CheckpointMismatchError:
                raise
            except Exception as exc:  # anything unreadable: report it and fall back
                reason = f"{type(exc).__name__}: {exc}"
                skipped.append((step, reason))
                aside = self._move_aside(step)
                warnings.warn(
                    f"checkpoint step {step} in {self.directory} could not be restored ({reason:.300}); "
                    f"moved it to {aside} and falling back to the previous checkpoint",
                    CorruptCheckpointWarning, stacklevel=2)
                continue
            return RestoredCheckpoint(step=step, metadata=metadata, skipped=tuple(skipped))
        if skipped:
            details = "; ".join(f"step {s}: {r:.200}" for s, r in skipped)
            raise CheckpointRestoreError(
                f"no checkpoint in {self.directory} could be restored ({details}); delete the directory "
                "to start fresh, or point the run at an intact copy")
        return None

    def _move_aside(self, step: int) -> epath.Path:
        source = self.directory / str(step)
        target = self.directory / f"corrupt-{step}-{time.strftime('%Y%m%d-%H%M%S')}"
        if source.exists():
            source.rename(target)
        self._manager.reload()
        return target
