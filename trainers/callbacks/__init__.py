"""Callbacks for `trainers.Trainer`: the event contract and the built-in callbacks."""

from trainers.callbacks.base import Callback as Callback
from trainers.callbacks.base import CheckpointInfo as CheckpointInfo
from trainers.callbacks.base import Schedule as Schedule
from trainers.callbacks.base import StepLogs as StepLogs
from trainers.callbacks.checkpoint import CheckpointCallback as CheckpointCallback
