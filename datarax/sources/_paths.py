"""Reads of files whose paths come from data: regular files only, bounded, confined to the dataset.

`read_data_file` reads only a regular file (checked on the open descriptor), at most `max_bytes`;
`confine` resolves a relative path against the dataset's folder and refuses one outside its roots.
Each refusal is a `DataPathError` naming the record and the path (docs/sources.md).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from datarax.core.errors import DataraxError

DEFAULT_MAX_FILE_BYTES = 256 * 2**20  # far above any image or clip a host stage decodes; far below memory
_CHUNK = 1 << 20


class DataPathError(DataraxError, ValueError):
    """A file named by data was refused (not a regular file, too large, or outside the dataset); not
    an `OSError`, so a `RetryPolicy` does not retry it."""


def confine(path: str, roots: Sequence[str], allow_outside: bool, where: str, option: str) -> str:
    """The path to read for `path` as stored in a record: relative ones joined to `roots[0]`.

    Raises `DataPathError` naming `where` and the path when its real location is under none of
    `roots` and `allow_outside` is False (`option` names the setting that allows it).
    """
    if not os.path.isabs(path):
        if not roots:
            raise DataPathError(f"{where} names the relative path {path!r}, but the dataset's folder is unknown "
                                "(it was not loaded by load_files); pass the folder its paths are relative to as "
                                "files_root=...")
        path = os.path.join(roots[0], path)
    if allow_outside:
        return path
    real = os.path.realpath(path)
    for root in roots:
        base = os.path.realpath(root)
        if os.path.commonpath([real, base]) == base:
            return path
    inside = f"the dataset's folder(s) {list(roots)}" if roots else "a known dataset folder (none is set)"
    raise DataPathError(f"{where} names {path!r}" + (f" (really {real!r})" if real != path else "") +
                        f", which is outside {inside}; a record may only name files of its dataset. Move the file "
                        f"into the dataset, set files_root to the folder that holds it, or pass {option} to read "
                        "paths anywhere")


def read_data_file(path: str, max_bytes: int, where: str, option: str) -> bytes:
    """The bytes of the regular file `path`, at most `max_bytes` of them (see the module docstring)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                    else "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file")
            raise DataPathError(f"{where} names {path!r}, which is {kind}; only regular files are read (a device, "
                                "FIFO or socket could block or never end): replace it with the file itself")
        if info.st_size > max_bytes:
            raise DataPathError(f"{where} names {path!r} of {info.st_size} bytes, over the limit of {max_bytes}; "
                                f"raise {option} if the file is genuine")
        parts, total = [], 0
        while total <= max_bytes:
            part = os.read(fd, min(_CHUNK, max_bytes + 1 - total))
            if not part:
                break
            parts.append(part)
            total += len(part)
        if total > max_bytes:
            raise DataPathError(f"{where} names {path!r}, which grew past the limit of {max_bytes} bytes while "
                                f"read; raise {option} if the file is genuine")
        return b"".join(parts)
    finally:
        os.close(fd)
