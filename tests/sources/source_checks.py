"""Checks every source's tests share: epoch coverage and exact resume through a real Pipeline."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import jax
import numpy as np

from datarax import Pipeline
from datarax.host import HostStage


def epoch_values(pipeline: Pipeline, field: str) -> np.ndarray:
    """The values of `field` over the pipeline's next epoch, in order."""
    return np.concatenate([np.asarray(batch[field]) for batch in pipeline])


def check_shuffled_coverage(make_pipeline: Callable[[], Pipeline], field: str, expected: np.ndarray) -> None:
    """Each epoch holds every record exactly once, in an order that is neither storage order nor
    the previous epoch's."""
    pipeline = make_pipeline()
    first, second = epoch_values(pipeline, field), epoch_values(pipeline, field)
    for values in (first, second):
        np.testing.assert_array_equal(np.sort(values, axis=0), np.sort(expected, axis=0))
    assert not np.array_equal(first, expected), "shuffle=True but epoch 0 is in storage order"
    assert not np.array_equal(first, second), "epochs 0 and 1 came in the same order"


def check_exact_resume(make_pipeline: Callable[[], Pipeline], field: str | None, seed: int, epochs: int = 2) -> None:
    """Stopping at a random step, saving the state (through JSON) and restoring it into a freshly
    built pipeline continues with exactly the batches of an uninterrupted run (`field`, or every
    field when None)."""
    pick = (lambda b: {k: np.asarray(v) for k, v in b.items()}) if field is None else (lambda b: np.asarray(b[field]))
    reference = [pick(b) for b in make_pipeline().epochs(epochs)]
    stop = int(np.random.default_rng(seed).integers(1, len(reference) - 1))
    with make_pipeline().epochs(epochs) as interrupted:
        for _ in range(stop):
            next(interrupted)
        state = json.loads(json.dumps(interrupted.get_state()))
    with make_pipeline().epochs(epochs) as resumed:
        resumed.set_state(state)
        rest = [pick(b) for b in resumed]
    assert len(rest) == len(reference) - stop
    for got, want in zip(rest, reference[stop:]):
        if field is None:
            assert got.keys() == want.keys()
            for k in want:
                np.testing.assert_array_equal(got[k], want[k])
        else:
            np.testing.assert_array_equal(got, want)


def stream_batches(source, field: str, *, batch_size: int, epoch: int = 0, position: int = 0, state=None,
                   end_epoch: int = 1, drop_remainder: bool = False) -> list[tuple[np.ndarray, int, int, dict]]:
    """(valid values of `field`, epoch, position after, JSON round-tripped state after) per batch,
    read the way the pipeline iterator reads a stream source. Values are copied: on CPU a
    `device_put` of an aligned host buffer may alias it, and the reader reuses its buffers."""
    from datarax.control.producers import stream_host_batches

    out = []
    for ep, pos, _, valid, batch, after in stream_host_batches(
            source, batch_size=batch_size, drop_remainder=drop_remainder, ring_size=3, epoch=epoch,
            position=position, state=state, end_epoch=end_epoch):
        out.append((np.array(batch[field])[:valid].copy(), ep, pos + valid, json.loads(json.dumps(after))))
    return out


def pipeline_reads_streams() -> bool:
    """Whether the pipeline iterator consumes stream sources (the lead's iterator patch)."""
    import inspect

    from datarax.pipeline import iterator

    return "stream_host_batches" in inspect.getsource(iterator)


PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "immunohistochemistry", "hubble_deep_field")


def jpeg_photos(count: int) -> list[bytes]:
    """`count` distinct JPEG files of scikit-image's photographs, at a few sizes and qualities."""
    import PIL.Image
    import skimage.data

    out = []
    for i in range(count):
        photo = PIL.Image.fromarray(getattr(skimage.data, PHOTOS[i % len(PHOTOS)])())
        scale = 1 + i // len(PHOTOS)
        photo = photo.resize((max(16, photo.width // (2 * scale)), max(16, photo.height // (2 * scale))))
        buf = io.BytesIO()
        photo.save(buf, format="JPEG", quality=70 + i % 25)
        out.append(buf.getvalue())
    return out


def pillow_pixels(data: bytes, size: int = 24) -> np.ndarray:
    """A direct Pillow decode of JPEG bytes, resized to a small fixed RGB array."""
    import PIL.Image

    with PIL.Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB").resize((size, size), PIL.Image.BILINEAR))


class PillowDecode(HostStage):
    """A test-only image decoder (Pillow, one fixed size) that also looks up each file's index.

    The library's own decoder is tested on its own; this one only shows that bytes read by a
    source reach a host stage unchanged, so `index` says which file each record was.
    """

    def __init__(self, field: str, files: list[bytes]):
        self.field, self.index = field, {data: i for i, data in enumerate(files)}

    def output_spec(self, spec):
        return {**spec, self.field: jax.ShapeDtypeStruct((24, 24, 3), np.uint8),
                "index": jax.ShapeDtypeStruct((), np.int32)}

    def __call__(self, batch, ctx):
        files = batch[self.field].reshape(-1)
        return {**batch, self.field: np.stack([pillow_pixels(f) for f in files]),
                "index": np.array([self.index[f] for f in files], np.int32)}

    def structure(self):
        return f"PillowDecode({self.field!r}, {len(self.index)} files)"


def flac_tones(count: int, rate: int = 8000) -> list[bytes]:
    """`count` FLAC files of distinct sine tones, 0.25 to 0.7 s long."""
    import soundfile as sf

    out = []
    for i in range(count):
        t = np.arange(2000 + 120 * i) / rate
        buf = io.BytesIO()
        sf.write(buf, (0.5 * np.sin(2 * np.pi * (200 + 30 * i) * t)).astype(np.float32), rate, format="FLAC")
        out.append(buf.getvalue())
    return out
