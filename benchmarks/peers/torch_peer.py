"""The PyTorch DataLoader, the way its tutorials build a training input pipeline.

A map-style `Dataset` whose `__getitem__` transforms one record with torch tensor ops (the
cifar work written as torchvision's `RandomCrop(32, padding=4, padding_mode="reflect")`,
`RandomHorizontalFlip()` and `Normalize(mean, std)` do it, on an HWC tensor so the output has the
layout a JAX model takes), default collation, `shuffle=True`, and `persistent_workers` so worker
processes live across epochs. Each worker draws from torch's per-worker seeded generator.

Settings chosen on this 2-core machine (measured, see docs/benchmarks.md (Peers)): cifar with 2
workers; tokens, with no per-record work, in the main process (`num_workers=0`), where worker
processes only add inter-process copies.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from benchmarks.peers.common import (
    CIFAR_MEAN,
    CIFAR_PAD,
    CIFAR_STD,
    JPEG_MEAN,
    JPEG_RATIO,
    JPEG_SCALE,
    JPEG_SIZE,
    JPEG_STD,
    Loader,
    PeerOptions,
    jpeg_pillow,
    pillow_crop_resize,
    require,
)

NAME = "torch"
INSTALL = "pip install torch"
LABELS = {"jpeg_variant": "torch[torchvision]"}  # the framework column of a variant's row
MODULE = "torch"


def _cifar_dataset(torch: Any, data: dict[str, np.ndarray]) -> Any:
    functional = torch.nn.functional

    class CifarDataset(torch.utils.data.Dataset):
        def __init__(self):
            self.images = torch.from_numpy(data["image"])
            self.labels = torch.from_numpy(data["label"])
            self.mean = torch.from_numpy(CIFAR_MEAN)
            self.std = torch.from_numpy(CIFAR_STD)

        def __len__(self) -> int:
            return len(self.labels)

        def __getitem__(self, index: int) -> dict:
            image = self.images[index].to(torch.float32).div_(255.0)
            height, width = image.shape[:2]
            # F.pad's reflect mode pads the last dimensions: pad H and W of a CHW view.
            chw = functional.pad(image.permute(2, 0, 1), (CIFAR_PAD,) * 4, mode="reflect")
            dy, dx = torch.randint(0, 2 * CIFAR_PAD + 1, (2,)).tolist()
            chw = chw[:, dy:dy + height, dx:dx + width]
            if torch.rand(()) < 0.5:
                chw = chw.flip(-1)
            image = chw.permute(1, 2, 0).sub_(self.mean).div_(self.std)
            return {"image": image, "label": self.labels[index]}

    return CifarDataset()


def _loader(torch: Any, dataset: Any, options: PeerOptions, workers: int) -> Any:
    generator = torch.Generator().manual_seed(options.seed)
    extra = {"persistent_workers": True, "prefetch_factor": 4} if workers > 0 else {}
    return torch.utils.data.DataLoader(dataset, batch_size=options.batch_size, shuffle=True, num_workers=workers,
                                       generator=generator, **extra)


def _numpy_epochs(loader: Any):
    def epoch():
        for batch in loader:
            yield {k: v.numpy() for k, v in batch.items()}

    return epoch


def cifar(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    torch = require(MODULE, NAME, INSTALL)
    workers = 2 if options.workers is None else options.workers
    loader = _loader(torch, _cifar_dataset(torch, data), options, workers)
    settings = f"Dataset.__getitem__ torch ops, DataLoader(shuffle=True, num_workers={workers}" + (
        ", persistent_workers=True, prefetch_factor=4)" if workers else ")")
    return Loader(_numpy_epochs(loader), settings)


def tokens(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    torch = require(MODULE, NAME, INSTALL)
    workers = 0 if options.workers is None else options.workers

    class TokenDataset(torch.utils.data.Dataset):
        def __init__(self):
            self.tokens = torch.from_numpy(data["tokens"])

        def __len__(self) -> int:
            return len(self.tokens)

        def __getitem__(self, index: int) -> dict:
            return {"tokens": self.tokens[index]}

    loader = _loader(torch, TokenDataset(), options, workers)
    return Loader(_numpy_epochs(loader), f"Dataset.__getitem__, DataLoader(shuffle=True, num_workers={workers})")


class _DictRecords:
    """A map-style dataset returning `{"image": HWC, "label": ...}` from a (CHW image, label) dataset."""

    def __init__(self, records: Any):
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict:
        image, label = self.records[index]
        return {"image": image.permute(1, 2, 0), "label": label}


def augment_chain(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    """The scenario's own torch dataset (`TorchChain`: the six transforms in torch tensor ops)."""
    torch = require(MODULE, NAME, INSTALL)
    from benchmarks.scenarios.augment_chain import TorchChain

    workers = 2 if options.workers is None else options.workers
    loader = _loader(torch, _DictRecords(TorchChain(data)), options, workers)
    return Loader(_numpy_epochs(loader), f"augment_chain.TorchChain (torch ops, grid_sample rotation), "
                                         f"DataLoader(shuffle=True, num_workers={workers})")


