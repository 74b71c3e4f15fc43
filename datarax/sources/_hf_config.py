"""The config and the shared constructor checks of `HFSource` and `HFStreamSource`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from datarax.core.checks import check_bool, check_positive_int, field, require
from datarax.core.construct import resolve_config
from datarax.core.fields import check_column_config
from datarax.core.source import ShuffleConfig
from datarax.sources._paths import DEFAULT_MAX_FILE_BYTES

Convert = Callable[[dict[str, Any]], Mapping[str, Any]]
_MODES = ("auto", "eager", "lazy")


@dataclasses.dataclass(frozen=True)
class HFSourceConfig(ShuffleConfig):
    """Configuration of `HFSource` and `HFStreamSource`.

    Attributes:
        fields: the columns to read; None reads all (each must then be numeric, encoded or
            handled by `convert`).
        encoded: `HFSource` only: columns read as raw `bytes` or `str` records for a host stage.
        mode: map-style only: "eager" converts the whole dataset to arrays once, "lazy" reads
            rows from the Arrow table per batch, "auto" is eager up to `eager_max_bytes`.
        eager_max_bytes: the Arrow size up to which "auto" is eager.
        device_resident: eager only: keep the arrays on the device (None decides by size).
        block_size: streams only: records read (and shuffled together) per block.
        files_root: `HFSource` only: the folder relative paths in `Image`/`Audio` rows are read
            from; None: the folders of the data files given to `load_files`.
        allow_outside_root: read row paths outside the dataset's roots (off: `/etc/passwd` is refused).
        max_file_bytes: the largest file a row's path may name; a larger one is refused unread.
    """

    fields: tuple[str, ...] | None = None
    encoded: tuple[str, ...] = ()
    mode: str = "auto"
    eager_max_bytes: int = 2**30
    device_resident: bool | None = None
    block_size: int = 1024
    files_root: str | None = None
    allow_outside_root: bool = False
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES

    def __post_init__(self):
        super().__post_init__()
        check_column_config(self.fields, "HFSourceConfig")
        if not isinstance(self.encoded, tuple) or not all(isinstance(c, str) and c for c in self.encoded):
            raise TypeError(f"HFSourceConfig.encoded must be a tuple of column names, e.g. ('image',), got "
                            f"{self.encoded!r}")
        if self.mode not in _MODES:
            raise ValueError(f"HFSourceConfig.mode must be one of {_MODES}, got {self.mode!r}")
        if self.files_root is not None:
            if not isinstance(self.files_root, (str, os.PathLike)) or not os.fspath(self.files_root):
                raise TypeError(f"HFSourceConfig.files_root must be a folder path or None, got {self.files_root!r}")
            object.__setattr__(self, "files_root", os.fspath(self.files_root))
        check_bool(*field(self, "allow_outside_root"))
        for name in ("eager_max_bytes", "block_size", "max_file_bytes"):
            check_positive_int(*field(self, name))
        check_bool(*field(self, "device_resident"), allow_none=True)


def check_arguments(config: Any, settings: dict[str, Any], dataset: Any, convert: Any, owner: str,
                     want: str) -> HFSourceConfig:
    """The shared constructor checks of HFSource and HFStreamSource; returns the config to use."""
    datasets = require("datasets", owner=owner, extra="data")
    config = resolve_config(HFSourceConfig, config, settings, owner)
    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        raise TypeError(f"{owner} dataset is a dict of splits {list(dataset)}; pass one split, e.g. dataset['train']")
    if not isinstance(dataset, getattr(datasets, want)):
        other_kind, other = ("IterableDataset", "HFStreamSource") if want == "Dataset" else ("Dataset", "HFSource")
        if isinstance(dataset, getattr(datasets, other_kind)):
            raise TypeError(f"{owner} dataset must be a datasets.{want}, got {other_kind}; use {other} for it")
        streaming = ", streaming=True" if want == "IterableDataset" else ""
        raise TypeError(f"{owner} dataset must be a datasets.{want}, got {type(dataset).__name__} ({dataset!r:.60}); "
                        f"load one first, e.g. datarax.sources.hf.load_files(['train.parquet']{streaming}) or "
                        f"datasets.load_dataset(...{streaming})['train']")
    if convert is not None and not callable(convert):
        raise TypeError(f"{owner} convert must be a function batch -> dict of arrays, got {convert!r}")
    return config
