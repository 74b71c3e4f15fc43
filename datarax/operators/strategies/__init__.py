"""Composition strategies: small operators that combine other operators.

Each is an `OperatorModule`, so it works as a stage of a linear pipeline and as a DAG node.
"""

from datarax.operators.strategies.branch import BranchOperator as BranchOperator
from datarax.operators.strategies.branch import BranchOperatorConfig as BranchOperatorConfig
from datarax.operators.strategies.ensemble import EnsembleOperator as EnsembleOperator
from datarax.operators.strategies.ensemble import EnsembleOperatorConfig as EnsembleOperatorConfig
from datarax.operators.strategies.merge import MERGE_MODES as MERGE_MODES
from datarax.operators.strategies.merge import REDUCTIONS as REDUCTIONS
from datarax.operators.strategies.parallel import ParallelOperator as ParallelOperator
from datarax.operators.strategies.parallel import ParallelOperatorConfig as ParallelOperatorConfig
from datarax.operators.strategies.probabilistic import ProbabilisticOperator as ProbabilisticOperator
from datarax.operators.strategies.probabilistic import ProbabilisticOperatorConfig as ProbabilisticOperatorConfig
from datarax.operators.strategies.selector import SelectorOperator as SelectorOperator
from datarax.operators.strategies.selector import SelectorOperatorConfig as SelectorOperatorConfig
from datarax.operators.strategies.sequential import SequentialOperator as SequentialOperator
from datarax.operators.strategies.weighted import WeightedParallelOperator as WeightedParallelOperator
from datarax.operators.strategies.weighted import WeightedParallelOperatorConfig as WeightedParallelOperatorConfig
