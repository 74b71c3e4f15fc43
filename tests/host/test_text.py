"""Tokenize: HF `tokenizers` batch encoding against `encode_batch` padded by hand; TextSource epochs."""

from __future__ import annotations

import pydoc_data.topics

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from datarax import Pipeline
from datarax.host import HostContext, Tokenize, TokenizeConfig
from datarax.sources import RecordError, TextSource, TextSourceConfig

TOPICS = list(pydoc_data.topics.topics.values())


def train_tokenizer(vocab_size: int = 400) -> Tokenizer:
    """A byte-level BPE trained on the stdlib's pydoc topics (about 0.2 s) with a [CLS] x [SEP] post-processor."""
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
                                  show_progress=False)
    tokenizer.train_from_iterator(TOPICS, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                             special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


def documents(n: int = 60, seed: int = 0) -> list[str]:
    """Slices of the topics of varied lengths, empty ones included."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        text = TOPICS[i % len(TOPICS)]
        start = int(rng.integers(0, len(text)))
        docs.append(text[start:start + int(rng.integers(0, 600))] if i % 9 else "")
    return docs


def by_hand(tokenizer, texts, length, pad_id=0, add_special_tokens=True):
    ids = np.full((len(texts), length), pad_id, np.int32)
    lengths = np.zeros(len(texts), np.int32)
    for row, encoding in enumerate(tokenizer.encode_batch(texts, add_special_tokens=add_special_tokens)):
        kept = encoding.ids[:length]
        ids[row, :len(kept)] = kept
        lengths[row] = len(kept)
    return ids, lengths


def collect(pipeline):
    batches = [{k: np.asarray(v) for k, v in b.items()} for b in pipeline]
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.mark.parametrize("length", [1, 5, 64, 700])
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_tokenize_equals_encode_batch_padded_by_hand(tokenizer, length, add_special_tokens):
    docs = documents()
    stage = Tokenize(tokenizer=tokenizer, length=length, pad_id=7, add_special_tokens=add_special_tokens)
    out = collect(Pipeline(TextSource(documents=docs), [stage], batch_size=16))
    ids, lengths = by_hand(tokenizer, docs, length, 7, add_special_tokens)
    np.testing.assert_array_equal(out["text_ids"], ids)
    np.testing.assert_array_equal(out["text_length"], lengths)
    np.testing.assert_array_equal(out["text_mask"], np.arange(length) < lengths[:, None])
    assert out["text_ids"].dtype == np.int32 and out["text_mask"].dtype == bool and set(out) == {
        "text_ids", "text_mask", "text_length"}


@pytest.mark.parametrize("batch_size", [7, 64])
def test_every_shuffled_epoch_tokenizes_each_document_once_whatever_the_batch_size(tokenizer, batch_size):
    docs = [f"document number {i} " * (1 + i % 5) for i in range(100)]
    pipeline = Pipeline(TextSource(TextSourceConfig(shuffle=True, seed=3), documents=docs),
                        [Tokenize(tokenizer=tokenizer, length=32)],
                        batch_size=batch_size)
    expected, _ = by_hand(tokenizer, docs, 32)
    orders = []
    for _ in range(2):
        out = collect(pipeline)
        index = {row.tobytes(): i for i, row in enumerate(expected)}  # the documents' encodings are distinct
        order = [index[row.tobytes()] for row in out["text_ids"]]
        np.testing.assert_array_equal(np.sort(order), np.arange(100))
        orders.append(order)
    assert orders[0] != orders[1]


def test_other_fields_pass_through_and_bytes_are_decoded(tokenizer):
    batch = {"text": np.array([b"caf\xc3\xa9 au lait", "tea"], object), "label": np.array([3, 4])}
    out = Tokenize(tokenizer=tokenizer, length=8)(batch, HostContext(np.arange(2), 0))
    np.testing.assert_array_equal(out["label"], [3, 4])
    ids, _ = by_hand(tokenizer, ["café au lait", "tea"], 8)
    np.testing.assert_array_equal(out["text_ids"], ids)


def test_a_tokenizer_file_is_the_same_tokenizer_and_the_callers_object_is_left_alone(tokenizer, tmp_path):
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    padded = Tokenizer.from_file(str(path))
    padded.enable_padding(length=99)
    padded.enable_truncation(max_length=3)
    docs = documents(20)
    outs = [collect(Pipeline(TextSource(documents=docs), [Tokenize(tokenizer=t, length=40)],
                             batch_size=8)) for t in (tokenizer, path)]
    np.testing.assert_array_equal(outs[0]["text_ids"], outs[1]["text_ids"])
    # Padding and truncation of the caller's tokenizer are not the stage's: it pads and truncates itself.
    out = collect(Pipeline(TextSource(documents=docs), [Tokenize(tokenizer=padded, length=40)], batch_size=8))
    np.testing.assert_array_equal(out["text_ids"], outs[0]["text_ids"])
    assert padded.padding["length"] == 99 and padded.truncation["max_length"] == 3


def test_the_tokenizer_is_part_of_the_fingerprint(tokenizer):
    docs = documents(10)
    other = train_tokenizer(vocab_size=300)
    prints = {Pipeline(TextSource(documents=docs), [Tokenize(tokenizer=t, length=16)], batch_size=4).fingerprint
              for t in (tokenizer, tokenizer, other)}
    assert len(prints) == 2
    assert Tokenize(tokenizer=tokenizer, length=16).structure() != Tokenize(tokenizer=tokenizer, length=17).structure()


def test_the_tokenizer_by_position_is_the_same_stage(tokenizer):
    docs = documents(10)
    stages = [Tokenize(tokenizer, length=16), Tokenize(tokenizer=tokenizer, length=16),
              Tokenize(TokenizeConfig(length=16), tokenizer)]
    outs = [collect(Pipeline(TextSource(docs), [stage], batch_size=4)) for stage in stages]
    assert len({stage.structure() for stage in stages}) == 1
    for out in outs[1:]:
        np.testing.assert_array_equal(out["text_ids"], outs[0]["text_ids"])
    with pytest.raises(TypeError, match=r"Tokenize takes only tokenizer by position; pass the rest as keywords: "
                                        r"Tokenize\(tokenizer=\.\.\., field='text'\)"):
        Tokenize(tokenizer, "text")


def test_text_source_from_files_names_each_line(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("first line\n\nthird line\n", encoding="utf-8")
    source = TextSource.from_files([path])
    assert len(source) == 2 and source.texts(np.array([1, 0])) == ["third line", "first line"]
    assert source.describe_record(1) == f"{path}:3"


@pytest.mark.parametrize("kwargs, error, match", [
    ({"length": 0}, ValueError, "TokenizeConfig.length must be an int >= 1"),
    ({"field": ""}, ValueError, "TokenizeConfig.field"),
    ({"pad_id": -1}, ValueError, "TokenizeConfig.pad_id"),
    ({"add_special_tokens": 1}, TypeError, "add_special_tokens"),
])
def test_config_errors_name_the_field(tokenizer, kwargs, error, match):
    with pytest.raises(error, match=match):
        Tokenize(tokenizer=tokenizer, **kwargs)


def test_errors_name_the_problem(tokenizer, tmp_path):
    with pytest.raises(TypeError, match="tokenizers.Tokenizer or a path"):
        Tokenize(tokenizer=object(), length=4)
    with pytest.raises(ValueError, match="could not load a tokenizer"):
        Tokenize(tokenizer=tmp_path / "missing.json", length=4)
    with pytest.raises(TypeError, match="config or keyword fields"):
        Tokenize(TokenizeConfig(), tokenizer=tokenizer, length=4)
    with pytest.raises(KeyError, match="'body' is not in the records"):
        Pipeline(TextSource(documents=["a"]), [Tokenize(tokenizer=tokenizer, field="body")], batch_size=1)
    source = TextSource(documents=["ok", "bad"], origins=["a.txt:1", "a.txt:2"])
    batch = {"text": np.array(["ok", b"\xff\xfe"], object)}
    with pytest.raises(RecordError, match=r"record 1 \(a.txt:2\).*not UTF-8"):
        Tokenize(tokenizer=tokenizer, length=4)(batch, HostContext(np.arange(2), 0, 0, source.describe_record))
    with pytest.raises(TypeError, match="documents\\[1\\] is int"):
        TextSource(documents=["a", 3])
