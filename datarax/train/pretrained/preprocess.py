"""The input stages a pretrained network expects, built from its checkpoint's configuration.

A Hugging Face image checkpoint's `preprocessor_config.json` states the image size and the
normalisation (`size`, `crop_size`, `do_center_crop`, `image_mean`, `image_std`); an audio one
states `sampling_rate`. `preprocessing_stages` turns those into datarax stages, so a fine-tune feeds
the network what it was trained on: `DecodeImage(size=...)`, `ToFloatOperator()` and
`NormalizeOperator(mean=..., std=...)` for an image, `DecodeAudio(sample_rate=..., length=...)`
for audio (`datarax.train.pretrained.crepe.CREPE_CONFIG` states CREPE's frame).

    stages = preprocessing_stages(json.load(open("preprocessor_config.json")))
    pipeline = Pipeline(ImageFolderSource(root="photos/train"), stages, batch_size=64)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from datarax.host.audio import DecodeAudio
from datarax.host.image import DecodeImage
from datarax.operators.dtype import ToFloatOperator
from datarax.operators.image.color import NormalizeOperator


def _image_size(config: Mapping[str, Any]) -> tuple[tuple[int, int], str]:
    """(output size, DecodeImage resize mode) from HF's `size` / `crop_size` conventions."""
    def hw(value: Any) -> tuple[int, int] | None:
        if isinstance(value, int):
            return value, value
        if isinstance(value, Mapping) and "height" in value and "width" in value:
            return int(value["height"]), int(value["width"])
        if isinstance(value, Mapping) and "shortest_edge" in value:
            return int(value["shortest_edge"]), int(value["shortest_edge"])
        return None

    crop = hw(config.get("crop_size")) if config.get("do_center_crop", "crop_size" in config) else None
    if crop is not None:
        return crop, "shorter_side"
    size = hw(config.get("size"))
    if size is None:
        raise ValueError(f"the preprocessing config has image_mean/image_std but no usable size: size="
                         f"{config.get('size')!r}, crop_size={config.get('crop_size')!r}; expected an int or "
                         "{'height': h, 'width': w} or {'shortest_edge': n}")
    shortest = isinstance(config.get("size"), Mapping) and "shortest_edge" in config["size"]
    return size, "shorter_side" if shortest else "fixed"


def preprocessing_stages(config: Mapping[str, Any], *, field: str | None = None,
                         audio_length: int | None = None) -> list[Any]:
    """The datarax stages that reproduce a checkpoint's input preprocessing.

    Args:
        config: the checkpoint's preprocessing configuration as a dict (HF `preprocessor_config.json`
            or `config.json`, or `datarax.train.pretrained.crepe.CREPE_CONFIG`).
        field: the field the stages read (None: "image" or "audio").
        audio_length: samples per audio record (None: the config's `window_size`, else one second).

    Raises:
        ValueError: the config states neither image normalisation nor an audio sampling rate.
    """
    if "image_mean" in config and "image_std" in config:
        name = field or "image"
        size, resize = _image_size(config)
        return [DecodeImage(size=size, resize=resize, field=name), ToFloatOperator(field=name),
                NormalizeOperator(mean=tuple(float(v) for v in config["image_mean"]),
                                  std=tuple(float(v) for v in config["image_std"]), field=name)]
    if "sampling_rate" in config:
        rate = int(config["sampling_rate"])
        length = audio_length or int(config.get("window_size", rate))
        return [DecodeAudio(field=field or "audio", sample_rate=rate, length=length)]
    raise ValueError(f"the preprocessing config states neither image_mean/image_std nor sampling_rate (keys: "
                     f"{sorted(config)[:12]}); build the stages by hand")
