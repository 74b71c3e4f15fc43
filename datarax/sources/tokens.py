"""The HF `tokenizers` helpers of the text readers (`PackedTextSource`, the `Tokenize` host stage):
load a private copy of a tokenizer, encode a batch in one Rust call, decode bytes to text."""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from datarax.core.checks import require
from datarax.core.errors import RecordError


def load_tokenizer(tokenizer: Any, owner: str) -> tuple[Any, str]:
    """`(a private copy of the tokenizer, a hash of its JSON)` from a `tokenizers.Tokenizer` or a path.

    The copy has padding and truncation off.
    """
    tokenizers = require("tokenizers", owner=owner, extra="text")
    if isinstance(tokenizer, (str, os.PathLike)):
        try:
            tokenizer = tokenizers.Tokenizer.from_file(os.fspath(tokenizer))
        except Exception as exc:  # the Rust side raises a bare Exception for a missing or bad file
            raise ValueError(f"{owner} could not load a tokenizer from {os.fspath(tokenizer)!r}: {exc}; pass a "
                             "tokenizer.json path or a tokenizers.Tokenizer") from exc
    if not isinstance(tokenizer, tokenizers.Tokenizer):
        raise TypeError(f"{owner} tokenizer must be a tokenizers.Tokenizer or a path to a tokenizer.json, got "
                        f"{type(tokenizer).__name__}; for a transformers tokenizer pass its `.backend_tokenizer`")
    text = tokenizer.to_str()
    copy = tokenizers.Tokenizer.from_str(text)
    copy.no_padding()
    copy.no_truncation()
    return copy, hashlib.sha256(text.encode()).hexdigest()[:16]


def encode(tokenizer: Any, texts: list, add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
    """`(flat int32 token ids, int64 lengths)` of `texts`, in one `encode_batch_fast` call."""
    batch_encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    encodings = batch_encode(texts, add_special_tokens=add_special_tokens)
    ids = [e.ids for e in encodings]
    lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(lengths.sum()))
    return flat, lengths


def as_texts(texts: list, field_name: str, where: Callable[[int], str], owner: str) -> list:
    """`texts` with UTF-8 bytes decoded, or a `RecordError` naming the first record that is not text."""
    texts = list(texts)
    for row, text in enumerate(texts):
        if isinstance(text, bytes):
            try:
                texts[row] = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RecordError(f"{owner}: {where(row)} field {field_name!r} is not UTF-8 text: {exc}") from exc
        elif not isinstance(text, str):
            raise RecordError(f"{owner}: {where(row)} field {field_name!r} holds {type(text).__name__}, "
                              "not str or bytes")
    return texts
