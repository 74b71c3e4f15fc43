"""The objects a configuration names by where they are: arrays, dataset files, text, tokenizers, folders.

Relative paths are relative to the configuration file; named files must exist at validation, and a
failure while making an object is a `ConfigError` naming its key. Inside `probing(rows)` (what
`datarax validate` uses), parquet `files` are read only up to their first `rows` records.
docs/config.md ("Encoded data: host stages and files") lists what each key takes.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import dataclasses
import glob
import os
import re
import zipfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from datarax.config import registry
from datarax.config.schema import ConfigError, Path, format_path, is_table

DATA_HELP = ("an import path 'package.module:function' (returning a dict of arrays), a .npz file, or a table "
             "of field = \"file.npy\"")
# Keys of a source table naming folders, file patterns or shard URLs: relative local ones are taken
# from the config's folder.
PATH_KEYS = ("root", "directory", "paths", "urls", "manifest_dir", "cache_dir")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# Arguments of sources that are objects made by a function of yours, named by import path.
IMPORTED = ("dataset", "source")

_PROBE_ROWS: contextvars.ContextVar[int | None] = contextvars.ContextVar("datarax_config_probe_rows", default=None)
_PROBED: contextvars.ContextVar[list | None] = contextvars.ContextVar("datarax_config_probed", default=None)


@contextlib.contextmanager
def probing(rows: int) -> Iterator[list[str]]:
    """Within the block, sources opened from parquet `files` read only their first `rows` records.
    Yields a list that names each file set read short (so an epoch's length is not the data's)."""
    token = _PROBE_ROWS.set(max(int(rows), 1))
    short: list[str] = []
    probed = _PROBED.set(short)
    try:
        yield short
    finally:
        _PROBE_ROWS.reset(token)
        _PROBED.reset(probed)


class Deferred(abc.ABC):
    """A value made when its component is built (a file read, a function of yours called)."""

    path: Path

    @abc.abstractmethod
    def load(self) -> Any:
        """The value; a failure raises `ConfigError` naming `path`."""


@dataclasses.dataclass
class DataSpec(Deferred):
    """Where a source's arrays come from: an import path, a .npz file, or .npy files by field."""

    path: Path
    kind: str  # "import" (a callable or a mapping), "npz" (a path) or "npy" ({field: path})
    target: Any

    def load(self) -> Mapping[str, Any]:
        if self.kind == "npz":
            return read_array_file(self.target, self.path, lambda f: {k: f[k] for k in f.files})
        if self.kind == "npy":
            return {k: read_array_file(p, (*self.path, k)) for k, p in self.target.items()}
        data = self.target() if callable(self.target) else self.target
        if not isinstance(data, Mapping):
            raise TypeError(f"{format_path(self.path)} must give a dict of arrays, but its callable returned "
                            f"{type(data).__name__}; return {{'field': array, ...}}")
        return data


