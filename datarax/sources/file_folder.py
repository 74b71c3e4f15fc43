"""`FileFolderSource`: a folder of class sub-folders of files of any kind, as encoded records.

Class sub-folders, sorted by name, become labels 0, 1, ...; their files (recursive, sorted by
path; hidden files left out with a warning and listed in `skipped_files`) follow in that order, so
record i is the same file on every machine. A record is the file's bytes and its int32 label.

Example:
    >>> source = FileFolderSource(root="clips/train", extensions=(".wav", ".flac"), field="audio", shuffle=True)
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.control.pool import ThreadPool
from datarax.core.checks import check_field_name, check_positive_int, field
from datarax.core.construct import resolve_config, warn_at_caller
from datarax.core.errors import DataraxError, DataraxWarning
from datarax.core.fields import ENCODED, read_batch
from datarax.core.source import DataSourceModule, Handles, ShuffleConfig, seed_from_rngs
from datarax.sources._paths import DEFAULT_MAX_FILE_BYTES, read_data_file

READ_THREADS = 4  # file reads are short syscalls that release the GIL; a few threads hide their latency


def check_extensions(value: Any, owner: str, allow_none: bool) -> tuple[str, ...] | None:
    """File name endings as a lower-case tuple (a single string is one ending)."""
    if value is None and allow_none:
        return None
    extensions = (value,) if isinstance(value, str) else value
    if (not isinstance(extensions, (tuple, list)) or not extensions
            or not all(isinstance(e, str) and e.startswith(".") for e in extensions)):
        raise ValueError(f"{owner}.extensions must be a tuple of endings such as ('.wav', '.flac')"
                         f"{' or None (every file)' if allow_none else ''}, got {value!r}")
    return tuple(e.lower() for e in extensions)


def check_root(value: Any, owner: str) -> str:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise TypeError(f"{owner}.root must be a folder path, got {value!r}")
    return os.fspath(value)


@dataclasses.dataclass(frozen=True)
class FileFolderSourceConfig(ShuffleConfig):
    """Configuration of a `FileFolderSource`.

    Attributes:
        root: the folder holding one sub-folder per class.
        extensions: file name endings that count (without case); None: every file not hidden.
        field: the name of the field holding each file's bytes.
        num_threads: threads reading files.
        max_file_bytes: the largest file read; a larger one (or a non-regular file) is a `DataPathError`.
    """

    root: str
    extensions: tuple[str, ...] | None = None
    field: str = "data"
    num_threads: int = READ_THREADS
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "root", check_root(self.root, "FileFolderSourceConfig"))
        object.__setattr__(self, "extensions", check_extensions(self.extensions, "FileFolderSourceConfig", True))
        check_field_name(*field(self, "field"))
        if self.field == "label":
            raise ValueError("FileFolderSourceConfig.field cannot be 'label' (the class label's field); pick another "
                             "name, e.g. field='audio'")
        check_positive_int(*field(self, "num_threads"), unit="threads")
        check_positive_int(*field(self, "max_file_bytes"), unit="bytes")


class SkippedFilesWarning(DataraxWarning):
    """A folder scan left out hidden files or folders (AppleDouble `._x.jpg`, `.DS_Store`, `.git`)."""


class FolderLoopError(DataraxError, ValueError):
    """A folder scan reached one real directory twice through a symlink (a loop, or a link into
    another class); the message names the link."""


def scan_folder(root: str, extensions: tuple[str, ...] | None, owner: str = "FileFolderSource",
                what: str = "files", skipped: list[str] | None = None) -> tuple[list[str], list[str], np.ndarray]:
    """`(class names, file paths, labels)` of a class-folder tree, in the source's record order.

    Symlinks are followed, each real directory once; hidden files and folders are left out and
    appended to `skipped` when given.

    Raises:
        FileNotFoundError: the root is missing, has no class sub-folders, or a class has no files.
        FolderLoopError: a symlink leads to a directory the scan already reached.
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{owner} root {root!r} is not a folder; give the folder that holds "
                                f"one sub-folder of {what} per class (root/<class>/<{what.rstrip('s')}>)")
    entries = list(os.scandir(root))
    # Hidden folders (.ipynb_checkpoints, .git) are tooling, not classes.
    classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    hidden = sorted(e.path + (os.sep if e.is_dir() else "") for e in entries if e.name.startswith("."))
    if not classes:
        raise FileNotFoundError(f"{owner} root {root!r} has no class sub-folders; put the {what} in "
                                f"root/<class>/<{what.rstrip('s')}> (one sub-folder per class)")
    seen = {_key(root): root}
    seen.update({_key(os.path.join(root, name)): os.path.join(root, name) for name in classes})
    paths: list[str] = []
    labels: list[int] = []
    empty = []
    for label, name in enumerate(classes):
        found = []
        for folder, subfolders, files in os.walk(os.path.join(root, name), followlinks=True):
            keep = []
            for sub in subfolders:
                path = os.path.join(folder, sub)
                if sub.startswith("."):
                    hidden.append(path + os.sep)
                    continue
                key = _key(path)
                if key in seen:
                    raise FolderLoopError(
                        f"{owner} folder {path!r} is a link to {os.path.realpath(path)!r}, which the scan of {root!r} "
                        f"already reached as {seen[key]!r}; following it would list the same {what} twice (or "
                        "under another class). Remove the link, or replace it by a copy of the folder")
                seen[key] = path
                keep.append(sub)
            subfolders[:] = keep
            for f in files:
                if f.startswith("."):
                    hidden.append(os.path.join(folder, f))
                elif extensions is None or f.lower().endswith(extensions):
                    found.append(os.path.join(folder, f))
        if not found:
            empty.append(name)
        paths.extend(sorted(found))
        labels.extend([label] * len(found))
    if empty:
        endings = "" if extensions is None else f" ending in {extensions}"
        raise FileNotFoundError(f"{owner} class folder(s) {empty[:5]} under {root!r} hold no files{endings}; add "
                                f"{what}, remove the folders{'' if extensions is None else ', or widen extensions='}")
    if skipped is not None:
        skipped.extend(sorted(hidden))
    return classes, paths, np.asarray(labels, np.int32)


