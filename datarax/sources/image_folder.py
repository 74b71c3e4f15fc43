"""`ImageFolderSource`: a folder of class sub-folders of image files, as encoded records.

The layout torchvision's `ImageFolder` reads:

    root/
      cat/001.jpg, cat/002.jpg, ...
      dog/xyz.png, dog/nested/abc.jpg, ...

Class sub-folders, sorted by name, become labels 0, 1, ...; the files of each (searched
recursively, sorted by path) follow one another in that order, so record i is the same file on
every machine and the pipeline's Feistel shuffle and resume are exact. A record is the file's
bytes (an encoded field, decoded by a host stage such as `DecodeImage`) and its int32 label.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
import zlib
from typing import Any

import jax
import numpy as np
from flax import nnx

from datarax.control.pool import ThreadPool
from datarax.core.checks import check_positive_int, field
from datarax.core.construct import resolve_config
from datarax.core.source import DataSourceModule, Handles, ShuffleConfig, seed_from_rngs
from datarax.host.stage import ENCODED
from datarax.sources._columns import read_batch


# torchvision's IMG_EXTENSIONS, compared without case.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
READ_THREADS = 4  # file reads are short syscalls that release the GIL; a few threads hide their latency


@dataclasses.dataclass(frozen=True)
class ImageFolderSourceConfig(ShuffleConfig):
    """Configuration of an `ImageFolderSource`.

    Attributes:
        root: the folder holding one sub-folder per class.
        extensions: file name endings that count as images (compared without case).
        num_threads: threads reading files.
    """

    root: str
    extensions: tuple[str, ...] = IMAGE_EXTENSIONS
    num_threads: int = READ_THREADS

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.root, (str, os.PathLike)) or not os.fspath(self.root):
            raise TypeError(f"ImageFolderSourceConfig.root must be a folder path, got {self.root!r}")
        object.__setattr__(self, "root", os.fspath(self.root))
        extensions = (self.extensions,) if isinstance(self.extensions, str) else self.extensions
        if (not isinstance(extensions, (tuple, list)) or not extensions
                or not all(isinstance(e, str) and e.startswith(".") for e in extensions)):
            raise ValueError(f"ImageFolderSourceConfig.extensions must be a tuple of endings such as ('.jpg', '.png'), "
                             f"got {self.extensions!r}")
        object.__setattr__(self, "extensions", tuple(e.lower() for e in extensions))
        check_positive_int(*field(self, "num_threads"), unit="threads")


def scan_image_folder(root: str, extensions: tuple[str, ...]) -> tuple[list[str], list[str], np.ndarray]:
    """`(class names, file paths, labels)` of an image folder, in the source's record order.

    Raises:
        FileNotFoundError: the root is missing, has no class sub-folders, or a class has no images.
    """
    if not os.path.isdir(root):
        raise FileNotFoundError(f"ImageFolderSource root {root!r} is not a folder; give the folder that holds "
                                "one sub-folder of images per class (root/<class>/<image>)")
    # Hidden folders (.ipynb_checkpoints, .git) are tooling, not classes.
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise FileNotFoundError(f"ImageFolderSource root {root!r} has no class sub-folders; put the images in "
                                "root/<class>/<image> (one sub-folder per class)")
    paths: list[str] = []
    labels: list[int] = []
    empty = []
    for label, name in enumerate(classes):
        found = []
        for folder, subfolders, files in os.walk(os.path.join(root, name), followlinks=True):
            subfolders[:] = [s for s in subfolders if not s.startswith(".")]
            found.extend(os.path.join(folder, f) for f in files if f.lower().endswith(extensions))
        if not found:
            empty.append(name)
        paths.extend(sorted(found))
        labels.extend([label] * len(found))
    if empty:
        raise FileNotFoundError(f"ImageFolderSource class folder(s) {empty[:5]} under {root!r} hold no files ending "
                                f"in {extensions}; add images, remove the folders, or widen extensions=")
    return classes, paths, np.asarray(labels, np.int32)


class ImageFolderSource(DataSourceModule):
    """Serves the files of an image folder as `{"image": bytes, "label": int32}` records.

    Args:
        config: an `ImageFolderSourceConfig`; or its fields as keywords (`root=` names the folder
            holding one sub-folder per class, see the module docstring).
        rngs: where an unset shuffle seed is drawn from.

    Attributes:
        class_names: the class sub-folder names; label i is `class_names[i]`.

    Example:
        >>> source = ImageFolderSource(root="photos/train", shuffle=True, seed=0)
        >>> pipeline = Pipeline(source, [DecodeImage(size=224, crop="random_resized")], batch_size=64)
    """

    def __init__(self, config: ImageFolderSourceConfig | None = None, *, rngs: nnx.Rngs | None = None,
                 **settings: Any):
        self.config = resolve_config(ImageFolderSourceConfig, config, settings, "ImageFolderSource",
                                     positional=("root", (str, os.PathLike)))
        classes, paths, labels = scan_image_folder(self.config.root, self.config.extensions)
        self.class_names = tuple(classes)
        self.seed = seed_from_rngs(self.config.seed, rngs)
        # A plain holder keeps the (possibly million-entry) file list out of NNX state and graph.
        self._files = Handles(paths=paths, labels=labels)
        self._pool = ThreadPool(self.config.num_threads, "datarax-image-folder")

    @classmethod
    def from_config(cls, config: ImageFolderSourceConfig) -> ImageFolderSource:
        """Deprecated: `ImageFolderSource(config)`."""
        warnings.warn("ImageFolderSource.from_config(config) is deprecated: write ImageFolderSource(config)",
                      DeprecationWarning, stacklevel=2)
        return cls(config)

    def __len__(self) -> int:
        return len(self._files.paths)

    def element_spec(self) -> dict[str, jax.ShapeDtypeStruct]:
        return {"image": jax.ShapeDtypeStruct((), ENCODED), "label": jax.ShapeDtypeStruct((), np.int32)}

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
        paths = self._files.paths
        np.take(self._files.labels, flat, out=out["label"])
        contents = self._pool.map(_read, [paths[i] for i in flat.tolist()])
        images = out["image"]
        for i, content in enumerate(contents):  # item by item: numpy must not read bytes as sequences
            images[i] = content

    def structure(self) -> str:
        # The file list relative to the root, not the root itself: a moved copy of the folder resumes.
        relative = "\n".join(os.path.relpath(p, self.config.root) for p in self._files.paths)
        return (f"ImageFolderSource(len={len(self)}, classes={list(self.class_names)}, "
                f"files_crc32={zlib.crc32(relative.encode()):08x})")

    def close(self) -> None:
        """Shuts the reading threads down (a later read starts them again)."""
        self._pool.close()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()

