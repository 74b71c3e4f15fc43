"""Packed text: documents tokenized in blocks and packed greedily into fixed rows of `seq_len` tokens.

`PackedTextSource` is a stream: each epoch it visits a text source's documents in a seeded order,
tokenizes them `block_size` at a time, and packs them into rows of `tokens`, `segment_ids`,
`positions` (int32) and `loss_mask` (bool). Its state is `{"doc": d, "offset": k}`: the next
document in the epoch's order and the tokens of it already emitted. docs/sources.md ("Text") has
the row layout and the resume rules.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from datarax.core.checks import check_bool, check_field_name, check_int, check_seed, field
from datarax.core.construct import resolve_config
from datarax.core.errors import record_origin
from datarax.core.fields import ENCODED
from datarax.core.source import DataSourceModule
from datarax.samplers.simple import ShuffleSampler
from datarax.sources.stream import RecordReader, StreamSourceModule, check_stream_state
from datarax.sources.text import document_texts
from datarax.sources.tokens import as_texts, encode, load_tokenizer

FIELDS = ("tokens", "segment_ids", "positions", "loss_mask")


@dataclasses.dataclass(frozen=True)
class PackedTextSourceConfig:
    """Configuration of a `PackedTextSource`.

    Attributes:
        seq_len: tokens per row.
        field: the source's text field.
        shuffle: visit documents in a fresh order every epoch (Feistel, keyed by (seed, epoch)).
        seed: the shuffle seed.
        eos_id: a token appended to every document (a separator between packed documents), or
            None for none.
        pad_id: the token id of padding.
        truncate: cut documents to `seq_len` tokens and never split them across rows (the default
            continues a long document on the next row).
        mask_document_start: put `loss_mask` False on each document's first token.
        add_special_tokens: let the tokenizer's post-processor add its special tokens per document.
        block_size: documents tokenized per `encode_batch_fast` call.
    """

    seq_len: int = 512
    field: str = "text"
    shuffle: bool = False
    seed: int = 0
    eos_id: int | None = None
    pad_id: int = 0
    truncate: bool = False
    mask_document_start: bool = False
    add_special_tokens: bool = False
    block_size: int = 512

    def __post_init__(self):
        check_int(*field(self, "seq_len"), 1)
        check_field_name(*field(self, "field"))
        check_bool(*field(self, "shuffle"))
        check_seed(*field(self, "seed"))
        check_int(*field(self, "eos_id"), 0, allow_none=True)
        check_int(*field(self, "pad_id"), 0)
        check_bool(*field(self, "truncate"))
        check_bool(*field(self, "mask_document_start"))
        check_bool(*field(self, "add_special_tokens"))
        check_int(*field(self, "block_size"), 1)
        if self.truncate and self.eos_id is not None and self.seq_len == 1:
            raise ValueError("PackedTextSourceConfig(seq_len=1, truncate=True, eos_id=...) leaves no room for a "
                             "document's tokens: each row would hold only the EOS token. Use seq_len >= 2, or "
                             "eos_id=None")


class PackedTextSource(StreamSourceModule):
    """Documents of a text source, tokenized and packed into fixed rows (see the module docstring).

    Args:
        config: a `PackedTextSourceConfig`; or give its fields as keywords.
        source: a random-access source with a str field (e.g. `TextSource`); its own shuffle
            setting is ignored: the packer draws the order.
        tokenizer: a `tokenizers.Tokenizer` or the path of a `tokenizer.json`.

    Example:
        >>> packed = PackedTextSource(source=TextSource(documents=docs), tokenizer=tokenizer, seq_len=512, eos_id=0)
        >>> pipeline = Pipeline(packed, [], batch_size=8)
    """

    def __init__(self, config: PackedTextSourceConfig | None = None, *, source: DataSourceModule, tokenizer: Any,
                 **settings: Any):
        config = resolve_config(PackedTextSourceConfig, config, settings, "PackedTextSource")
        if not isinstance(source, DataSourceModule):
            raise TypeError(f"PackedTextSource reads a random-access source (e.g. TextSource), got "
                            f"{type(source).__name__}")
        spec = source.element_spec()
        if config.field not in spec or spec[config.field].dtype != ENCODED:
            raise KeyError(f"PackedTextSource field {config.field!r} must be a text field of the source; its fields: "
                           f"{ {k: str(v.dtype) for k, v in spec.items()} }")
        self.config = config
        self.source = source
        self.tokenizer, self.tokenizer_hash = load_tokenizer(tokenizer, "PackedTextSource")
        self.order = ShuffleSampler(len(source), seed=config.seed) if config.shuffle else None

    @property
    def num_documents(self) -> int:
        return len(self.source)

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        shape = (self.config.seq_len,)
        return {"tokens": jax.ShapeDtypeStruct(shape, np.int32), "segment_ids": jax.ShapeDtypeStruct(shape, np.int32),
                "positions": jax.ShapeDtypeStruct(shape, np.int32), "loss_mask": jax.ShapeDtypeStruct(shape, np.bool_)}

    def document_order(self, positions: np.ndarray, epoch: int) -> np.ndarray:
        """The record ids of the documents at `positions` of `epoch`'s order."""
        positions = np.asarray(positions, np.int64)
        return positions if self.order is None else self.order.indices(positions, epoch)

    def tokenize(self, record_ids: np.ndarray, epoch: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """`(flat int32 tokens, int64 lengths)` of the documents `record_ids`, EOS and truncation applied."""
        cfg = self.config
        texts = document_texts(self.source, record_ids, cfg.field)
        try:
            flat, lengths = encode(self.tokenizer, texts, cfg.add_special_tokens)
        except TypeError:  # bytes, or something that is not text: decode or name the record
            def where(row: int) -> str:
                return record_origin(int(record_ids[row]), self.source.describe_record)

            flat, lengths = encode(self.tokenizer, as_texts(texts, cfg.field, where, "PackedTextSource"),
                                   cfg.add_special_tokens)
        eos = cfg.eos_id is not None
        keep = np.minimum(lengths, cfg.seq_len - eos) if cfg.truncate else lengths
        if not eos and np.array_equal(keep, lengths):
            return flat, lengths
        out_lengths = keep + eos
        out = np.empty(int(out_lengths.sum()), np.int32)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        out_starts = np.concatenate([[0], np.cumsum(out_lengths)[:-1]])
        doc = np.repeat(np.arange(len(lengths)), keep)
        within = np.arange(len(doc)) - np.repeat(np.cumsum(keep) - keep, keep)
        out[out_starts[doc] + within] = flat[starts[doc] + within]
        if eos:
            out[out_starts + keep] = cfg.eos_id
        return out, out_lengths

    def open(self, epoch: int, state: dict[str, Any] | None) -> PackedTextReader:
        return PackedTextReader(self, int(epoch), state)

    def structure(self) -> str:
        return (f"PackedTextSource({self.config}, tokenizer={self.tokenizer_hash}, "
                f"source={self.source.structure()})")


class PackedTextReader(RecordReader):
    """Packs one epoch from a `{"doc", "offset"}` state (see the module docstring)."""

    def __init__(self, packed: PackedTextSource, epoch: int, state: dict[str, Any] | None):
        self._packed, self._epoch = packed, epoch
        self._num_docs = packed.num_documents
        state = {"doc": 0, "offset": 0} if state is None else state
        check_stream_state(state, ("doc", "offset"), "PackedTextSource")
        doc, offset = int(state["doc"]), int(state["offset"])
        if doc > self._num_docs or (doc == self._num_docs and offset):
            raise ValueError(f"PackedTextSource stream state {state!r:.200} does not fit this source of "
                             f"{self._num_docs} documents; it is corrupt or from another source")
        # Pending documents: `flat[starts[i]:starts[i + 1]]` holds the tokens of document
        # `first + i`, up to `next` (exclusive); `index` is the document being emitted, `offset`
        # how many of its tokens earlier rows hold.
        self._first, self._next = doc, doc
        self._flat = np.zeros(0, np.int32)
        self._starts = np.zeros(1, np.int64)
        self._index, self._offset = 0, 0
        if doc < self._num_docs:
            self._tokenize_block()
            length = self._starts[1] - self._starts[0]
            if offset and offset >= length:
                raise ValueError(f"PackedTextSource stream state {state!r:.200}: document {doc} of epoch {epoch} "
                                 f"has {length} tokens, so {offset} cannot be emitted already; the state is corrupt "
                                 "or from another source, tokenizer or configuration")
            self._offset = offset

    def _tokenize_block(self) -> bool:
        """Tokenizes the next block of documents onto the pending ones; False when none are left."""
        if self._next >= self._num_docs:
            return False
        stop = min(self._num_docs, self._next + self._packed.config.block_size)
        ids = self._packed.document_order(np.arange(self._next, stop), self._epoch)
        flat, lengths = self._packed.tokenize(ids, self._epoch)
        self._flat = np.concatenate([self._flat, flat])
        self._starts = np.concatenate([self._starts, self._starts[-1] + np.cumsum(lengths)])
        self._next = stop
        return True

    def _drop_emitted(self) -> None:
        """Forgets the documents already emitted (between reads only: a read's pieces point into them)."""
        done = self._index
        if done:
            base = self._starts[done]
            self._flat = self._flat[base:]
            self._starts = self._starts[done:] - base
            self._first += done
            self._index = 0

    def read(self, out: dict[str, np.ndarray], start: int, count: int) -> int:
        self._drop_emitted()
        cfg = self._packed.config
        seq_len, truncate = cfg.seq_len, cfg.truncate
        # Pieces: (row, column, flat start, length, starts its document); laid out in a Python loop
        # over documents, then written with a few vectorised numpy calls.
        rows, col = 0, 0
        piece_row, piece_col, piece_src, piece_len, piece_first = [], [], [], [], []
        while rows < count:
            if self._index + 1 >= len(self._starts) and not self._tokenize_block():
                if col:
                    rows, col = rows + 1, 0  # the epoch's final, padded row
                break
            begin = self._starts[self._index] + self._offset
            remaining = int(self._starts[self._index + 1] - begin)
            if remaining == 0:  # an empty document (no tokens, no EOS)
                self._index, self._offset = self._index + 1, 0
                continue
            if truncate and col + remaining > seq_len:
                rows, col = rows + 1, 0
                continue
            take = min(remaining, seq_len - col)
            piece_row.append(rows)
            piece_col.append(col)
            piece_src.append(begin)
            piece_len.append(take)
            piece_first.append(self._offset == 0)
            col += take
            if take == remaining:
                self._index, self._offset = self._index + 1, 0
            else:
                self._offset += take
            if col == seq_len:
                rows, col = rows + 1, 0
        self._write(out, start, rows, piece_row, piece_col, piece_src, piece_len, piece_first)
        return rows

    def _write(self, out, start, rows, piece_row, piece_col, piece_src, piece_len, piece_first) -> None:
        cfg = self._packed.config
        seq_len = cfg.seq_len
        views = {name: out[name][start:start + rows].reshape(-1) for name in FIELDS}
        views["tokens"][:] = cfg.pad_id
        for name in FIELDS[1:]:
            views[name][:] = 0
        if not piece_len:
            return
        length = np.asarray(piece_len, np.int64)
        prow = np.asarray(piece_row, np.int64)
        total = int(length.sum())
        piece = np.repeat(np.arange(len(length)), length)
        within = np.arange(total) - np.repeat(np.cumsum(length) - length, length)
        dest = np.repeat(prow * seq_len + np.asarray(piece_col, np.int64), length) + within
        views["tokens"][dest] = self._flat[np.repeat(np.asarray(piece_src, np.int64), length) + within]
        # A piece's segment id is its rank within its row: 1 + pieces before it in the same row.
        first_in_row = np.searchsorted(prow, prow, side="left")
        views["segment_ids"][dest] = (np.arange(len(length)) - first_in_row + 1)[piece]
        views["positions"][dest] = within
        mask = np.ones(total, bool)
        if cfg.mask_document_start:
            mask[(within == 0) & np.asarray(piece_first, bool)[piece]] = False
        views["loss_mask"][dest] = mask

    def get_state(self) -> dict[str, Any]:
        return {"doc": self._first + self._index, "offset": self._offset}

    def close(self) -> None:
        self._flat = np.zeros(0, np.int32)


def unpack_rows(tokens: np.ndarray, segment_ids: np.ndarray) -> list[np.ndarray]:
    """The token pieces of packed rows, in order (one array per nonzero segment of each row)."""
    pieces = []
    for row_tokens, row_segments in zip(np.asarray(tokens), np.asarray(segment_ids)):
        for segment in range(1, int(row_segments.max(initial=0)) + 1):
            pieces.append(row_tokens[row_segments == segment])
    return pieces

