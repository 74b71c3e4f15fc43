"""Every host stage, and a pipeline holding it, pickles and deep-copies into one that gives the same output."""

from __future__ import annotations

import copy
import inspect
import io
import pickle
import wave

import jax
import numpy as np
import pytest

from datarax import Pipeline
from datarax.core.fields import ENCODED
from datarax.core.source import DataSourceModule, Handles
from datarax.host import DecodeAudio, DecodeImage, HostContext, HostMap, Tokenize
from datarax.host.stage import HostStage


def jpeg(seed: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (20, 24, 3), np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def wav(seed: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as f:
        f.setnchannels(1), f.setsampwidth(2), f.setframerate(8000)
        f.writeframes(np.random.default_rng(seed).integers(-3000, 3000, 1200, np.int16).tobytes())
    return buffer.getvalue()


def encoded(values: list) -> np.ndarray:
    out = np.empty(len(values), object)
    out[:] = values
    return out


def tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(9)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return tok


def byte_stats(record, rng):
    """A HostMap function (module level, so worker processes can import it); its output replaces the bytes."""
    data = np.frombuffer(record["image"], np.uint8)
    return {"image": np.array([data.sum(), len(data), rng.integers(0, 1000)], np.int64)}


def host_map(executor: str) -> HostMap:
    return HostMap(fn=byte_stats, outputs={"image": ((3,), np.int64)}, fields=("image",), stochastic=True, seed=3,
                   executor=executor, num_workers=2)


class EncodedSource(DataSourceModule):
    """Encoded records held in memory (MemorySource takes numeric arrays only)."""

    def __init__(self, field: str, values: np.ndarray):
        self.field, self.store = field, Handles(arrays={field: values})

    def __len__(self) -> int:
        return len(self.store.arrays[self.field])

    def element_spec(self):
        return {self.field: jax.ShapeDtypeStruct((), ENCODED)}

    def get_batch(self, indices, out=None):
        return {self.field: np.take(self.store.arrays[self.field], indices, mode="clip")}


CASES = {
    "DecodeImage": (lambda: DecodeImage(size=8, crop="random_resized", num_threads=2, seed=1),
                    lambda: ("image", encoded([jpeg(i) for i in range(4)]))),
    "DecodeAudio": (lambda: DecodeAudio(sample_rate=8000, length=400, num_threads=2),
                    lambda: ("audio", encoded([wav(i) for i in range(4)]))),
    "HostMap": (lambda: host_map("threads"), lambda: ("image", encoded([jpeg(i) for i in range(4)]))),
    "HostMap/processes": (lambda: host_map("processes"), lambda: ("image", encoded([jpeg(i) for i in range(4)]))),
    "Tokenize": (lambda: Tokenize(tokenizer=tokenizer(), length=6),
                 lambda: ("text", encoded(["w1 w2 w3", "w4", "w5 w6", "w7 w8 w9 w1 w2 w3 w4"]))),
}
CLONES = {"deepcopy": copy.deepcopy, "pickle": lambda x: pickle.loads(pickle.dumps(x))}


def test_every_host_stage_has_a_case():
    def subclasses(base):
        for sub in base.__subclasses__():
            yield sub
            yield from subclasses(sub)

    stages = {c.__name__ for c in subclasses(HostStage)  # not tests' own, nor the abstract DecodingStage
              if c.__module__.startswith("datarax.") and not inspect.isabstract(c)}
    assert stages == {name.split("/")[0] for name in CASES}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("clone", sorted(CLONES))
def test_a_copied_stage_gives_the_same_output(name, clone):
    make, batch = CASES[name]
    field, values = batch()
    stage = make()
    ctx = HostContext(np.arange(4, dtype=np.int64), epoch=1)
    want = stage({field: values}, ctx)
    copied = CLONES[clone](stage)
    got = copied({field: values}, ctx)
    assert sorted(got) == sorted(want) and copied.structure() == stage.structure()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    stage.close(), copied.close()


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("clone", sorted(CLONES))
def test_a_copied_pipeline_holding_the_stage_gives_the_same_batches(name, clone):
    make, batch = CASES[name]
    pipeline = Pipeline(EncodedSource(*batch()), [make()], batch_size=2)
    copied = CLONES[clone](pipeline)
    want, got = list(pipeline), list(copied)
    assert len(want) == len(got) == 2
    for a, b in zip(want, got):
        assert sorted(a) == sorted(b)
        for k in a:
            np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))
