"""A random-access source of text documents: a list of str, or the lines of text files.

Its one field holds a `str` per record (an encoded field, `datarax.core.fields.ENCODED`), so a pipeline
over it starts with a host stage that turns text into numbers (`datarax.host.Tokenize`), or it is
packed into fixed rows by `datarax.sources.PackedTextSource`.

    >>> source = TextSource(documents=["a first document", "a second one"])
    >>> source = TextSource.from_files(["train.txt"])  # one document per non-empty line
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import check_field_name, field
from datarax.core.construct import resolve_arguments
from datarax.core.errors import CorruptFileError
from datarax.core.fields import ENCODED
from datarax.core.source import DataSourceModule, Handles, ShuffleConfig, seed_from_rngs


@dataclasses.dataclass(frozen=True)
class TextSourceConfig(ShuffleConfig):
    """Configuration of a `TextSource`.

    Attributes:
        field: the name of the text field.
    """

    field: str = "text"

    def __post_init__(self):
        super().__post_init__()
        check_field_name(*field(self, "field"))


class TextSource(DataSourceModule):
    """Serves text documents held in memory, one `str` per record.

    Args:
        config: a `TextSourceConfig`; or its fields as keywords.
        documents: the documents (str; bytes are decoded as UTF-8), also by position
            (`TextSource(["a b", "c"], shuffle=True)`).
        origins: optional names of the records' origins (e.g. "train.txt:12"), for error messages.
        rngs: where an unset shuffle seed is drawn from.
    """

    positional = ("documents",)

    def __init__(self, config: TextSourceConfig | None = None, *args: Any, documents: Sequence[str] | None = None,
                 origins: Sequence[str] | None = None, rngs: nnx.Rngs | None = None, **settings: Any):
        config, documents = resolve_arguments(TextSourceConfig, config, settings, "TextSource",
                                              {"documents": documents}, args=args, positional=self.positional)
        if isinstance(documents, (str, bytes)) or not isinstance(documents, (Sequence, np.ndarray)):
            raise TypeError(f"documents must be a sequence of str, got {type(documents).__name__}; wrap one "
                            "document in a list")
        docs = [_text(d, i, origins) for i, d in enumerate(documents)]
        bad = next((i for i, d in enumerate(docs) if not isinstance(d, str)), None)
        if bad is not None:
            raise TypeError(f"documents[{bad}] is {type(docs[bad]).__name__}, not str")
        if not docs:
            raise ValueError("TextSource needs at least one document, got none")
        if origins is not None and len(origins) != len(docs):
            raise ValueError(f"origins must name every document: {len(origins)} origins for {len(docs)} documents")
        self.config = config
        self.seed = seed_from_rngs(config.seed, rngs)
        texts = np.empty(len(docs), dtype=object)
        texts[:] = docs
        self._store = Handles(arrays={config.field: texts})
        # Held outside NNX state, like the texts: a module attribute tuple would be walked as a graph node.
        self._origins = Handles(origins=None if origins is None else list(origins))
        self._digest = Handles(value=None)

    @classmethod
    def from_files(cls, paths: Sequence[str | os.PathLike], config: TextSourceConfig | None = None, *,
                   rngs: nnx.Rngs | None = None) -> TextSource:
        """One document per non-empty line of the UTF-8 text files `paths`, in order.

        Lines end at `\n` (a `\r\n` ending loses its `\r` too); a bare `\r` inside a line stays
        in its document, so `file:N` origins count the lines an editor shows.
        """
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        documents, origins = [], []
        for path in paths:
            earlier = len(documents)  # the documents of the files before this one
            try:
                with open(path, encoding="utf-8", newline="\n") as f:
                    for number, line in enumerate(f, 1):
                        line = line.removesuffix("\n").removesuffix("\r")
                        if line.strip():
                            documents.append(line)
                            origins.append(f"{os.fspath(path)}:{number}")
            except UnicodeDecodeError as exc:
                line = _first_undecodable_line(path)
                index = earlier + _documents_before(path, line)
                raise CorruptFileError(f"TextSource.from_files: document {index} ({os.fspath(path)}:{line}) is not "
                                       f"UTF-8 text ({exc.reason}); convert {os.fspath(path)!r} to UTF-8 (e.g. iconv "
                                       "-t utf-8) or leave it out of the paths") from None
        if not documents:
            raise ValueError(f"the files {[os.fspath(p) for p in paths]} hold no non-empty line")
        return cls(config, documents=documents, origins=origins, rngs=rngs)

    def __len__(self) -> int:
        return len(self._store.arrays[self.config.field])

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return {self.config.field: jax.ShapeDtypeStruct((), ENCODED)}

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        texts = np.take(self._store.arrays[self.config.field], indices, axis=0, mode="clip")
        if out is None:
            return {self.config.field: texts}
        out[self.config.field][...] = texts
        return out

    def texts(self, indices: np.ndarray) -> list[str]:
        """The documents at `indices` as a list (what a packer tokenizes)."""
        return np.take(self._store.arrays[self.config.field], indices, mode="clip").tolist()

    def describe_record(self, record_id: int) -> str:
        origins = self._origins.origins
        if origins is None or not 0 <= record_id < len(origins):
            return f"record {record_id}"
        return origins[record_id]

    def content_digest(self) -> str:
        """A BLAKE2b digest of every document, in order (computed once): the source's content."""
        if self._digest.value is None:
            digest = hashlib.blake2b(digest_size=16)
            for text in self._store.arrays[self.config.field]:
                data = text.encode("utf-8", "surrogatepass")
                digest.update(len(data).to_bytes(8, "little"))
                digest.update(data)
            self._digest.value = digest.hexdigest()
        return self._digest.value

    def structure(self) -> str:
        # The content, not only the count: a state saved over other text (one line edited, or
        # another corpus of as many lines) is refused instead of resuming into different documents.
        return f"TextSource(len={len(self)}, field={self.config.field!r}, content={self.content_digest()})"

    def __repr__(self) -> str:
        return f"TextSource({len(self)} documents, field={self.config.field!r})"


def _text(document: Any, index: int, origins: Sequence[str] | None) -> Any:
    """A document as str: bytes decoded as UTF-8, or a `CorruptFileError` naming the document."""
    if not isinstance(document, bytes):
        return document
    try:
        return document.decode("utf-8")
    except UnicodeDecodeError as exc:
        origin = f" ({origins[index]})" if origins is not None and index < len(origins) else ""
        raise CorruptFileError(f"TextSource documents[{index}]{origin} is not UTF-8 text ({exc.reason} at byte "
                               f"{exc.start}: {document[max(0, exc.start - 8):exc.start + 8]!r}); decode it yourself "
                               "with its encoding (bytes.decode('latin-1'), say) or leave it out") from None


def _documents_before(path: str | os.PathLike, line: int) -> int:
    """The non-empty lines of `path` before line `line` (the documents `from_files` made of them)."""
    with open(path, "rb") as f:
        return sum(1 for number, raw in enumerate(f, 1) if number < line and raw.strip())


def _first_undecodable_line(path: str | os.PathLike) -> int:
    # The text decoder reads ahead in blocks, so the line it was on when it failed is not exact.
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


def document_texts(source: Any, indices: np.ndarray, field_name: str) -> list[str]:
    """The values of the text field of the records at `indices` of any random-access source (str or bytes)."""
    if isinstance(source, TextSource):
        return source.texts(indices)
    return np.asarray(source.get_batch(np.asarray(indices, np.int64))[field_name]).reshape(-1).tolist()
