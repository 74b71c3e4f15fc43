"""`Pipeline.replay`: a batch rebuilt from (epoch, position) equals the one iteration gave, bitwise, and
its reported draws reproduce it from the files through an independent Pillow + numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx
from PIL import Image

from datarax import Pipeline
from datarax.host import DecodeImage
from datarax.operators import ToFloatOperator
from datarax.operators.image import HorizontalFlipOperator, RandomCropOperator, RotationOperator
from datarax.pipeline.replay import ReplayError
from datarax.sources import ImageFolderSource, MemorySource, MemorySourceConfig, MixDataSources
from datarax.sources.stream import StreamSourceModule

SIZE, PAD = 8, 2


@pytest.fixture(scope="module")
def image_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    for label in ("a", "b"):
        (root / label).mkdir()
        for i in range(5):
            pixels = np.random.default_rng(10 * (label == "b") + i).integers(0, 256, (14 + i, 18, 3), np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i}.png")
    return root


def image_pipeline(root, **kwargs) -> Pipeline:
    source = ImageFolderSource(root, shuffle=True, seed=4)
    stages = [DecodeImage(SIZE, crop="random_resized", scale=(0.4, 1.0), backend="pillow", executor="threads",
                          num_threads=1),
              ToFloatOperator(), RandomCropOperator(size=SIZE, padding=PAD, rngs=nnx.Rngs(1)),
              HorizontalFlipOperator(rngs=nnx.Rngs(2))]
    return Pipeline(source, stages, batch_size=4, rngs=nnx.Rngs(augment=7), **kwargs)


def reference_image(path: str, box: list[int], crop: dict, flip: bool) -> np.ndarray:
    """The record from its file and its draws: Pillow's box resize, then numpy's pad, crop and flip."""
    top, left, h, w = box
    decoded = np.asarray(Image.open(path).convert("RGB").resize((SIZE, SIZE), Image.BILINEAR,
                                                                box=(left, top, left + w, top + h)))
    padded = np.pad(decoded.astype(np.float32) / 255.0, ((PAD, PAD), (PAD, PAD), (0, 0)))
    out = padded[crop["top"]:crop["top"] + SIZE, crop["left"]:crop["left"] + SIZE]
    return out[:, ::-1] if flip else out


def test_replay_is_the_iterated_batch_and_its_draws_rebuild_it_from_the_files(image_root):
    pipeline = image_pipeline(image_root)
    iterated = [(e, b) for e in range(2) for b in pipeline]  # 3 batches an epoch, the last one short
    paths = sorted(str(p) for p in image_root.glob("*/*.png"))  # the folder's record order: class, then name
    position = {0: 0, 1: 0}
    for epoch, batch in iterated:
        replayed = pipeline.replay(epoch, position[epoch])
        position[epoch] += len(batch["label"])
        assert replayed.batch.keys() == batch.keys()
        for name, values in batch.items():
            np.testing.assert_array_equal(replayed.batch[name], np.asarray(values), strict=True)
        assert replayed.origins == [paths[i] for i in replayed.record_ids]
        np.testing.assert_array_equal(replayed.batch["label"], ["ab".index(paths[i].split("/")[-2])
                                                                 for i in replayed.record_ids])
        host = replayed.draws["host[0] DecodeImage"]
        crop = replayed.draws["stages[1] RandomCropOperator"]
        flip = replayed.draws["stages[2] HorizontalFlipOperator"]
        for row, record in enumerate(replayed.record_ids):
            want = reference_image(paths[record], host["box"][row].tolist(),
                                   {k: int(v[row]) for k, v in crop.items()}, bool(flip["apply"][row]))
            np.testing.assert_allclose(replayed.batch["image"][row], want, rtol=0, atol=1e-6)
    assert position == {0: 10, 1: 10}


def test_replay_of_a_device_resident_dag_across_an_epoch_boundary():
    data = {"x": np.random.default_rng(0).random((11, 6, 6, 3), np.float32), "id": np.arange(11, dtype=np.int32)}
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=2, device_resident=True), data=data)
    pipeline = Pipeline.from_dag(
        source=source, nodes={"rotate": RotationOperator(field="x", degrees=30.0, rngs=nnx.Rngs(3)),
                              "flip": HorizontalFlipOperator(field="x", rngs=nnx.Rngs(4))},
        edges={"rotate": [], "flip": ["rotate"]}, sink="flip", batch_size=4)
    iterated = [(e, b) for e in range(3) for b in pipeline]
    starts = [0, 4, 8] * 3
    for (epoch, batch), position in zip(iterated, starts):
        replayed = pipeline.replay(epoch, position)
        for name, values in batch.items():
            np.testing.assert_array_equal(replayed.batch[name], np.asarray(values), strict=True)
        np.testing.assert_array_equal(replayed.record_ids, replayed.batch["id"])
        assert set(replayed.draws) == {"nodes.rotate RotationOperator", "nodes.flip HorizontalFlipOperator"}
        assert replayed.draws["nodes.rotate RotationOperator"]["angle"].shape == (len(batch["id"]),)
        assert np.all(np.abs(replayed.draws["nodes.rotate RotationOperator"]["angle"]) <= 30.0)


def test_a_mixture_names_each_records_component():
    parts = [MemorySource(data={"v": np.full(n, k, np.float32)}) for k, n in enumerate((5, 3))]
    pipeline = Pipeline(MixDataSources(weights=(0.5, 0.5), seed=1, sources=parts), batch_size=4)
    replayed = pipeline.replay(0, 4)
    offsets = np.array([0, 5])
    for record, origin, value in zip(replayed.record_ids, replayed.origins, replayed.batch["v"]):
        component = int(record >= 5)
        assert origin == f"source {component} (record {record - offsets[component]})"
        assert value == component


def test_refusals_name_the_reason():
    class Stream(StreamSourceModule):
        def element_spec(self):
            return MemorySource(data={"v": np.zeros(2, np.float32)}).element_spec()

        def num_records(self):
            return None

        def open(self, epoch, state=None):
            raise AssertionError("a refused replay reads nothing")

    stream = Pipeline(Stream(), batch_size=2)
    with pytest.raises(ReplayError, match="a stream without random access: its batch at a position is only reached"):
        stream.replay(0, 0)
    dropping = Pipeline(MemorySource(data={"v": np.zeros(10, np.float32)}), batch_size=4, drop_remainder=True)
    with pytest.raises(ReplayError, match="short final batch of 2 records, which this pipeline drops"):
        dropping.replay(0, 8)
    with pytest.raises(ValueError, match="position must be"):
        dropping.replay(0, 10)