def _key(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino


class FileFolderSource(DataSourceModule):
    """Serves the files of a class-folder tree as `{field: bytes, "label": int32}` records.

    Args:
        config: a `FileFolderSourceConfig`; or its fields as keywords, `root` also by position
            (`FileFolderSource("sounds/train", shuffle=True)`).
        rngs: where an unset shuffle seed is drawn from.

    Attributes:
        class_names: the class sub-folder names; label i is `class_names[i]`.
        skipped_files: the hidden files and folders (ending in a separator) left out, in path order.
    """

    config_class = FileFolderSourceConfig
    positional = ("root",)
    _what = "files"

    def __init__(self, config: FileFolderSourceConfig | None = None, *args: Any, rngs: nnx.Rngs | None = None,
                 **settings: Any):
        self.config = resolve_config(self.config_class, config, settings, type(self).__name__, args=args,
                                     positional=self.positional)
        skipped: list[str] = []
        classes, paths, labels = scan_folder(self.config.root, self.config.extensions, type(self).__name__, self._what,
                                             skipped)
        self.skipped_files = tuple(skipped)
        if skipped:
            warn_at_caller(f"{type(self).__name__} left out {len(skipped)} hidden file(s) or folder(s) under "
                          f"{self.config.root!r} (names starting with '.', e.g. macOS AppleDouble '._x.jpg' files, "
                          f"which are not {self._what}): {list(skipped[:3])}{' ...' if len(skipped) > 3 else ''}; "
                          "the full list is source.skipped_files", SkippedFilesWarning)
        self.class_names = tuple(classes)
        self.seed = seed_from_rngs(self.config.seed, rngs)
        # A plain holder keeps the (possibly million-entry) file list out of NNX state and graph.
        self._files = Handles(paths=paths, labels=labels)
        self._pool = ThreadPool(self.config.num_threads, f"datarax-{type(self).__name__}")

    @property
    def field(self) -> str:
        """The field that holds each file's bytes."""
        return self.config.field

    def __len__(self) -> int:
        return len(self._files.paths)

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return {self.field: jax.ShapeDtypeStruct((), ENCODED), "label": jax.ShapeDtypeStruct((), np.int32)}

    @property
    def paths(self) -> tuple[str, ...]:
        """Every record's file path, in record order."""
        return tuple(self._files.paths)

    @property
    def labels(self) -> np.ndarray:
        """Every record's label, in record order (a read-only view)."""
        view = self._files.labels.view()
        view.flags.writeable = False
        return view

    def describe_record(self, record_id: int) -> str:
        return self._files.paths[record_id]

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        return read_batch(indices, out, self.element_spec(), len(self), self._read_flat)

    def _read_flat(self, flat: np.ndarray, out: dict[str, np.ndarray]) -> None:
        np.take(self._files.labels, flat, out=out["label"])
        paths, limit, owner = self._files.paths, self.config.max_file_bytes, type(self).__name__
        contents = self._pool.map(lambda item: _read(*item, limit, owner), [(i, paths[i]) for i in flat.tolist()])
        column = out[self.field]
        for i, content in enumerate(contents):  # item by item: numpy must not read bytes as sequences
            column[i] = content

    def read_references(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The batch `get_batch` returns with a `FileRef` in place of each file's bytes, for a host
        stage that reads the files in its own worker processes (`DecodeImage(executor="processes")`)."""
        paths, limit, owner = self._files.paths, self.config.max_file_bytes, type(self).__name__

        def fill(flat: np.ndarray, out: dict[str, np.ndarray]) -> None:
            np.take(self._files.labels, flat, out=out["label"])
            column = out[self.field]
            for i, record in enumerate(flat.tolist()):
                column[i] = FileRef(record, paths[record], limit, owner)

        return read_batch(indices, None, self.element_spec(), len(self), fill)

    def structure(self) -> str:
        # The file list relative to the root, not the root itself: a moved copy of the folder resumes.
        relative = "\n".join(os.path.relpath(p, self.config.root) for p in self._files.paths)
        return (f"{type(self).__name__}(len={len(self)}, classes={list(self.class_names)}, "
                f"files_crc32={zlib.crc32(relative.encode()):08x}{self._structure_extra()})")

    def _structure_extra(self) -> str:
        return f", field={self.field!r}"

    def close(self) -> None:
        """Shuts the reading threads down (a later read starts them again)."""
        self._pool.close()


@dataclasses.dataclass(frozen=True)
class FileRef:
    """A record's file, to be read where it is decoded: `read()` is what the source's own read does."""

    record: int
    path: str
    max_bytes: int
    owner: str

    def read(self) -> bytes:
        return _read(self.record, self.path, self.max_bytes, self.owner)


def _read(record: int, path: str, max_bytes: int, owner: str) -> bytes:
    where = f"{owner} record {record}"
    try:
        return read_data_file(path, max_bytes, where, f"max_file_bytes (now {max_bytes})")
    except FileNotFoundError as exc:  # still an OSError: a RetryPolicy retries it (a network mount may recover)
        raise FileNotFoundError(exc.errno, f"{where}: the file is gone (deleted or moved since the folder was "
                                "scanned); restore it, or build the source again to list the folder anew",
                                path) from None
