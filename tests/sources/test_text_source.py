"""`TextSource`: text that is not UTF-8 fails naming the document (index, file and line), never half-read."""

import pytest

from datarax.sources import CorruptFileError, TextSource


def test_from_files_reads_one_document_per_non_empty_line(tmp_path):
    (tmp_path / "a.txt").write_text("first\n\nsecond\n", encoding="utf-8")
    source = TextSource.from_files(tmp_path / "a.txt")
    assert source.texts([0, 1]) == ["first", "second"]


def test_a_file_that_is_not_utf8_fails_naming_the_file_and_line(tmp_path):
    (tmp_path / "good.txt").write_text("fine\n", encoding="utf-8")
    (tmp_path / "bad.txt").write_bytes(b"ok line\n" * 5000 + b"caf\xe9 latin-1\nmore\n")
    with pytest.raises(CorruptFileError, match=r"document 5001 \(.*bad\.txt:5001\) is not UTF-8 text"):
        TextSource.from_files([tmp_path / "good.txt", tmp_path / "bad.txt"])


@pytest.mark.parametrize("origins, named", [(None, r"documents\[2\] is"), (["a:1", "a:2", "b:7"], r"documents\[2\] "
                                                                                                  r"\(b:7\) is")])
def test_an_undecodable_document_is_named_by_index_and_origin(origins, named):
    with pytest.raises(CorruptFileError, match=rf"^TextSource {named} not UTF-8 text \(unexpected end of data at byte "
                                               rf"3: "
                                               r"b'caf\\xe9'\)"):
        TextSource(documents=["fine", b"also fine", b"caf\xe9"], origins=origins)


def edited_pair(tmp_path):
    """The same file before and after one line is edited (as many lines, as many bytes)."""
    lines = [f"w{i % 7} w{(3 * i) % 7} w{(5 * i) % 7}" for i in range(40)]
    (tmp_path / "t.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    before = TextSource.from_files(tmp_path / "t.txt")
    lines[17] = "w6 w6 w6"
    (tmp_path / "t.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return before, TextSource.from_files(tmp_path / "t.txt")


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({**{f"w{i}": i for i in range(7)}, "[UNK]": 7}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer


def pipelines(source):
    """What inherits the text's fingerprint: a Tokenize pipeline, a PackedTextSource, a BucketedPipeline."""
    import jax
    import numpy as np

    from datarax import Pipeline
    from datarax.host import HostStage, Tokenize
    from datarax.pipeline.buckets import BucketedPipeline
    from datarax.sources import PackedTextSource

    class Lengths(HostStage):
        def __init__(self, length):
            self.length = length

        def output_spec(self, spec):
            return {"n": jax.ShapeDtypeStruct((), np.int32)}

        def __call__(self, batch, ctx):
            return {"n": np.array([len(t) for t in batch["text"]], np.int32)}

    yield Pipeline(source, [Tokenize(tokenizer=word_tokenizer(), length=4)], batch_size=4)
    yield Pipeline(PackedTextSource(source=source, tokenizer=word_tokenizer(), seq_len=5, eos_id=7, shuffle=True),
                   [], batch_size=2)
    yield BucketedPipeline(source, np.full(len(source), 3), (8,), lambda n: [Lengths(n)], 4, seed=0)


def test_a_state_saved_over_other_text_is_refused(tmp_path):
    """One line edited between save and restore (same line count, same size): every pipeline over
    the text refuses the state with the fingerprint error instead of resuming into other documents."""
    from datarax.pipeline.state import IteratorStateError

    before, after = edited_pair(tmp_path)
    assert len(before) == len(after)
    for saved, fresh in zip(pipelines(before), pipelines(after)):
        iterator = iter(saved)
        next(iterator)
        state = iterator.get_state()
        with pytest.raises(IteratorStateError, match="fingerprint .* does not match"):
            iter(fresh).set_state(state)
    same = TextSource.from_files(tmp_path / "t.txt")
    assert same.structure() == after.structure() != before.structure()


def test_a_bare_carriage_return_stays_inside_its_line(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"one\rstill one\nwindows\r\n\nthree\n")
    source = TextSource.from_files(tmp_path / "a.txt")
    assert source.texts([0, 1, 2]) == ["one\rstill one", "windows", "three"]
    assert [source.describe_record(i).rsplit(":", 1)[1] for i in range(3)] == ["1", "2", "4"]
