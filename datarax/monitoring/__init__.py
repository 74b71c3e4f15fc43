"""datarax.monitoring: what a training loop sees of its data pipeline (see `PipelineMonitor`)."""

from datarax.monitoring.monitor import ConsoleReporter as ConsoleReporter
from datarax.monitoring.monitor import JsonlReporter as JsonlReporter
from datarax.monitoring.monitor import MonitoredIterator as MonitoredIterator
from datarax.monitoring.monitor import PipelineMonitor as PipelineMonitor
from datarax.monitoring.monitor import format_summary as format_summary
from datarax.monitoring.watcher import ReadyWatcher as ReadyWatcher
