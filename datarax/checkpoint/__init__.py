"""Checkpointing of pipeline iterators with Orbax."""

from datarax.checkpoint.orbax import IteratorCheckpointHandler as IteratorCheckpointHandler
from datarax.checkpoint.orbax import IteratorRestore as IteratorRestore
from datarax.checkpoint.orbax import IteratorSave as IteratorSave
