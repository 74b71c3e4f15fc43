import numpy as np
from flax import nnx

from datarax import Pipeline
from datarax import transforms as T
from datarax.sources import MemorySource

data = {
    "image": np.random.randint(0, 255, (1000, 28, 28, 1)).astype(np.uint8),
    "label": np.random.randint(0, 10, (1000,)).astype(np.int32),
}
pipeline = Pipeline(
    MemorySource(data),
    [T.ToFloat(field="image"), T.HorizontalFlip(field="image", rngs=nnx.Rngs(0))],
    batch_size=32,
)
for i, batch in enumerate(pipeline):
    if i >= 3:
        break
    print(f"Batch {i}: images {batch['image'].shape} {batch['image'].dtype}, labels {batch['label'].shape}")