@dataclasses.dataclass
class Imported(Deferred):
    """An object named by import path: a function of yours is called (with no arguments), an
    object is used as it is."""

    path: Path
    spec: str
    target: Any

    def load(self) -> Any:
        if not callable(self.target):
            return self.target
        try:
            return self.target()
        except Exception as exc:  # whatever the user's function raised, named at its key
            raise ConfigError([f"{format_path(self.path)} names {self.spec!r}, which raised "
                               f"{type(exc).__name__}: {first_line(exc)}"]) from exc


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (a KeyError's without its quotes)."""
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def read_array_file(file: str, path: Path, take: Callable[[Any], Any] | None = None) -> Any:
    """`np.load(file, allow_pickle=False)` (then `take(archive)` for a .npz, closed after), or a
    `ConfigError` naming the TOML key at `path` and the file when it cannot be read."""
    kind = "a .npz archive" if take is not None else "a .npy array"
    where = f"{format_path(path)} names {os.path.basename(file)!r} ({file}), which"
    if os.path.getsize(file) == 0:
        raise ConfigError([f"{where} is empty (0 bytes); write it again with np.save/np.savez"])
    try:
        loaded = np.load(file, allow_pickle=False)
        if take is None:
            return loaded
        with loaded:
            return take(loaded)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        # allow_pickle=False refuses anything that is not an array file, as "pickled data".
        reason = "numpy could only read it by unpickling, which a configuration never does" \
            if "pickle" in str(exc) else f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
        writer = "np.savez" if take is not None else "np.save"
        raise ConfigError([f"{where} cannot be read as {kind}: {reason}; check that it is the file {writer} wrote"]) \
            from exc


def existing(name: str, path: Path, ctx: Any) -> str | None:
    """The absolute path of file `name` (relative to the config), or None after reporting it missing."""
    full = ctx.path_of(name)
    if not os.path.isfile(full):
        ctx.problems.add(path, f"names {name!r}, which does not exist (looked for {full}; relative paths are "
                               "relative to the config file)")
        return None
    return full


def data_spec(value: Any, path: Path, ctx: Any) -> DataSpec | None:
    """A source's `data`: an import path, a .npz file, or a table of .npy files."""
    problems = ctx.problems
    if isinstance(value, str) and registry.is_import_path(value) and not value.endswith((".npz", ".npy")):
        target = ctx.resolve_import(value, path)
        if target is None:
            return None
        if not (callable(target) or isinstance(target, Mapping)):
            problems.add(path, f"names {value!r}, which is {type(target).__name__}; name a function returning a "
                               "dict of arrays (or the dict itself)")
            return None
        return DataSpec(path, "import", target)
    if isinstance(value, str):
        if value.endswith(".npy"):
            problems.add(path, f"names one array file {value!r}; a source needs named fields: write "
                               f"data = {{ x = {value!r} }} or save them together in a .npz")
            return None
        if not value.endswith(".npz"):
            problems.add(path, f"must be {DATA_HELP}, got {value!r}")
            return None
        found = existing(value, path, ctx)
        return DataSpec(path, "npz", found) if found else None
    if is_table(value):
        files = {}
        for field, file in value.items():
            if not isinstance(file, str) or not file.endswith(".npy"):
                problems.add((*path, field), f"must be the path of a .npy file, got {file!r}")
                continue
            found = existing(file, (*path, field), ctx)
            if found:
                files[field] = found
        return DataSpec(path, "npy", files) if len(files) == len(value) and files else None
    problems.add(path, f"must be {DATA_HELP}, got {value!r}")
    return None


def imported(value: Any, name: str, path: Path, ctx: Any, what: str) -> Imported | None:
    """An argument that is an object of yours (`what`, e.g. "a datasets.Dataset"), named by import path."""
    if not (isinstance(value, str) and registry.is_import_path(value)):
        hint = " or give files = [...] instead" if name == "dataset" else ""
        ctx.problems.add(path, f"must be an import path 'package.module:function' of a function returning {what} (or "
                               f"of the object itself){hint}; a configuration does not fetch anything by name, got "
                               f"{value!r}")
        return None
    target = ctx.resolve_import(value, path)
    return None if target is None else Imported(path, value, target)


def tokenizer(value: Any, path: Path, ctx: Any) -> str | Imported | None:
    """`tokenizer`: a tokenizer JSON file (its absolute path, which the stage or source loads) or
    an import path of a `tokenizers.Tokenizer` or a function returning one."""
    if isinstance(value, str) and registry.is_import_path(value) and not value.endswith(".json"):
        target = ctx.resolve_import(value, path)
        return None if target is None else Imported(path, value, target)
    if not isinstance(value, str):
        ctx.problems.add(path, f"must be the path of a tokenizer JSON file (Tokenizer.save) or an import path "
                               f"'package.module:name', got {value!r}")
        return None
    return existing(value, path, ctx)


@dataclasses.dataclass
class FieldRef:
    """A sampler argument read from a field of the pipeline's source (`groups = "label"`)."""

    path: Path
    field: str


def record_field(source: Any, ref: FieldRef) -> np.ndarray:
    """Every record's value of `ref.field`, in record order: a folder source's `labels` for its
    `label` field, else read from the source (`get_batch`) in blocks of 8,192 records."""
    spec = source.element_spec()
    if ref.field not in spec:
        raise ConfigError([f"{format_path(ref.path)} names the field {ref.field!r}, which the source's records do "
                           f"not hold (fields: {', '.join(sorted(spec))})"])
    labels = getattr(source, "labels", None)
    if ref.field == "label" and labels is not None:
        return np.asarray(labels)
    n = len(source)
    return np.concatenate([np.asarray(source.get_batch(np.arange(i, min(i + 8192, n)))[ref.field])
                           for i in range(0, n, 8192)])


def object_parameter(kind: str, name: str, hint: Any, value: Any, path: Path, ctx: Any) -> tuple[bool, Any]:
    """`(True, value)` for an argument this module reads (see docs/config.md), else `(False, None)`."""
    if name == "tokenizer":
        return True, tokenizer(value, path, ctx)
    if kind == "sampler" and name == "groups" and isinstance(value, str):
        return True, FieldRef(path, value)
    if kind != "source":
        return False, None
    if name == "data":
        return True, data_spec(value, path, ctx)
    if name in IMPORTED and hint is Any:
        return True, imported(value, name, path, ctx, "the dataset" if name == "dataset" else "the source")
    return False, None


def resolve_paths(params: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
    """A source's `PATH_KEYS` with relative paths taken from the config's folder."""
    out = dict(params)

    def local(value: str) -> str:
        return value if _URL.match(value) else ctx.path_of(value)

    for key in PATH_KEYS:
        value = out.get(key)
        if isinstance(value, str):
            out[key] = local(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            out[key] = [local(v) for v in value]
    return out


def expand_files(value: Any, path: Path, ctx: Any) -> list[str] | None:
    """`files`: a path, a glob pattern or a list of them, each matching at least one file."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
        ctx.problems.add(path, "must be a file path or a non-empty list of them (glob patterns allowed), got "
                               f"{value!r}")
        return None
    found: list[str] = []
    for i, name in enumerate(items):
        here = path if isinstance(value, str) else (*path, i)
        if glob.has_magic(name):
            matches = sorted(p for p in glob.glob(ctx.path_of(name)) if os.path.isfile(p))
            if not matches:
                ctx.problems.add(here, f"matches no file (looked for {ctx.path_of(name)}; relative paths are relative "
                                       "to the config file)")
            found.extend(matches)
        else:
            full = existing(name, here, ctx)
            if full:
                found.append(full)
    return found if len(found) >= len(items) else None


@dataclasses.dataclass(frozen=True)
class FilesRoute:
    """`files = [...]` in place of constructor arguments made from files.

    Attributes:
        replaces: the constructor arguments `files` stands for (giving both is an error).
        options: other keys the route reads (not passed to the constructor).
        open: `open(cls, paths, options, kwargs) -> the component`.
    """

    replaces: tuple[str, ...]
    options: tuple[str, ...]
    open: Callable[[type, list[str], dict[str, Any], dict[str, Any]], Any]


def _hf_dataset(cls: type, paths: list[str], options: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    from datarax.sources.hf import load_files
    from datarax.sources.stream import StreamSourceModule

    streaming = issubclass(cls, StreamSourceModule)
    file_format = options.get("file_format")
    rows = _PROBE_ROWS.get()
    dataset = None
    if rows is not None and not streaming:
        dataset = probe_parquet(paths, file_format, rows)
    if dataset is None:
        dataset = load_files(paths, streaming=streaming, file_format=file_format, cache_dir=options.get("cache_dir"))
    return cls(dataset=dataset, **kwargs)


def _text_files(cls: type, paths: list[str], options: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    config = kwargs.pop("config", None)
    return cls.from_files(paths, config, **kwargs)


def route_for(cls: Any) -> FilesRoute | None:
    """The `files` route of a source class, or None when it has none."""
    from datarax.sources.hf import HFSource, HFStreamSource
    from datarax.sources.text import TextSource

    if not isinstance(cls, type):
        return None
    if issubclass(cls, (HFSource, HFStreamSource)):
        return FilesRoute(("dataset",), ("file_format", "cache_dir"), _hf_dataset)
    if issubclass(cls, TextSource):
        return FilesRoute(("documents", "origins"), (), _text_files)
    return None


@dataclasses.dataclass
class RouteFactory:
    """Builds a component through its `files` route (what `ComponentSpec.factory` holds then)."""

    cls: type
    route: FilesRoute
    paths: list[str]
    options: dict[str, Any]
    path: Path

    def __call__(self, **kwargs: Any) -> Any:
        try:
            return self.route.open(self.cls, list(self.paths), dict(self.options), kwargs)
        except ConfigError:
            raise
        except Exception as exc:  # a reader's own error (datasets, pyarrow), named at the key
            raise ConfigError([f"{format_path((*self.path, 'files'))} could not be opened as {self.cls.__name__}: "
                               f"{type(exc).__name__}: {first_line(exc)}"]) from exc


def probe_parquet(paths: list[str], file_format: str | None, rows: int) -> Any:
    """A `datasets.Dataset` of the first `rows` records of parquet `paths` (reading only their row
    groups; every file's schema is checked); None when the files are not parquet."""
    if (file_format or "").lower() not in ("", "parquet") or \
            (file_format is None and not all(p.lower().endswith(".parquet") for p in paths)):
        return None
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datarax.sources.hf import check_same_columns, check_table_file

    schemas = {p: check_table_file(p, "parquet") for p in paths}
    check_same_columns(schemas)
    schema = schemas[paths[0]]
    batches, have = [], 0
    for p in paths:
        reader = pq.ParquetFile(p)
        try:
            for batch in reader.iter_batches(batch_size=rows):
                batches.append(batch)
                have += len(batch)
                if have >= rows:
                    break
        finally:
            reader.close()
        if have >= rows:
            break
    table = pa.Table.from_batches(batches, schema=schema).slice(0, rows)
    short = _PROBED.get()
    if short is not None and (len(table) < have or p != paths[-1]):
        short.append(", ".join(paths))
    features = datasets.Features.from_arrow_schema(schema)
    return datasets.Dataset(datasets.table.InMemoryTable(table), info=datasets.DatasetInfo(features=features))