class JpegFiles:
    """A map-style dataset decoding one JPEG file per item with Pillow (`common.jpeg_pillow`)."""

    def __init__(self, data: dict, seed: int):
        self.paths, self.labels, self.seed = [str(p) for p in data["path"]], data["label"], seed
        self.rng = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict:
        import torch

        if self.rng is None:  # one generator per worker process, seeded from torch's per-worker seed
            self.rng = np.random.default_rng((self.seed, torch.initial_seed()))
        return {"image": torch.from_numpy(jpeg_pillow(self.paths[index], self.rng)),
                "label": int(self.labels[index])}


def jpeg(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    torch = require(MODULE, NAME, INSTALL)
    workers = (os.cpu_count() or 1) if options.workers is None else options.workers
    loader = _loader(torch, JpegFiles(data, options.seed), options, workers)
    return Loader(_numpy_epochs(loader), f"Dataset.__getitem__ Pillow decode+crop, DataLoader(shuffle=True, "
                                         f"num_workers={workers}, persistent_workers=True, prefetch_factor=4)",
                  quality=pillow_crop_resize)


class TorchvisionJpegFiles:
    """A map-style dataset as torchvision's current docs write it: `torchvision.io.decode_jpeg`
    of the file's bytes, then `transforms.v2` (RandomResizedCrop with its default antialias=True,
    RandomHorizontalFlip, ToDtype(float32, scale=True), Normalize); HWC out like every peer."""

    def __init__(self, data: dict):
        self.paths, self.labels = [str(p) for p in data["path"]], data["label"]
        self.transform = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> dict:
        import torch
        from torchvision import io
        from torchvision.transforms import v2

        if self.transform is None:
            self.transform = v2.Compose([v2.RandomResizedCrop(JPEG_SIZE, scale=JPEG_SCALE, ratio=JPEG_RATIO),
                                         v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, scale=True),
                                         v2.Normalize(list(JPEG_MEAN), list(JPEG_STD))])
        image = io.decode_jpeg(io.read_file(self.paths[index]), mode=io.ImageReadMode.RGB)
        return {"image": self.transform(image).permute(1, 2, 0), "label": int(self.labels[index])}


def torchvision_crop_resize(path: str, box: tuple[int, int, int, int]) -> np.ndarray:
    from torchvision import io
    from torchvision.transforms.v2 import functional

    image = io.decode_jpeg(io.read_file(path), mode=io.ImageReadMode.RGB)
    top, left, h, w = box
    return functional.resized_crop(image, top, left, h, w, [JPEG_SIZE, JPEG_SIZE]).permute(1, 2, 0).numpy()


def jpeg_variant(data: dict[str, np.ndarray], options: PeerOptions) -> Loader:
    torch = require(MODULE, NAME, INSTALL)
    require("torchvision", NAME, "pip install torchvision")
    workers = (os.cpu_count() or 1) if options.workers is None else options.workers
    loader = _loader(torch, TorchvisionJpegFiles(data), options, workers)
    return Loader(_numpy_epochs(loader), f"torchvision.io.decode_jpeg + transforms.v2.RandomResizedCrop, "
                                         f"DataLoader(shuffle=True, num_workers={workers}, persistent_workers=True, "
                                         f"prefetch_factor=4)", quality=torchvision_crop_resize)


WORKLOADS = {"cifar": cifar, "tokens": tokens, "augment_chain": augment_chain, "jpeg": jpeg,
             "jpeg_variant": jpeg_variant}
