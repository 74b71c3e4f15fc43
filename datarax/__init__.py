"""datarax: compiled, differentiable, exactly resumable data pipelines for JAX."""

from datarax.pipeline.pipeline import Pipeline as Pipeline

__version__ = "0.1.0"
