"""Host stages: keyed by (seed, stage, epoch, record id), exact epochs, resume, errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from datarax import Pipeline
from datarax.core.errors import printable
from datarax.core.fields import ENCODED
from datarax.host import HostContext, HostStage
from datarax.host.stage import HostStageSource, first_rows, record_generator
from datarax.sources import MemorySource, MemorySourceConfig


class Jitter(HostStage):
    """Adds one keyed uniform draw per record: the record's 'crop offset'."""

    stochastic = True

    def __init__(self, seed=0):
        self.seed = seed

    def output_spec(self, spec):
        return {**spec, "offset": jax.ShapeDtypeStruct((), np.float64)}

    def __call__(self, batch, ctx: HostContext):
        offsets = np.array([ctx.generator(self.seed, row).random() for row in range(len(ctx.record_ids))])
        return {**batch, "offset": offsets}

    def structure(self):
        return f"Jitter(seed={self.seed})"


def build(n=50, batch_size=8, seed=0, stage_seed=0, stages=None):
    source = MemorySource(MemorySourceConfig(shuffle=True, seed=seed), data={"id": np.arange(n, dtype=np.int32)})
    return Pipeline(source, stages if stages is not None else [Jitter(stage_seed)], batch_size=batch_size)


def per_record(batches):
    batches = list(batches)  # iterating a pipeline again would be the next epoch
    ids = np.concatenate([np.asarray(b["id"]) for b in batches])
    offsets = np.concatenate([np.asarray(b["offset"]) for b in batches])
    return ids, offsets[np.argsort(ids)]


def test_the_generator_is_philox_keyed_by_seed_stage_epoch_and_record():
    a = record_generator(3, 0, 1, 17).random(4)
    np.testing.assert_array_equal(a, record_generator(3, 0, 1, 17).random(4))
    for other in [(4, 0, 1, 17), (3, 1, 1, 17), (3, 0, 2, 17), (3, 0, 1, 18)]:
        assert not np.array_equal(a, record_generator(*other).random(4))
    # The record and epoch sit in the high counter words: 10**5 draws never reach the next record's.
    long = record_generator(3, 0, 1, 17).random(10**5)
    assert not np.isin(record_generator(3, 0, 1, 18).random(4), long).any()


def test_every_epoch_is_a_permutation_and_draws_follow_the_record():
    pipeline = build(n=50, batch_size=8)
    (ids0, off0), (ids1, off1) = per_record(pipeline), per_record(pipeline)
    np.testing.assert_array_equal(np.sort(ids0), np.arange(50))
    np.testing.assert_array_equal(np.sort(ids1), np.arange(50))
    assert not np.array_equal(off0, off1)  # a new epoch, new draws
    reference = np.array([record_generator(0, 0, 0, r).random() for r in range(50)], np.float32)  # x64 is off
    np.testing.assert_array_equal(off0, reference)


@pytest.mark.parametrize("batch_size", [7, 64])
def test_draws_do_not_depend_on_batch_size_or_shuffle_seed(batch_size):
    base = per_record(build(batch_size=8))[1]
    np.testing.assert_array_equal(per_record(build(batch_size=batch_size))[1], base)
    np.testing.assert_array_equal(per_record(build(batch_size=8, seed=5))[1], base)


def test_resume_mid_epoch_gives_the_same_batches():
    it = build().epochs(2)
    for _ in range(9):
        next(it)
    state = it.get_state()
    rest = [np.asarray(b["offset"]) for b in it]
    fresh = build().epochs(2)
    fresh.set_state(state)
    np.testing.assert_array_equal(np.concatenate(rest), np.concatenate([np.asarray(b["offset"]) for b in fresh]))


def test_two_same_seeded_host_stages_draw_independently():
    class Second(Jitter):
        def output_spec(self, spec):
            return {**spec, "offset2": jax.ShapeDtypeStruct((), np.float64)}

        def __call__(self, batch, ctx):
            return {**batch, "offset2": np.array([ctx.generator(self.seed, r).random()
                                                  for r in range(len(ctx.record_ids))])}

    batch = next(iter(build(stages=[Jitter(0), Second(0)])))
    assert not np.array_equal(np.asarray(batch["offset"]), np.asarray(batch["offset2"]))


def test_the_fingerprint_names_the_host_stages():
    assert build(stage_seed=0).fingerprint != build(stage_seed=1).fingerprint


