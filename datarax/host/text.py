"""Text on the host: HF `tokenizers` batch encoding, padded or truncated to a fixed length.

    >>> pipeline = Pipeline(TextSource(documents=documents), [Tokenize(tokenizer=tokenizer, length=128)], batch_size=32)
    >>> batch = next(iter(pipeline))  # text_ids int32[32, 128], text_mask bool, text_length int32

A hash of the tokenizer's JSON is in `structure()`: a state saved with one tokenizer is refused
by a pipeline built with another.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from datarax.core.checks import check_bool, check_field_name, check_int, field
from datarax.core.construct import resolve_arguments
from datarax.host.stage import HostContext, HostStage, Spec, check_encoded_field
from datarax.sources.tokens import as_texts, encode, load_tokenizer


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
        tokenizer: a `tokenizers.Tokenizer` or the path of a `tokenizer.json`; also by position.

    Example:
        >>> stage = Tokenize("tokenizer.json", length=64, field="text")
    """

    work = "decode"
    positional = ("tokenizer",)

    def __init__(self, config: TokenizeConfig | None = None, *args: Any, tokenizer: Any = None, **settings: Any):
        self.config, tokenizer = resolve_arguments(TokenizeConfig, config, settings, "Tokenize",
                                                   {"tokenizer": tokenizer}, args=args, positional=self.positional)
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
            texts = as_texts(texts, cfg.field, ctx.where, "Tokenize")
            flat, lengths = encode(self.tokenizer, texts, cfg.add_special_tokens)
        ids, kept = pad_ragged(flat, lengths, cfg.length, cfg.pad_id)
        out = {k: v for k, v in batch.items() if k != cfg.field}
        out[f"{cfg.field}_ids"] = ids
        out[f"{cfg.field}_mask"] = np.arange(cfg.length) < kept[:, None]
        out[f"{cfg.field}_length"] = kept.astype(np.int32)
        return out

    def structure(self) -> str:
        return f"Tokenize({self.config}, tokenizer={self.tokenizer_hash})"

