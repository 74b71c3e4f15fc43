"""Checkpointing: pipeline iterators in Orbax, and the checkpoint directory's own machinery.

`IteratorSave` / `IteratorRestore` (with `IteratorCheckpointHandler`) put a pipeline iterator into
any Orbax checkpoint. The rest is what a checkpoint of model, optimizer and iterator needs whoever
writes it: the errors and warnings of saving and restoring, integrity hashes of what was written
(`integrity`, `hashing`), pure-dict trees of a module's state (`trees`), what a directory keeps
(`policies`), and one writer per directory (`locking`). The training kit's `Checkpointer`
(`datarax.train.checkpointing`), which restores straight into a pipeline's iterator and checks a
run's configuration, builds on these; it stays in the kit because it sits above `datarax.pipeline`,
and this package sits below it (`datarax.pipeline.state` saves through `orbax`).
"""

from datarax.checkpoint.errors import CheckpointMismatchError as CheckpointMismatchError
from datarax.checkpoint.errors import CheckpointRestoreError as CheckpointRestoreError
from datarax.checkpoint.errors import CheckpointSaveError as CheckpointSaveError
from datarax.checkpoint.errors import CorruptCheckpointWarning as CorruptCheckpointWarning
from datarax.checkpoint.hashing import state_sha256 as state_sha256
from datarax.checkpoint.integrity import CheckpointIntegrityError as CheckpointIntegrityError
from datarax.checkpoint.integrity import UnverifiedCheckpointWarning as UnverifiedCheckpointWarning
from datarax.checkpoint.locking import CheckpointLockedError as CheckpointLockedError
from datarax.checkpoint.locking import run_script as run_script
from datarax.checkpoint.orbax import IteratorCheckpointHandler as IteratorCheckpointHandler
from datarax.checkpoint.orbax import IteratorRestore as IteratorRestore
from datarax.checkpoint.orbax import IteratorSave as IteratorSave
