"""A fixed-layout binary record for ArrayRecord payloads, decodable a whole batch at a time.

A record is `b"DRX1" | uint32 header length | JSON header | field bytes`: the header lists each
field's name, dtype and shape, and the fields' C-order bytes follow. Records of one dataset share
the header, so a batch decodes as one `(B, record_size)` uint8 matrix with one copy per field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np

from datarax.core.checks import is_int
from datarax.core.errors import REWRITE, CorruptFileError
from datarax.core.fields import UnsupportedColumnError, batchable

MAGIC = b"DRX1"
_PREFIX = len(MAGIC) + 4
_KINDS = "biufc"  # bool, integer, unsigned, float, complex: what a batch array may hold


class RecordFormatError(CorruptFileError):
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
    """The layout of a record, read from its header.

    Every part of the header is checked before numpy sees it; a fault raises `RecordFormatError`
    (a `CorruptFileError`) naming `where`.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)) or bytes(data[:4]) != MAGIC:
        head = bytes(data[:16]) if isinstance(data, (bytes, bytearray, memoryview)) else data
        raise RecordFormatError(
            f"{where} is not a datarax fixed-layout record (it starts with {head!r:.40}, not {MAGIC!r}); "
            "write the files with datarax.sources.array_record.write_array_records, or pass decode=fn "
            "that turns one record's bytes into a dict of arrays"
        )

    def corrupt(fault: str) -> RecordFormatError:
        return RecordFormatError(f"{where} has a corrupt header: {fault}; the file is damaged: {REWRITE}")

    if len(data) < _PREFIX:
        raise corrupt(f"the record is {len(data)} bytes, shorter than its {_PREFIX}-byte prefix")
    (length,) = struct.unpack("<I", bytes(data[4:_PREFIX]))
    if _PREFIX + length > len(data):
        raise corrupt(f"its header length {length} runs past the record's {len(data)} bytes")
    header = bytes(data[:_PREFIX + length])
    try:
        entries = json.loads(header[_PREFIX:].decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise corrupt(f"it is not UTF-8 JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(entries, list) or not entries:
        raise corrupt(f"it is {type(entries).__name__} {str(entries)[:40]!r}, not a non-empty list of "
                      "[name, dtype, shape] fields")
    fields, offset, names = [], len(header), set()
    for i, entry in enumerate(entries):
        name, dtype, shape = _field_entry(entry, i, names, corrupt)
        nbytes = math.prod(shape) * dtype.itemsize
        if offset + nbytes > len(data):
            raise corrupt(f"field {name!r} ({dtype}, shape {list(shape)}) needs {nbytes} bytes, past the record's "
                          f"{len(data)}")
        fields.append(Field(name, dtype, shape, offset, nbytes))
        offset += nbytes
    if offset != len(data):
        raise RecordFormatError(f"{where} is {len(data)} bytes but its header describes {offset}; the file is damaged")
    return RecordLayout(tuple(fields), header, offset)


def _field_entry(entry: object, i: int, names: set, corrupt) -> tuple[str, np.dtype, tuple[int, ...]]:
    """One header entry `[name, dtype, shape]`, each part checked (see `parse_layout`)."""
    if not isinstance(entry, list) or len(entry) != 3:
        raise corrupt(f"entry {i} is {str(entry)[:40]!r}, not [name, dtype, shape]")
    name, dtype, shape = entry
    if not isinstance(name, str) or not name or name in names:
        raise corrupt(f"entry {i} has the name {str(name)[:40]!r}, not a new non-empty string")
    names.add(name)
    if not isinstance(dtype, str) or len(dtype) > 8:
        raise corrupt(f"field {name!r} has the dtype {str(dtype)[:40]!r}, not a numpy type string such as '<f4'")
    try:
        parsed = np.dtype(dtype)
    except (TypeError, ValueError, SyntaxError):
        raise corrupt(f"field {name!r} has the dtype {dtype!r}, which is no numpy type") from None
    if parsed.kind not in _KINDS or parsed.fields is not None or parsed.subdtype is not None or not batchable(parsed):
        raise corrupt(f"field {name!r} has the dtype {dtype!r} ({parsed}), not a numeric or bool type a batch can hold")
    if not isinstance(shape, list) or len(shape) > 32 or \
            not all(is_int(s) and 0 <= s < 2**40 for s in shape):
        raise corrupt(f"field {name!r} has the shape {str(shape)[:40]!r}, not a list of non-negative ints")
    return name, parsed, tuple(shape)


def decode_record(data: bytes) -> dict[str, np.ndarray]:
    """One record's fields as numpy arrays (copies, so they outlive `data`): a batch of one."""
    layout = parse_layout(data)
    out = {f.name: np.empty((1,) + f.shape, f.dtype) for f in layout.fields}
    decode_batch_into([data], layout, out)
    return {name: rows[0] for name, rows in out.items()}


def decode_batch_into(records: Sequence[bytes], layout: RecordLayout, out: Mapping[str, np.ndarray],
                      where: Callable[[int], str] = lambda i: f"record {i} of the batch") -> None:
    """Decodes records sharing `layout` into the rows of the contiguous buffers `out`; `where(i)`
    names the batch's record i in errors."""
    n = len(records)
    if n == 0:
        return
    sizes = set(map(len, records))
    if sizes != {layout.size}:
        bad = next(i for i, r in enumerate(records) if len(r) != layout.size)
        parse_layout(records[bad], where(bad))  # a damaged header raises here, naming the record and the fault
        raise RecordFormatError(
            f"{where(bad)} is {len(records[bad])} bytes, the dataset's records are {layout.size}: "
            "records must all have the same fields, dtypes and shapes (pad them when writing), or pass "
            "decode=fn to turn each record into fixed-shape arrays"
        )
    rows = np.frombuffer(b"".join(records), np.uint8).reshape(n, layout.size)
    head = np.frombuffer(layout.header, np.uint8)
    if not np.array_equal(rows[:, :head.size], np.broadcast_to(head, (n, head.size))):
        bad = int(np.nonzero((rows[:, :head.size] != head).any(axis=1))[0][0])
        other = parse_layout(records[bad], where(bad))  # a damaged header raises here, naming the record
        raise RecordFormatError(
            f"{where(bad)} has a different layout ({other.spec()}) from the dataset's ({layout.spec()}); write "
            "every record with the same fields, dtypes and shapes"
        )
    for f in layout.fields:
        out[f.name].reshape(n, -1).view(np.uint8)[...] = rows[:, f.offset:f.offset + f.nbytes]
