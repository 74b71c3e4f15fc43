"""TensorFlow Datasets as a datarax source: `tfds.data_source` (random access, no TensorFlow) by
default, or `read="load"` (`tfds.load`, any prepared format, needs TensorFlow) materialised once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.core.checks import check_bool, field, require
from datarax.core.construct import resolve_config
from datarax.core.fields import (
    UnsupportedColumnError,
    batchable,
    check_column_config,
    check_columns,
    check_convert_output,
    flatten,
    read_batch,
    spec_table,
    stack_into,
    unsupported_message,
)
from datarax.core.source import DataSourceModule, Handles, ShuffleConfig, seed_from_rngs
from datarax.sources.memory import MemorySource, MemorySourceConfig

Convert = Callable[[dict[str, Any]], Mapping[str, Any]]
_READS = ("data_source", "load")
NEEDS_TF = ("TFDSSource(read='load') needs TensorFlow: pip install tensorflow; the default "
            "read='data_source' reads ArrayRecord-prepared datasets without it")


@dataclasses.dataclass(frozen=True)
class TFDSSourceConfig(ShuffleConfig):
    """Configuration of a `TFDSSource`.

    Attributes:
        name: the TFDS dataset name (e.g. "mnist" or "mnist:3.0.1").
        split: the split (TFDS slicing such as "train[:10%]" works).
        data_dir: where the prepared dataset lives (None: the TFDS default).
        fields: the features to read (nested ones as "a/b"); None reads all.
        read: "data_source" (random access, no TensorFlow) or "load" (needs TensorFlow).
        download: let TFDS download and prepare the dataset if it is missing.
    """

    name: str
    split: str = "train"
    data_dir: str | None = None
    fields: tuple[str, ...] | None = None
    read: str = "data_source"
    download: bool = False

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"TFDSSourceConfig.name must be a dataset name such as 'mnist', got {self.name!r}")
        if not isinstance(self.split, str) or not self.split:
            raise TypeError(f"TFDSSourceConfig.split must be a split name such as 'train', got {self.split!r}")
        check_column_config(self.fields, "TFDSSourceConfig")
        check_bool(*field(self, "download"))
        if self.read not in _READS:
            raise ValueError(f"TFDSSourceConfig.read must be one of {_READS}, got {self.read!r}")


def _open(tfds: Any, config: TFDSSourceConfig) -> Any:
    where = f"TFDSSource cannot open {config.name!r} split {config.split!r} in data_dir={config.data_dir!r}"
    missing = (f"{where}: it is not prepared there. Prepare it first (builder.download_and_prepare("
               "file_format='array_record')), point data_dir at it, or set download=True")
    try:
        return tfds.data_source(config.name, split=config.split, data_dir=config.data_dir, download=config.download)
    except tfds.core.registered.DatasetNotFoundError as exc:
        raise FileNotFoundError(f"{where}: {str(exc).splitlines()[0]} (no such TFDS dataset); check the name") from None
    except (FileNotFoundError, AssertionError):
        raise FileNotFoundError(missing) from None
    except NotImplementedError:
        # TFDS says this both for TFRecord-prepared data and for data that is not there at all.
        if not tfds.builder(config.name, data_dir=config.data_dir).is_prepared():
            raise FileNotFoundError(missing) from None
        raise ValueError(f"{where}: it is prepared as TFRecord, which has no random access. Prepare it with "
                         "file_format='array_record', or use read='load' (needs TensorFlow)") from None


def _features(info: Any) -> dict[str, tuple[tuple, np.dtype] | str]:
    """Each flattened feature's (shape, dtype), or why it cannot be batched."""
    out: dict[str, tuple[tuple, np.dtype] | str] = {}
    for name, t in flatten(info.features.get_tensor_info()).items():
        dtype = np.dtype(t.np_dtype)
        if not batchable(dtype):
            out[name] = f"dtype {dtype}"
        elif any(d is None or d < 0 for d in t.shape):
            out[name] = f"variable shape {t.shape}"
        else:
            out[name] = (tuple(t.shape), dtype)
    return out


