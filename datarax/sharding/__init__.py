"""Sharding: global batches over a device mesh, per-process slices, host-count-independent streams."""

from datarax.sharding.mesh import DataSharding as DataSharding
from datarax.sharding.placement import BatchPlacement as BatchPlacement
from datarax.sharding.process import describe_processes as describe_processes
from datarax.sharding.process import is_multi_process as is_multi_process
from datarax.sharding.process import process_rows as process_rows
from datarax.sharding.process import rows_by_process as rows_by_process
