"""Callbacks for `datarax.train.Trainer`: the event contract and the built-in callbacks."""

from datarax.train.callbacks.base import Callback as Callback
from datarax.train.callbacks.base import CheckpointInfo as CheckpointInfo
from datarax.train.callbacks.base import Schedule as Schedule
from datarax.train.callbacks.base import StepLogs as StepLogs
from datarax.train.callbacks.checkpoint import CheckpointCallback as CheckpointCallback
from datarax.train.callbacks.early_stopping import EarlyStopping as EarlyStopping
from datarax.train.callbacks.goodput import GoodputMonitor as GoodputMonitor
from datarax.train.callbacks.guard import StepGuard as StepGuard
from datarax.train.callbacks.lr_logger import LearningRateLogger as LearningRateLogger
from datarax.train.callbacks.metric_logger import MetricLogger as MetricLogger
from datarax.train.callbacks.profiler import Profiler as Profiler
from datarax.train.callbacks.profiler import ProfilerConfig as ProfilerConfig
from datarax.train.callbacks.progress import ProgressBar as ProgressBar
from datarax.train.loop.guard import StepGuardConfig as StepGuardConfig
