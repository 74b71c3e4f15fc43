"""Graph nodes: field routing (`SplitField`) and differentiable within-batch regrouping (`RebatchNode`)."""

from datarax.operators.nodes.rebatch import RebatchNode as RebatchNode
from datarax.operators.nodes.rebatch import RebatchNodeConfig as RebatchNodeConfig
from datarax.operators.nodes.split_field import SplitField as SplitField
from datarax.operators.nodes.split_field import SplitFieldConfig as SplitFieldConfig
