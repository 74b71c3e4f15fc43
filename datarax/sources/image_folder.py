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

import concurrent.futures
import dataclasses
import os
import threading
import zlib
import jax
import numpy as np

from datarax.core.checks import check_bool, check_positive_int, field
from datarax.core.source import DataSourceModule
from datarax.host.stage import ENCODED
from datarax.samplers.base import Sampler
from datarax.samplers.feistel import validate_seed
from datarax.samplers.simple import SequentialSampler, ShuffleSampler
from datarax.sources._columns import Handles, read_batch

# torchvision's IMG_EXTENSIONS, compared without case.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
READ_THREADS = 4  # file reads are short syscalls that release the GIL; a few threads hide their latency


@dataclasses.dataclass(frozen=True)
class ImageFolderSourceConfig:
    """Configuration of an `ImageFolderSource`.

    Attributes:
        root: the folder holding one sub-folder per class.
        extensions: file name endings that count as images (compared without case).
        shuffle: a fresh record order every epoch (Feistel permutation keyed by (seed, epoch)).
        seed: the shuffle seed.
        num_threads: threads reading files.
    """

    root: str
    extensions: tuple[str, ...] = IMAGE_EXTENSIONS
    shuffle: bool = False
    seed: int = 0
    num_threads: int = READ_THREADS

    def __post_init__(self):
        if not isinstance(self.root, (str, os.PathLike)) or not os.fspath(self.root):
            raise TypeError(f"ImageFolderSourceConfig.root must be a folder path, got {self.root!r}")
        object.__setattr__(self, "root", os.fspath(self.root))
        extensions = (self.extensions,) if isinstance(self.extensions, str) else self.extensions
        if (not isinstance(extensions, (tuple, list)) or not extensions
                or not all(isinstance(e, str) and e.startswith(".") for e in extensions)):
            raise ValueError(f"ImageFolderSourceConfig.extensions must be a tuple of endings such as ('.jpg', '.png'), "
                             f"got {self.extensions!r}")
        object.__setattr__(self, "extensions", tuple(e.lower() for e in extensions))
        check_bool(*field(self, "shuffle"))
        validate_seed(self.seed, "ImageFolderSourceConfig.seed")
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
        root: the folder holding one sub-folder per class (see the module docstring).
        extensions: file name endings that count as images.
        shuffle: a fresh record order every epoch.
        seed: the shuffle seed.
        num_threads: threads reading files.

    Attributes:
        class_names: the class sub-folder names; label i is `class_names[i]`.

    Example:
        >>> source = ImageFolderSource("photos/train", shuffle=True, seed=0)
        >>> pipeline = Pipeline(source, [DecodeImage(224, crop="random_resized")], batch_size=64)
    """

    def __init__(self, root: str | os.PathLike, *, extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
                 shuffle: bool = False, seed: int = 0, num_threads: int = READ_THREADS):
        self.config = ImageFolderSourceConfig(root=root, extensions=extensions, shuffle=shuffle, seed=seed,
                                              num_threads=num_threads)
        classes, paths, labels = scan_image_folder(self.config.root, self.config.extensions)
        self.class_names = tuple(classes)
        self.seed = self.config.seed
        # A plain holder keeps the (possibly million-entry) file list out of NNX state and graph.
        self._files = Handles(paths=paths, labels=labels, pool=None, lock=threading.Lock())

    @classmethod
    def from_config(cls, config: ImageFolderSourceConfig) -> ImageFolderSource:
        """The source an `ImageFolderSourceConfig` describes."""
        if not isinstance(config, ImageFolderSourceConfig):
            raise TypeError(f"config must be an ImageFolderSourceConfig, got {type(config).__name__}")
        return cls(config.root, extensions=config.extensions, shuffle=config.shuffle, seed=config.seed,
                   num_threads=config.num_threads)

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
        chosen = [paths[i] for i in flat.tolist()]
        if len(chosen) == 1 or self.config.num_threads == 1:
            contents = list(map(_read, chosen))
        else:
            contents = list(self._executor().map(_read, chosen))
        images = out["image"]
        for i, content in enumerate(contents):  # item by item: numpy must not read bytes as sequences
            images[i] = content

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        files = self._files
        with files.lock:
            if files.pool is None:
                files.pool = concurrent.futures.ThreadPoolExecutor(self.config.num_threads, "datarax-image-folder")
            return files.pool

    def default_sampler(self) -> Sampler:
        if self.config.shuffle:
            return ShuffleSampler(len(self), seed=self.seed)
        return SequentialSampler(len(self))

    def structure(self) -> str:
        # The file list relative to the root, not the root itself: a moved copy of the folder resumes.
        relative = "\n".join(os.path.relpath(p, self.config.root) for p in self._files.paths)
        return (f"ImageFolderSource(len={len(self)}, classes={list(self.class_names)}, "
                f"files_crc32={zlib.crc32(relative.encode()):08x})")

    def close(self) -> None:
        """Shuts the reading threads down (a later read starts them again)."""
        files = self._files
        with files.lock:
            pool, files.pool = files.pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()

