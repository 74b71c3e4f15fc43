"""Text on the host: HF `tokenizers` batch encoding, padded or truncated to a fixed length.

`Tokenize` turns a field of `str` records into fixed-shape token ids with one Rust call per batch
(`Tokenizer.encode_batch_fast`, which spreads the batch over the tokenizer's own threads); the
ragged ids become one padded array with numpy, without a Python loop over the tokens.

    >>> pipeline = Pipeline(TextSource(documents=documents), [Tokenize(tokenizer=tokenizer, length=128)], batch_size=32)
    >>> batch = next(iter(pipeline))  # text_ids int32[32, 128], text_mask bool, text_length int32

The tokenizer is part of the pipeline's identity: a hash of its JSON goes into `structure()`, so
an iterator state saved with one tokenizer is refused by a pipeline built with another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
from typing import Any

import jax
import numpy as np

from datarax.core.checks import check_bool, check_field_name, check_int, field, require
from datarax.core.construct import resolve_config, take_positional
from datarax.host.stage import HostContext, HostStage, RecordError, Spec, check_encoded_field

def load_tokenizer(tokenizer: Any, owner: str) -> tuple[Any, str]:
    """`(a private copy of the tokenizer, a hash of its JSON)` from a `tokenizers.Tokenizer` or a path.

    The copy has padding and truncation turned off, so the caller sees every token and does its
    own fixed-length layout; the caller's tokenizer object is left as it was.
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
    """`(flat int32 token ids, int64 lengths)` of `texts`, encoded in one batch call.

    `encode_batch_fast` (tokenizers >= 0.20) skips the character offsets nobody here reads.
    """
    batch_encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    encodings = batch_encode(texts, add_special_tokens=add_special_tokens)
    ids = [e.ids for e in encodings]
    lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(lengths.sum()))
    return flat, lengths


def pad_ragged(flat: np.ndarray, lengths: np.ndarray, length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """`(ids int32[n, length], kept lengths)`: each row's first `length` tokens, padded with `pad_id`."""
    kept = np.minimum(lengths, length)
    columns = np.arange(length)
    mask = columns < kept[:, None]
    ids = np.full((len(lengths), length), pad_id, np.int32)
    if len(lengths) and length:
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        # Token j of row i sits at flat[starts[i] + j]; the kept ones land in the mask's True cells.
        ids[mask] = flat[(starts[:, None] + columns)[mask]]
    return ids, kept


def as_texts(texts: list, field_name: str, ctx: HostContext, owner: str) -> list:
    """`texts` with UTF-8 bytes decoded, or a `RecordError` naming the first record that is not text.

    Called only when the tokenizer refused a batch, so a batch of str pays no per-record loop.
    """
    texts = list(texts)
    for row, text in enumerate(texts):
        if isinstance(text, bytes):
            try:
                texts[row] = text.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RecordError(f"{owner}: {ctx.where(row)} field {field_name!r} is not UTF-8 text: {exc}") from exc
        elif not isinstance(text, str):
            raise RecordError(f"{owner}: {ctx.where(row)} field {field_name!r} holds {type(text).__name__}, "
                              "not str or bytes")
    return texts


@dataclasses.dataclass(frozen=True)
class TokenizeConfig:
    """Configuration of `Tokenize`.

    Attributes:
        field: the text field to encode (str or UTF-8 bytes records); it is replaced by
            `<field>_ids`, `<field>_mask` and `<field>_length`.
        length: tokens per record: longer texts are truncated (their first `length` tokens are
            kept), shorter ones padded.
        pad_id: the id written in padding positions.
        add_special_tokens: let the tokenizer's post-processor add its special tokens (e.g.
            BERT's [CLS] ... [SEP]) before truncation.
    """

    field: str = "text"
    length: int = 128
    pad_id: int = 0
    add_special_tokens: bool = True

    def __post_init__(self):
        check_field_name(*field(self, "field"))
        check_int(*field(self, "length"), 1)
        check_int(*field(self, "pad_id"), 0)
        check_bool(*field(self, "add_special_tokens"))


class Tokenize(HostStage):
    """Encodes a text field with a HF `tokenizers.Tokenizer` into fixed-length token ids.

    Outputs `<field>_ids` int32[length], `<field>_mask` bool[length] (True on real tokens) and
    `<field>_length` int32 (real tokens after truncation); other fields pass through.

    Args:
        config: a `TokenizeConfig`; or give its fields as keywords.
        tokenizer: a `tokenizers.Tokenizer` or the path of a `tokenizer.json`.

    Example:
        >>> stage = Tokenize(tokenizer="tokenizer.json", length=64, field="text")
    """

    work = "decode"

    def __init__(self, config: TokenizeConfig | None = None, *legacy: Any, tokenizer: Any = None, **settings: Any):
        data = {"tokenizer": tokenizer}
        config = take_positional("Tokenize", TokenizeConfig, (config, *legacy), data)
        self.config = resolve_config(TokenizeConfig, config, settings, "Tokenize")
        tokenizer = data["tokenizer"]
        self.tokenizer, self.tokenizer_hash = load_tokenizer(tokenizer, "Tokenize")

    def output_spec(self, input_spec: Spec) -> Spec:
        name = self.config.field
        check_encoded_field(input_spec, name, "Tokenize", holds="text (str)",
                            decoded_fix="read it as text (TextSource, or HFSourceConfig(encoded=(...)))")
        length = self.config.length
        out = {k: v for k, v in input_spec.items() if k != name}
        out[f"{name}_ids"] = jax.ShapeDtypeStruct((length,), np.int32)
        out[f"{name}_mask"] = jax.ShapeDtypeStruct((length,), np.bool_)
        out[f"{name}_length"] = jax.ShapeDtypeStruct((), np.int32)
        return out

    def __call__(self, batch: dict[str, np.ndarray], ctx: HostContext) -> dict[str, np.ndarray]:
        cfg = self.config
        texts = batch[cfg.field].reshape(-1).tolist()
        try:
            flat, lengths = encode(self.tokenizer, texts, cfg.add_special_tokens)
        except TypeError:  # bytes, or something that is not text: decode or name the record
            flat, lengths = encode(self.tokenizer, as_texts(texts, cfg.field, ctx, "Tokenize"), cfg.add_special_tokens)
        ids, kept = pad_ragged(flat, lengths, cfg.length, cfg.pad_id)
        out = {k: v for k, v in batch.items() if k != cfg.field}
        out[f"{cfg.field}_ids"] = ids
        out[f"{cfg.field}_mask"] = np.arange(cfg.length) < kept[:, None]
        out[f"{cfg.field}_length"] = kept.astype(np.int32)
        return out

    def structure(self) -> str:
        return f"Tokenize({self.config}, tokenizer={self.tokenizer_hash})"

