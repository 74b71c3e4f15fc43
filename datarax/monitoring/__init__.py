"""datarax.monitoring: what a training loop sees of its data pipeline (see `PipelineMonitor`)."""

from datarax.monitoring.monitor import MonitoredIterator as MonitoredIterator
from datarax.monitoring.monitor import PipelineMonitor as PipelineMonitor
from datarax.monitoring.monitor import format_summary as format_summary
from datarax.monitoring.watcher import ReadyWatcher as ReadyWatcher
from datarax.monitoring.writers import ConsoleWriter as ConsoleWriter
from datarax.monitoring.writers import JsonlWriter as JsonlWriter
from datarax.monitoring.writers import MetricWriter as MetricWriter
