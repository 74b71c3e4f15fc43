"""Invariance learned by marginal likelihood: an invariant model and its Laplace hyper-step.

`InvariantModel` averages a network's outputs over copies of each record drawn by a pipeline's
own stages (keys by record identity); `MarginalLikelihood` learns the stages' magnitudes and a
prior precision from the model's Laplace evidence (`laplace`), every few steps, while the
training loss (`with_prior`: the MAP objective) trains the weights. docs/invariance.md is the guide.
"""

from datarax.train.invariance.laplace import LaplaceTerms as LaplaceTerms
from datarax.train.invariance.laplace import laplace_terms as laplace_terms
from datarax.train.invariance.laplace import log_marginal_likelihood as log_marginal_likelihood
from datarax.train.invariance.marglik import MarginalLikelihood as MarginalLikelihood
from datarax.train.invariance.marglik import MarginalLikelihoodConfig as MarginalLikelihoodConfig
from datarax.train.invariance.model import InvariantModel as InvariantModel
from datarax.train.invariance.model import PriorPrecision as PriorPrecision
from datarax.train.invariance.model import with_prior as with_prior
