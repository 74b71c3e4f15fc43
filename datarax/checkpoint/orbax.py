"""Saving and restoring pipeline iterators through Orbax's own extension points.

`IteratorCheckpointHandler` with `IteratorSave` / `IteratorRestore` (for a `CheckpointManager`),
and the Orbax v1 `save(directory)` / `load(directory)` coroutines (`iterator_save` /
`iterator_load`). One small JSON file per process; the state is global, so a checkpoint written
by N processes restores on M.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath


def _filename() -> str:
    return f"process_{jax.process_index()}-of-{jax.process_count()}.json"


def finalized_steps(directory: Any) -> list[int]:
    """The steps of the complete checkpoints in a `CheckpointManager` directory, oldest first, read
    without taking the run's lock: the digit-named step directories that Orbax counts as finalized
    (renamed from their temporary name on a local disk; holding `commit_success.txt` where Orbax
    commits by that file, as on GCS). Orbax decides, so this holds across its versions (before 0.12
    a renamed step directory holds no `commit_success.txt`)."""
    if directory is None or not epath.Path(directory).is_dir():
        return []
    return sorted(int(path.name) for path in ocp.path.step.checkpoint_steps_paths(directory) if path.name.isdigit())


def write_state(directory: Any, state: dict) -> None:
    directory = epath.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / _filename()).write_text(json.dumps(state, indent=1, sort_keys=True))


def read_state(directory: Any) -> dict:
    directory = epath.Path(directory)
    path = directory / _filename()
    if not path.exists():
        candidates = sorted(directory.glob("process_*-of-*.json")) if directory.exists() else []
        if not candidates:
            raise FileNotFoundError(f"no datarax iterator state in {directory}: expected {_filename()}; "
                                    "was the iterator saved into this checkpoint item?")
        path = candidates[0]
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"iterator state file {path} is not valid JSON ({exc}); the checkpoint is corrupt") from exc


class IteratorCheckpointHandler(ocp.CheckpointHandler):
    """Orbax handler for anything with `get_state()` / `set_state(state)` returning JSON-able dicts."""

    def save(self, directory: epath.Path, args: IteratorSave) -> None:
        write_state(directory, args.item.get_state())

    def restore(self, directory: epath.Path, args: IteratorRestore | None = None) -> Any:
        state = read_state(directory)
        if args is None or args.item is None:
            return state
        args.item.set_state(state)
        return args.item

    def metadata(self, directory: epath.Path) -> None:
        return None

    def finalize(self, directory: epath.Path) -> None:
        pass

    def close(self) -> None:
        pass


@ocp.args.register_with_handler(IteratorCheckpointHandler, for_save=True)
@dataclasses.dataclass
class IteratorSave(ocp.args.CheckpointArgs):
    """Save args: `item` is a pipeline iterator (or anything with get_state)."""

    item: Any


@ocp.args.register_with_handler(IteratorCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class IteratorRestore(ocp.args.CheckpointArgs):
    """Restore args: `item` is a freshly built iterator to restore into (None returns the state dict)."""

    item: Any = None


async def iterator_save(iterator: Any, directory: Any):
    """Orbax v1 `StatefulCheckpointable.save`: capture now, write in the background."""
    state = iterator.get_state()

    async def write():
        path = await directory.await_creation() if hasattr(directory, "await_creation") else directory
        await asyncio.to_thread(write_state, Path(str(path)), state)

    return write()


async def iterator_load(iterator: Any, directory: Any):
    """Orbax v1 `StatefulCheckpointable.load`."""

    async def read():
        iterator.set_state(await asyncio.to_thread(read_state, Path(str(directory))))

    return read()