def test_errors_name_the_fix():
    class Encoded(MemorySource):
        def element_spec(self):
            return {**super().element_spec(), "jpeg": jax.ShapeDtypeStruct((), ENCODED)}

    source = Encoded(MemorySourceConfig(), data={"id": np.arange(4, dtype=np.int32)})
    with pytest.raises(TypeError, match=r"field 'jpeg' holds encoded records .* DecodeImage"):
        Pipeline(source, [], batch_size=2)
    from datarax.operators import MapOperator, MapOperatorConfig

    device = MapOperator(MapOperatorConfig(), fn=lambda x: x)
    with pytest.raises(ValueError, match=r"stages\[1\] \(Jitter\) is a host stage after a device stage"):
        build(stages=[device, Jitter()])


def test_the_documented_host_stage_subclass():
    """docs/sources.md's `ParseVector` example, run as written: numpy's parse of each record's text,
    jitter from the record's own generator, and an exact mid-epoch resume."""
    import pathlib
    import re

    from sources.source_checks import check_exact_resume

    from datarax.sources import TextSource

    docs = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "sources.md").read_text()
    section = docs[docs.index("### Writing your own host stage"):]
    namespace: dict = {}
    exec(re.search(r"```python\n(.*?)```", section, re.S).group(1), namespace)
    ParseVector = namespace["ParseVector"]
    texts = [",".join(str(i + 0.25 * k) for k in range(1 + i % 7)) for i in range(30)]
    parsed = np.zeros((30, 5), np.float32)
    for i, text in enumerate(texts):
        values = np.array([float(v) for v in text.split(",")], np.float32)[:5]
        parsed[i, :len(values)] = values

    def make(jitter=0.0):
        return Pipeline(TextSource(documents=texts, shuffle=True, seed=1),
                        [ParseVector(length=5, jitter=jitter, field="text", seed=3)], batch_size=4)

    plain = np.concatenate([np.asarray(b["vector"]) for b in make()])
    ids = plain[:, 0].astype(int)
    assert sorted(ids.tolist()) == list(range(30)) and not np.array_equal(ids, np.arange(30))
    np.testing.assert_array_equal(plain, parsed[ids])
    noisy = np.concatenate([np.asarray(b["vector"]) for b in make(0.1)])
    for row, record in enumerate(ids):
        noise = 0.1 * record_generator(3, 0, 0, int(record)).standard_normal(5, np.float32)
        np.testing.assert_allclose(noisy[row], parsed[record] + noise, rtol=1e-6)
    check_exact_resume(lambda: make(0.1), "vector", seed=2)
    with pytest.raises(KeyError, match=r"ParseVector field 'csv' is not in the records"):
        Pipeline(TextSource(documents=texts), [ParseVector(length=5)], batch_size=4)


@pytest.mark.parametrize("ids", [[7, 3, 7, 9, 9], [1], [], [5, 5, 5], [0, 1, 2]])
def test_first_rows_give_each_id_once_in_the_order_first_seen(ids):
    distinct, rows = first_rows(np.array(ids, np.int64))
    np.testing.assert_array_equal(distinct[rows], ids)
    assert distinct.tolist() == list(dict.fromkeys(ids))


@pytest.mark.parametrize("text,want", [("photos/a b.jpg", "photos/a b.jpg"), ("x\ny", r"x\ny"), ("\rz", r"\rz"),
                                       ("\x1b[31mred", r"\x1b[31mred"), ("tab\there", r"tab\there"),
                                       ("caf\u00e9", "caf\u00e9"), ("line\u2028sep", r"line\u2028sep")])
def test_printable_escapes_what_a_terminal_would_act_on(text, want):
    assert printable(text) == want


def test_repeated_records_in_a_batch_are_one_read_and_the_same_output():
    reads = []

    class Counted(MemorySource):
        def get_batch(self, indices, out=None):
            reads.append(np.asarray(indices).tolist())
            return super().get_batch(indices, out)

    source = Counted(MemorySourceConfig(), data={"x": np.arange(10.0)})
    host = HostStageSource(source, [Jitter(seed=3)])
    got = host.read(np.array([4, 2, 4, 4, 9]), epoch=1)
    assert reads == [[4, 2, 9]]
    np.testing.assert_array_equal(got["x"], [4, 2, 4, 4, 9])
    np.testing.assert_array_equal(got["offset"], [record_generator(3, 0, 1, r).random() for r in (4, 2, 4, 4, 9)])


