"""Operators: the stages of a pipeline, each an `nnx.Module`."""

from datarax.core.operator import BatchContext as BatchContext
from datarax.core.operator import OperatorConfig as OperatorConfig
from datarax.core.operator import OperatorModule as OperatorModule
from datarax.core.operator import PerRecordOperator as PerRecordOperator
from datarax.operators.dtype import ToFloatConfig as ToFloatConfig
from datarax.operators.dtype import ToFloatOperator as ToFloatOperator
from datarax.operators.element import ElementOperator as ElementOperator
from datarax.operators.element import ElementOperatorConfig as ElementOperatorConfig
from datarax.operators.field import FieldOperator as FieldOperator
from datarax.operators.field import FieldOperatorConfig as FieldOperatorConfig
from datarax.operators.map import MapOperator as MapOperator
from datarax.operators.map import MapOperatorConfig as MapOperatorConfig
