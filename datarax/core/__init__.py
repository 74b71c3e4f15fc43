"""Base types and contracts: records, operators, sources."""

from datarax.core.element import Element as Element
from datarax.core.operator import BatchContext as BatchContext
from datarax.core.operator import OperatorConfig as OperatorConfig
from datarax.core.operator import OperatorModule as OperatorModule
from datarax.core.operator import PerRecordOperator as PerRecordOperator
from datarax.core.source import DataSourceModule as DataSourceModule
