"""A fixed-layout binary record for ArrayRecord payloads, decodable a whole batch at a time.

A record is `b"DRX1" | uint32 header length | JSON header | field bytes`, where the header lists
each field's name, numpy dtype string and shape, and the fields' raw C-order bytes follow in
header order. Records written from one dataset share the header byte for byte, so a batch of
them is one `(B, record_size)` uint8 matrix: decoding is a join, one header comparison and one
strided copy per field into the caller's buffers, with no per-record Python beyond a length check.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from datarax.sources._columns import UnsupportedColumnError, batchable

MAGIC = b"DRX1"
_PREFIX = len(MAGIC) + 4


class RecordFormatError(ValueError):
    """Bytes that are not a datarax fixed-layout record, or records whose layouts differ."""


@dataclasses.dataclass(frozen=True)
class Field:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class RecordLayout:
    """Where each field sits in a record; `header` is the byte prefix every record shares."""

    fields: tuple[Field, ...]
    header: bytes
    size: int

    def spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return {f.name: jax.ShapeDtypeStruct(f.shape, f.dtype) for f in self.fields}


def encode_record(record: Mapping[str, object]) -> bytes:
    """Serialises one record (a dict of numeric arrays or scalars) into a fixed-layout record."""
    arrays = {name: np.asarray(value) for name, value in record.items()}
    bad = {name: str(a.dtype) for name, a in arrays.items() if not batchable(a.dtype)}
    if bad or not arrays:
        raise UnsupportedColumnError(
            f"encode_record takes a non-empty dict of numeric arrays; fields {bad} are not numeric. "
            "Encode strings as integer ids (or leave them out) before writing"
        )
    header = json.dumps([[n, a.dtype.str, list(a.shape)] for n, a in arrays.items()], separators=(",", ":"))
    return MAGIC + struct.pack("<I", len(header)) + header.encode() + b"".join(a.tobytes() for a in arrays.values())


def parse_layout(data: bytes, where: str = "record") -> RecordLayout:
    """The layout of a record, read from its header."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or bytes(data[:4]) != MAGIC:
        head = bytes(data[:16]) if isinstance(data, (bytes, bytearray, memoryview)) else data
        raise RecordFormatError(
            f"{where} is not a datarax fixed-layout record (it starts with {head!r:.40}, not {MAGIC!r}); "
            "write the files with datarax.sources.array_record.write_array_records, or pass decode=fn "
            "that turns one record's bytes into a dict of arrays"
        )
    (length,) = struct.unpack("<I", bytes(data[4:_PREFIX]))
    header = bytes(data[:_PREFIX + length])
    try:
        entries = json.loads(header[_PREFIX:].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordFormatError(f"{where} has a corrupt header ({exc}); the file is damaged") from None
    fields, offset = [], len(header)
    for name, dtype, shape in entries:
        dtype, shape = np.dtype(dtype), tuple(int(s) for s in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        fields.append(Field(name, dtype, shape, offset, nbytes))
        offset += nbytes
    if offset != len(data):
        raise RecordFormatError(f"{where} is {len(data)} bytes but its header describes {offset}; the file is damaged")
    return RecordLayout(tuple(fields), header, offset)


def decode_record(data: bytes) -> dict[str, np.ndarray]:
    """One record's fields as numpy arrays (copies, so they outlive `data`): a batch of one."""
    layout = parse_layout(data)
    out = {f.name: np.empty((1,) + f.shape, f.dtype) for f in layout.fields}
    decode_batch_into([data], layout, out)
    return {name: rows[0] for name, rows in out.items()}


def decode_batch_into(records: Sequence[bytes], layout: RecordLayout, out: Mapping[str, np.ndarray]) -> None:
    """Decodes records sharing `layout` into the rows of the contiguous buffers `out`."""
    n = len(records)
    if n == 0:
        return
    sizes = set(map(len, records))
    if sizes != {layout.size}:
        bad = next(i for i, r in enumerate(records) if len(r) != layout.size)
        raise RecordFormatError(
            f"record {bad} of the batch is {len(records[bad])} bytes, the dataset's records are {layout.size}: "
            "records must all have the same fields, dtypes and shapes (pad them when writing), or pass "
            "decode=fn to turn each record into fixed-shape arrays"
        )
    rows = np.frombuffer(b"".join(records), np.uint8).reshape(n, layout.size)
    head = np.frombuffer(layout.header, np.uint8)
    if not np.array_equal(rows[:, :head.size], np.broadcast_to(head, (n, head.size))):
        bad = int(np.nonzero((rows[:, :head.size] != head).any(axis=1))[0][0])
        raise RecordFormatError(
            f"record {bad} of the batch has a different layout ({parse_layout(records[bad]).spec()}) from the "
            f"dataset's ({layout.spec()}); write every record with the same fields, dtypes and shapes"
        )
    for f in layout.fields:
        out[f.name].reshape(n, -1).view(np.uint8)[...] = rows[:, f.offset:f.offset + f.nbytes]
