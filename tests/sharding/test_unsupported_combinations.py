"""Features that run unsharded batches refuse a sharded pipeline with a clear error."""

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh

from datarax import Pipeline
from datarax.pipeline.scan import ScanRunner
from datarax.sharding import DataSharding
from datarax.sources import MemorySource, MemorySourceConfig
from datarax.train import Trainer


def sharded_pipeline():
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    source = MemorySource(MemorySourceConfig(), data={"x": np.zeros((16, 2), np.float32)})
    return Pipeline(source, batch_size=4, sharding=DataSharding(mesh, batch_axes="data"))


def test_scan_rejects_sharded_pipelines():
    pipeline = sharded_pipeline()
    with pytest.raises(ValueError, match=r"ScanRunner runs unsharded batches, but this pipeline has sharding="):
        ScanRunner(lambda batch: batch, steps_per_call=2).run(iter(pipeline))


def test_joint_training_rejects_sharded_pipelines():
    model = nnx.Linear(2, 1, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"train_pipeline_params=True trains on unsharded batches"):
        Trainer(model, optax.sgd(0.1), sharded_pipeline(), loss_fn=lambda m, b: (m(b["x"]) ** 2).mean(),
                train_pipeline_params=True)
