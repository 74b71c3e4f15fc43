"""`ImageFolderSource`: torchvision's `ImageFolder` layout (class sub-folders of images) as encoded
records: `FileFolderSource` with image extensions and the field `image`.
"""

from __future__ import annotations

import dataclasses

from datarax.core.checks import check_positive_int, field
from datarax.core.source import ShuffleConfig
from datarax.sources._paths import DEFAULT_MAX_FILE_BYTES
from datarax.sources.file_folder import READ_THREADS, FileFolderSource, check_extensions, check_root

# torchvision's IMG_EXTENSIONS, compared without case.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclasses.dataclass(frozen=True)
class ImageFolderSourceConfig(ShuffleConfig):
    """Configuration of an `ImageFolderSource`.

    Attributes:
        root: the folder holding one sub-folder per class.
        extensions: file name endings that count as images (compared without case).
        num_threads: threads reading files.
        max_file_bytes: the largest file read; a larger one (or a non-regular file) is a `DataPathError`.
    """

    root: str
    extensions: tuple[str, ...] = IMAGE_EXTENSIONS
    num_threads: int = READ_THREADS
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "root", check_root(self.root, "ImageFolderSourceConfig"))
        object.__setattr__(self, "extensions", check_extensions(self.extensions, "ImageFolderSourceConfig", False))
        check_positive_int(*field(self, "num_threads"), unit="threads")
        check_positive_int(*field(self, "max_file_bytes"), unit="bytes")

    @property
    def field(self) -> str:
        return "image"


class ImageFolderSource(FileFolderSource):
    """Serves the files of an image folder as `{"image": bytes, "label": int32}` records (see `FileFolderSource`).

    Example:
        >>> source = ImageFolderSource("photos/train", shuffle=True, seed=0)
        >>> pipeline = Pipeline(source, [DecodeImage(224, crop="random_resized")], batch_size=64)
    """

    config_class = ImageFolderSourceConfig
    _what = "images"

    def _structure_extra(self) -> str:
        return ""  # the field is always "image": the fingerprint it had before FileFolderSource existed
