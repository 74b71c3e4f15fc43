"""PackedTextSource: rows against a pure-Python packer, round trips, exact epochs, resume, state errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from datarax import Pipeline
from datarax.pipeline.state import IteratorStateError
from datarax.sources import PackedTextSource, PackedTextSourceConfig, TextSource
from datarax.sources.packed_text import unpack_rows

VOCAB = 50
EOS = VOCAB
REPO = Path(__file__).resolve().parents[2]


def word_tokenizer() -> Tokenizer:
    """Word `w<i>` is token i: a document's tokens are known without the tokenizer."""
    vocab = {f"w{i}": i for i in range(VOCAB)}
    vocab["[EOS]"] = EOS
    vocab["[UNK]"] = EOS + 1
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


PROFILES = {"short": (0, 6), "mixed": (0, 40), "long": (30, 90)}


def corpus(n: int, profile: str, seed: int = 0) -> list[list[int]]:
    low, high = PROFILES[profile]
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, VOCAB, int(rng.integers(low, high + 1))).tolist() for _ in range(n)]
    docs[n // 2] = []  # an empty document, whatever the profile
    return docs


def texts(docs: list[list[int]]) -> list[str]:
    return [" ".join(f"w{t}" for t in doc) for doc in docs]


def reference_rows(docs: list[list[int]], cfg: PackedTextSourceConfig) -> dict[str, np.ndarray]:
    """The packing the module docstring describes, written token by token."""
    rows = []
    row = {"tokens": [], "segment_ids": [], "positions": [], "loss_mask": []}

    def close():
        if row["tokens"]:
            pad = cfg.seq_len - len(row["tokens"])
            rows.append({k: v + [cfg.pad_id if k == "tokens" else 0] * pad for k, v in row.items()})
            for v in row.values():
                v.clear()

    for doc in docs:
        doc = list(doc) + ([] if cfg.eos_id is None else [cfg.eos_id])
        if cfg.truncate and len(doc) > cfg.seq_len:
            doc = doc[:cfg.seq_len - 1] + [cfg.eos_id] if cfg.eos_id is not None else doc[:cfg.seq_len]
        if cfg.truncate and len(row["tokens"]) + len(doc) > cfg.seq_len:
            close()
        start = 0
        while start < len(doc):
            segment = max(row["segment_ids"], default=0) + 1
            take = min(len(doc) - start, cfg.seq_len - len(row["tokens"]))
            row["tokens"] += doc[start:start + take]
            row["segment_ids"] += [segment] * take
            row["positions"] += list(range(take))
            row["loss_mask"] += [not (cfg.mask_document_start and start == 0 and j == 0) for j in range(take)]
            start += take
            if len(row["tokens"]) == cfg.seq_len:
                close()
    close()
    return {k: np.array([r[k] for r in rows], bool if k == "loss_mask" else np.int32) for k in row}


def packed(docs, batch_size=3, **kwargs) -> tuple[PackedTextSource, Pipeline]:
    kwargs.setdefault("shuffle", True)
    source = PackedTextSource(source=TextSource(documents=texts(docs)), tokenizer=word_tokenizer(), **kwargs)
    return source, Pipeline(source, [], batch_size=batch_size)


def collect(batches) -> dict[str, np.ndarray]:
    batches = [{k: np.asarray(v) for k, v in b.items()} for b in batches]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


def epoch_docs(source: PackedTextSource, docs, epoch: int) -> list[list[int]]:
    return [docs[i] for i in source.document_order(np.arange(len(docs)), epoch)]


@pytest.mark.parametrize("seq_len", [1, 5, 16, 64])
@pytest.mark.parametrize("profile", list(PROFILES))
@pytest.mark.parametrize("eos_id, truncate, mask_document_start", [
    (None, False, False), (EOS, False, True), (None, True, False), (EOS, True, True)])
def test_rows_equal_the_reference_packer_and_unpack_to_the_epochs_documents(seq_len, profile, eos_id, truncate,
                                                                            mask_document_start):
    docs = corpus(23, profile, seed=seq_len)
    cfg = dict(seq_len=seq_len, eos_id=eos_id, truncate=truncate, mask_document_start=mask_document_start,
               block_size=4, seed=1, shuffle=True)
    if seq_len == 1 and truncate and eos_id is not None:  # rows of EOS only: refused (the test below)
        with pytest.raises(ValueError, match="only the EOS token"):
            PackedTextSourceConfig(**cfg)
        return
    source, pipeline = packed(docs, **cfg)
    rows = collect(pipeline)
    ordered = epoch_docs(source, docs, 0)
    expected = reference_rows(ordered, PackedTextSourceConfig(**cfg))
    for name in expected:
        np.testing.assert_array_equal(rows[name], expected[name], err_msg=name)
    # Round trip: the pieces in order are the epoch's documents (EOS and truncation as configured).
    eos = [] if eos_id is None else [eos_id]
    if truncate:
        kept = [(d + eos)[:seq_len] if eos_id is None or len(d) + 1 <= seq_len else d[:seq_len - 1] + eos
                for d in ordered]
        pieces = [p.tolist() for p in unpack_rows(rows["tokens"], rows["segment_ids"])]
        assert pieces == [d for d in kept if d]
    else:
        flat = np.concatenate(unpack_rows(rows["tokens"], rows["segment_ids"]))
        np.testing.assert_array_equal(flat, [t for d in ordered for t in d + eos])
        assert (rows["segment_ids"][:-1] > 0).all()  # every row but the last is full


def test_every_shuffled_epoch_uses_each_document_once():
    docs = [[i % VOCAB, (i * 7) % VOCAB, i // VOCAB] for i in range(200)]  # distinct documents
    source, pipeline = packed(docs, batch_size=4, seq_len=16, eos_id=EOS, truncate=True, seed=5)
    orders = []
    for epoch in range(3):
        rows = collect(pipeline)
        pieces = [tuple(p[:-1].tolist()) for p in unpack_rows(rows["tokens"], rows["segment_ids"])]
        assert sorted(pieces) == sorted(map(tuple, docs))
        assert pieces == [tuple(d) for d in epoch_docs(source, docs, epoch)]
        orders.append(pieces)
    assert orders[0] != orders[1] != orders[2]


def test_rows_do_not_depend_on_the_batch_size_or_block_size():
    docs = corpus(40, "mixed")
    reference = collect(packed(docs, batch_size=1, seq_len=12, eos_id=EOS, block_size=1)[1])
    for batch_size, block_size in ((5, 3), (64, 1000)):
        rows = collect(packed(docs, batch_size=batch_size, seq_len=12, eos_id=EOS, block_size=block_size)[1])
        for name in rows:
            np.testing.assert_array_equal(rows[name], reference[name])


@pytest.mark.parametrize("truncate", [False, True])
def test_a_state_saved_after_any_batch_resumes_with_the_same_rows(truncate):
    docs = corpus(30, "mixed", seed=4)
    kwargs = dict(batch_size=2, seq_len=10, eos_id=EOS, truncate=truncate, block_size=4)
    iterator = packed(docs, **kwargs)[1].epochs(2)
    batches, states = [], []
    for batch in iterator:
        batches.append({k: np.asarray(v) for k, v in batch.items()})
        states.append(json.loads(json.dumps(iterator.get_state())))
    for k in range(0, len(batches) - 1, 3):
        resumed = packed(docs, **kwargs)[1].epochs(2)
        resumed.set_state(states[k])
        rest = collect(resumed)
        expected = {name: np.concatenate([b[name] for b in batches[k + 1:]]) for name in rest}
        for name in rest:
            np.testing.assert_array_equal(rest[name], expected[name])


RESUME_SCRIPT = """
import json, sys
import warnings

import numpy as np
from datarax import Pipeline
from datarax.sources import PackedTextSource, TextSource
root = sys.argv[1]
source = PackedTextSource(source=TextSource.from_files([root + "/corpus.txt"]), tokenizer=root + "/tokenizer.json",
seq_len=24,
                          eos_id=50, block_size=8, seed=9, shuffle=True)
iterator = Pipeline(source, [], batch_size=4).epochs(None)
iterator.set_state(json.load(open(root + "/state.json")))
rows = [next(iterator) for _ in range(int(sys.argv[2]))]
iterator.close()  # a reader thread still tokenizing while the interpreter exits can abort it
np.save(root + "/rows.npy", np.stack([np.stack([np.asarray(r[k]) for k in sorted(r)]) for r in rows]))
"""


def test_a_state_saved_mid_epoch_resumes_in_a_fresh_process(tmp_path):
    docs = corpus(120, "mixed", seed=2)
    (tmp_path / "corpus.txt").write_text("\n".join(texts([d or [0] for d in docs])) + "\n")
    word_tokenizer().save(str(tmp_path / "tokenizer.json"))
    source = PackedTextSource(source=TextSource.from_files([tmp_path / "corpus.txt"]),
                              tokenizer=tmp_path / "tokenizer.json",
                              seq_len=24, eos_id=EOS, block_size=8, seed=9, shuffle=True)
    iterator = Pipeline(source, [], batch_size=4).epochs(None)
    for _ in range(5):
        next(iterator)
    state = iterator.get_state()
    assert state["stream"]["offset"] > 0 or state["stream"]["doc"] > 0
    (tmp_path / "state.json").write_text(json.dumps(state))
    expected = [next(iterator) for _ in range(8)]  # crosses into the next epoch
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(RESUME_SCRIPT), str(tmp_path), "8"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = np.load(tmp_path / "rows.npy")
    for got, batch in zip(rows, expected):
        np.testing.assert_array_equal(got, np.stack([np.asarray(batch[k]) for k in sorted(batch)]))


@pytest.mark.parametrize("state, match", [
    ("doc 3", "must be a dict with keys"),
    ({"doc": 3}, "must be a dict with keys"),
    ({"doc": -1, "offset": 0}, "doc must be an int >= 0"),
    ({"doc": 11, "offset": 0}, "does not fit this source of 10 documents"),
    ({"doc": 10, "offset": 2}, "does not fit this source of 10 documents"),
    ({"doc": 0, "offset": 10**6}, "cannot be emitted already"),
])
def test_a_wrong_state_is_refused(state, match):
    source = packed(corpus(10, "short"), seq_len=8)[0]
    with pytest.raises(ValueError, match=match):
        source.open(0, state)


def test_a_state_of_another_packing_is_refused_and_the_iterator_is_unchanged():
    docs = corpus(30, "mixed")
    iterator = packed(docs, seq_len=8)[1].epochs(1)
    next(iterator)
    foreign = packed(docs, seq_len=9)[1].epochs(1)
    next(foreign)
    before = iterator.get_state()
    with pytest.raises(IteratorStateError):
        iterator.set_state(foreign.get_state())
    assert iterator.get_state() == before


@pytest.mark.parametrize("kwargs, error, match", [
    ({"seq_len": 0}, ValueError, "seq_len"),
    ({"eos_id": -2}, ValueError, "eos_id"),
    ({"block_size": 0}, ValueError, "block_size"),
    ({"truncate": "yes"}, TypeError, "truncate"),
    ({"field": "body"}, KeyError, "'body' must be a text field"),
])
def test_config_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        PackedTextSource(source=TextSource(documents=["w1 w2"]), tokenizer=word_tokenizer(), shuffle=True, **kwargs)


def test_an_epoch_of_unknown_length_has_no_len():
    pipeline = packed(corpus(10, "short"), seq_len=8)[1]
    assert pipeline.source.num_records() is None
    with pytest.raises(TypeError, match="has no len"):
        len(pipeline)


def test_a_document_that_is_not_text_is_named():
    from datarax.sources import MemorySource, RecordError

    class Documents(MemorySource):
        """A source whose text field holds bytes, one of them not UTF-8."""

        def __init__(self):
            super().__init__(data={"n": np.arange(3)})

        def element_spec(self):
            import jax

            from datarax.core.fields import ENCODED

            return {"text": jax.ShapeDtypeStruct((), ENCODED)}

        def get_batch(self, indices, out=None):
            values = np.array([b"w1 w2", b"w3", b"\xff"], object)
            return {"text": values[np.asarray(indices)]}

        def describe_record(self, record_id):
            return f"docs.bin:{record_id}"

    source = PackedTextSource(source=Documents(), tokenizer=word_tokenizer(), seq_len=4, shuffle=False, block_size=2)
    reader = source.open(0, None)
    out = {k: np.zeros((4,) + v.shape, v.dtype) for k, v in source.element_spec().items()}
    with pytest.raises(RecordError, match=r"record 2 \(docs.bin:2\).*not UTF-8"):
        reader.read(out, 0, 4)


def test_shuffle_defaults_to_storage_order_as_in_every_source():
    source = PackedTextSource(source=TextSource(documents=["w1 w2"]), tokenizer=word_tokenizer())
    assert source.config.shuffle is False and source.order is None
    for shuffle in (True, False):
        assert PackedTextSourceConfig(shuffle=shuffle).shuffle is shuffle


def test_truncating_to_one_token_with_eos_is_refused_not_all_eos():
    with pytest.raises(ValueError, match=r"seq_len=1, truncate=True, eos_id=.*only the EOS token.*seq_len >= 2"):
        PackedTextSourceConfig(seq_len=1, eos_id=EOS, truncate=True, shuffle=False)
    assert PackedTextSourceConfig(seq_len=1, eos_id=None, truncate=True, shuffle=False).seq_len == 1
    assert PackedTextSourceConfig(seq_len=2, eos_id=EOS, truncate=True, shuffle=False).seq_len == 2
