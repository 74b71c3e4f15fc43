"""`TextSource.from_files`: a file that is not UTF-8 fails naming the file and line, never half-read."""

import pytest

from datarax.sources import CorruptFileError, TextSource


def test_from_files_reads_one_document_per_non_empty_line(tmp_path):
    (tmp_path / "a.txt").write_text("first\n\nsecond\n", encoding="utf-8")
    source = TextSource.from_files(tmp_path / "a.txt")
    assert source.texts([0, 1]) == ["first", "second"]


def test_a_file_that_is_not_utf8_fails_naming_the_file_and_line(tmp_path):
    (tmp_path / "good.txt").write_text("fine\n", encoding="utf-8")
    (tmp_path / "bad.txt").write_bytes(b"ok line\n" * 5000 + b"caf\xe9 latin-1\nmore\n")
    with pytest.raises(CorruptFileError, match=r"'.*bad\.txt' is not UTF-8 text .* on line 5001"):
        TextSource.from_files([tmp_path / "good.txt", tmp_path / "bad.txt"])