def test_an_unseeded_stage_draws_from_the_pipelines_seed():
    """Stage seed None: the pipeline's seed (drawn from `Pipeline(rngs=...)`, 0 without) keys the
    stage, exactly as the reference generator keyed by that seed; a stage's own seed wins."""
    from flax import nnx

    from datarax.core.source import seed_from_rngs

    def offsets(stage, rngs):
        source = MemorySource(data={"id": np.arange(12, dtype=np.int32)})
        return np.concatenate([np.asarray(b["offset"]) for b in Pipeline(source, [stage], batch_size=4, rngs=rngs)])

    def reference(seed):
        return np.array([record_generator(seed, 0, 0, r).random() for r in range(12)], np.float32)  # on the device

    np.testing.assert_array_equal(offsets(Jitter(None), None), reference(0))  # no rngs: seed 0, as before
    for k in (1, 2):
        np.testing.assert_array_equal(offsets(Jitter(None), nnx.Rngs(k)), reference(seed_from_rngs(None, nnx.Rngs(k),
                                                                                                   "augment")))
    assert not np.array_equal(offsets(Jitter(None), nnx.Rngs(1)), offsets(Jitter(None), nnx.Rngs(2)))
    np.testing.assert_array_equal(offsets(Jitter(5), nnx.Rngs(1)), reference(5))
    np.testing.assert_array_equal(offsets(Jitter(5), nnx.Rngs(2)), reference(5))
    with pytest.raises(TypeError, match=r"rngs must be an nnx.Rngs \(e.g. nnx.Rngs\(0\)\) or None, got int 3"):
        Pipeline(MemorySource(data={"id": np.arange(4)}), [], batch_size=2, rngs=3)


def test_the_pipeline_seed_is_in_the_fingerprint_of_stages_that_draw_from_it():
    from flax import nnx

    source = MemorySource(data={"id": np.arange(8, dtype=np.int32)})
    prints = {k: Pipeline(source, [Jitter(None)], batch_size=4, rngs=None if k is None else nnx.Rngs(k)).fingerprint
              for k in (None, 1, 2)}
    assert len(set(prints.values())) == 3
    own = {k: Pipeline(source, [Jitter(5)], batch_size=4, rngs=nnx.Rngs(k)).fingerprint for k in (1, 2)}
    assert own[1] == own[2]


class PngSource(MemorySource):
    """`count` random 12x10 PNG images (field "image") and their labels."""

    def __init__(self, count: int):
        import io

        from PIL import Image

        super().__init__(MemorySourceConfig(), data={"label": np.arange(count, dtype=np.int32)})
        rng = np.random.default_rng(0)
        self.images = np.empty(count, object)
        for i in range(count):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (12, 10, 3), np.uint8)).save(buf, "PNG")
            self.images[i] = buf.getvalue()

    def element_spec(self):
        return {**super().element_spec(), "image": jax.ShapeDtypeStruct((), ENCODED)}

    def get_batch(self, indices, out=None):
        return {**super().get_batch(indices), "image": self.images[np.asarray(indices)]}


def test_the_last_stage_decodes_straight_into_the_reused_batch_buffer(monkeypatch):
    from datarax.core.fields import allocate
    from datarax.host import DecodeImage

    host = HostStageSource(PngSource(6), [DecodeImage(size=8, num_threads=1)])
    ring = allocate(host.element_spec(), (4,))
    targets = []
    decode_into = DecodeImage.decode_into

    def spy(self, data, rng, out):
        targets.append(np.shares_memory(out, ring["image"]))
        return decode_into(self, data, rng, out)

    monkeypatch.setattr(DecodeImage, "decode_into", spy)
    copies, copyto = [], np.copyto
    monkeypatch.setattr(np, "copyto", lambda dst, src, **kw: copies.append(dst.shape) or copyto(dst, src, **kw))
    indices = np.array([5, 0, 3, 1])
    got = host.read(indices, 0, out=ring)
    assert got is ring and targets == [True] * 4  # every record decoded into its row of the buffer
    assert copies == [(4,)]  # only the label is copied in; the pixels are already there
    fresh = host.read(indices, 0)  # without a buffer: the stage's own arrays, the same pixels
    for key in ("image", "label"):
        np.testing.assert_array_equal(ring[key], fresh[key])


def test_a_batch_with_repeated_records_still_fills_the_buffer_by_copy():
    from datarax.core.fields import allocate
    from datarax.host import DecodeImage

    host = HostStageSource(PngSource(6), [DecodeImage(size=8, num_threads=1)])
    ring = allocate(host.element_spec(), (4,))
    host.read(np.array([2, 4, 4, 4]), 0, out=ring)  # a final short batch's padding repeats its last record
    np.testing.assert_array_equal(ring["image"], host.read(np.array([2, 4, 4, 4]), 0)["image"])
    np.testing.assert_array_equal(ring["image"][2], ring["image"][1])