class TFDSSource(DataSourceModule):
    """A TFDS split as a random-access source.

    Args:
        config: dataset, split, columns, shuffling and the read path; or its fields as keywords,
            `name` also by position (`TFDSSource("mnist", split="test")`).
        convert: optional function turning a batch of non-numeric or variable-shape features
            (as lists) into fixed-shape arrays; its fields add to or replace the numeric ones.
        rngs: draws the shuffle seed when `config.seed` is None.

    Example:
        >>> source = TFDSSource(TFDSSourceConfig(name="mnist", split="train", shuffle=True, seed=0))
    """

    positional = ("name",)

    def __init__(self, config: TFDSSourceConfig | None = None, *args: Any, convert: Convert | None = None,
                 rngs: nnx.Rngs | None = None, **settings: Any):
        config = resolve_config(TFDSSourceConfig, config, settings, "TFDSSource", args=args,
                                positional=self.positional)
        if convert is not None and not callable(convert):
            raise TypeError(f"TFDSSource convert must be a function batch -> dict of arrays, got {convert!r}")
        tfds = require("tensorflow_datasets", owner="TFDSSource", extra="data", package="tensorflow-datasets")
        self.config = config
        self.seed = seed_from_rngs(config.seed, rngs)
        if config.read == "load":
            try:
                require("tensorflow", owner="TFDSSource(read='load')", extra="data")
            except ImportError:
                raise ImportError(NEEDS_TF) from None
            self.memory = self._load(tfds, config, convert)
            self._io = Handles(source=None, spec=self.memory.element_spec(), convert=convert, numeric=(), other=())
            self._length = len(self.memory)
            self._identity = (config.name, config.split)
            return
        self.memory = None
        source = _open(tfds, config)
        features = _features(source.dataset_info)
        names = check_columns(config.fields, list(features), "TFDSSource")
        bad = {n: features[n] for n in names if isinstance(features[n], str)}
        if bad and convert is None:
            raise UnsupportedColumnError(unsupported_message("TFDSSource", bad))
        numeric = tuple(n for n in names if n not in bad)
        self._length = len(source)
        if self._length == 0:
            raise ValueError(f"TFDSSource split {config.split!r} of {config.name!r} has no records")
        spec = {n: jax.ShapeDtypeStruct(*features[n]) for n in numeric}
        self._io = Handles(source=source, spec=spec, convert=convert, numeric=numeric, other=tuple(bad), batched=True)
        if convert is not None:
            added = self._converted(self._records(np.arange(min(2, self._length))))
            spec.update({k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in added.items()})
        info = source.dataset_info
        self._identity = (info.full_name, config.split)

    def _records(self, flat: np.ndarray) -> list[dict[str, Any]]:
        source, keys = self._io.source, flat.tolist()
        if self._io.batched:
            try:
                return [flatten(r) for r in source.__getitems__(keys)]
            except TypeError:
                # tfds.testing.mock_data (4.9.x) installs an unbound __getitems__; read one by one.
                self._io.batched = False
        return [flatten(source[k]) for k in keys]

    def _converted(self, records: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        batch = {n: [r[n] for r in records] for n in self._io.other}
        batch.update({n: np.stack([r[n] for r in records]) for n in self._io.numeric})
        return check_convert_output(self._io.convert(batch), len(records), "TFDSSource convert")

    def _read_flat(self, flat: np.ndarray, out: dict[str, np.ndarray]) -> None:
        records = self._records(flat)
        added = self._converted(records) if self._io.convert is not None else {}
        stack_into(records, {k: out[k] for k in self._io.numeric if k not in added}, "TFDSSource")
        for name, value in added.items():
            out[name][...] = value

    @staticmethod
    def _load(tfds: Any, config: TFDSSourceConfig, convert: Convert | None) -> MemorySource:
        data = tfds.as_numpy(tfds.load(config.name, split=config.split, data_dir=config.data_dir,
                                       download=config.download, batch_size=-1))
        arrays = flatten(data)
        names = check_columns(config.fields, list(arrays), "TFDSSource")
        arrays = {n: np.asarray(arrays[n]) for n in names}
        bad = {n: f"dtype {a.dtype}" for n, a in arrays.items() if not batchable(a.dtype)}
        if bad and convert is None:
            raise UnsupportedColumnError(unsupported_message("TFDSSource", bad))
        if convert is not None:
            size = len(next(iter(arrays.values())))
            arrays.update(check_convert_output(convert(dict(arrays)), size, "TFDSSource convert"))
            arrays = {n: a for n, a in arrays.items() if n not in bad}
        return MemorySource(MemorySourceConfig(device_resident=False), data=arrays)

    def __len__(self) -> int:
        return self._length

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return dict(self._io.spec)

    def get_batch(self, indices: np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        if self.memory is not None:
            return self.memory.get_batch(indices, out)
        return read_batch(indices, out, self._io.spec, self._length, self._read_flat)

    def structure(self) -> str:
        name, split = self._identity
        return f"TFDSSource(len={len(self)}, spec={spec_table(self.element_spec())}, dataset={name}, split={split})"
