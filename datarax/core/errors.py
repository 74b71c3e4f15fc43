"""`DataraxError`, the base of every error and warning datarax raises, and the errors several
packages raise.

Each error also keeps the built-in base its callers catch (`ValueError`, `OSError`, ...), so
`except ValueError` still works, and `except DataraxError` catches anything datarax raised. A
warning derives from `DataraxWarning` (a `DataraxError` and a `UserWarning`), so one promoted to
an error by a warnings filter is caught with the rest.
"""

from __future__ import annotations

from collections.abc import Callable


class DataraxError(Exception):
    """The base of every exception class defined in datarax."""


class DataraxWarning(DataraxError, UserWarning):
    """The base of every warning datarax issues."""


class RecordError(DataraxError, ValueError):
    """A record could not be decoded; the message names the record and where it came from."""


class CorruptFileError(DataraxError, ValueError):
    """A data file is truncated, garbled or not of its format; the message names the file and the fix.

    Sources check their readers when they open files (a reader that is not ok, a header whose
    sizes disagree with the file's size) and when they read records, and raise this error naming
    the file: a damaged file is never skipped or read as a shorter dataset. Not an `OSError`: a
    `RetryPolicy` does not retry it, since reading damaged bytes again gives the same bytes.
    """


REWRITE = "rewrite the file (or restore it from a good copy), or leave it out of the paths"


def printable(text: str) -> str:
    """`text` with each non-printable character (newline, carriage return, escape, ...) written as
    its Python escape (`\\n`, `\\x1b`), as `repr` writes it.

    A file name is data: one holding a newline or a terminal escape code must not forge a log
    line or recolour a terminal when an error names it.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def record_origin(record_id: int, describe_record: Callable[[int], str]) -> str:
    """`record 17 (photos/cat/001.jpg)`: a record and its origin (`describe_record`, a source's), for
    errors, with control characters in the origin escaped (`printable`)."""
    origin = printable(describe_record(record_id))
    return f"record {record_id}" + ("" if origin == f"record {record_id}" else f" ({origin})")
