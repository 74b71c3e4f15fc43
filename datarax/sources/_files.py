"""`CorruptFileError`: a data file that cannot be read as what it claims to be.

Sources check their readers when they open files (a reader that is not ok, a header whose sizes
disagree with the file's size) and when they read records, and raise this error naming the file;
a damaged file is never skipped or read as a shorter dataset.
"""

from __future__ import annotations


class CorruptFileError(ValueError):
    """A data file is truncated, garbled or not of its format; the message names the file and the fix.

    Not an `OSError`: a `RetryPolicy` does not retry it, since reading damaged bytes again gives
    the same bytes.
    """


REWRITE = "rewrite the file (or restore it from a good copy), or leave it out of the paths"
