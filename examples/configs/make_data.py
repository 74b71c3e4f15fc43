"""Writes the small, offline data sets the example configurations train on (`data/` beside this file).

    python examples/configs/make_data.py            # then: datarax train examples/configs/image.toml

* `digits-train.parquet`, `digits-test.parquet`: scikit-learn's 1,797 handwritten digits as
  32x32 JPEGs in an HF `Image` column (`{bytes, path}`), with an int64 `label`; and the training
  split again as 4 shards with row groups of 64 (`digits-train-shards/`, for `image_sharded.toml`);
* `tones.parquet`: 256 WAV clips (stdlib `wave`, 8 kHz, 16-bit mono, 0.5 s) of four tones with
  random phase, loudness and noise, in an HF `Audio` column, with the tone's `label`;
* `topics.txt`: the help topics of Python's `pydoc_data` (one document per line) and
  `tokenizer.json`, a 512-token BPE trained on them with `tokenizers`.

The parquet files are written with `datarax.sources.write_hf_parquet`, which needs no `torchcodec`
(HF `datasets` needs it to encode audio itself).
"""

from __future__ import annotations

import argparse
import io
import os
import wave

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TONES_HZ = (220.0, 330.0, 495.0, 742.5)
SAMPLE_RATE = 8000


def write_parquet(path: str, column: str, files: list[tuple[str, bytes]], labels: np.ndarray) -> None:
    """A parquet of `column` (an HF `Image` or `Audio` feature holding each file's bytes) and `label`."""
    from datarax.sources import write_hf_parquet

    kind = {"images": (column,)} if column == "image" else {"audio": (column,)}
    write_hf_parquet(path, {column: [data for _, data in files], "label": labels.astype(np.int64)}, **kind)


def digits(folder: str) -> None:
    from PIL import Image
    from sklearn.datasets import load_digits

    loaded = load_digits()
    images = (loaded.images / 16.0 * 255.0).round().astype(np.uint8)
    files = []
    for i, image in enumerate(images):
        buffer = io.BytesIO()
        Image.fromarray(image, "L").resize((32, 32), Image.BILINEAR).save(buffer, format="JPEG", quality=95)
        files.append((f"digit-{i:04d}.jpg", buffer.getvalue()))
    labels = loaded.target.astype(np.int64)
    split = 1500
    write_parquet(os.path.join(folder, "digits-train.parquet"), "image", files[:split], labels[:split])
    write_parquet(os.path.join(folder, "digits-test.parquet"), "image", files[split:], labels[split:])
    # The training split again as a shard set for ShardedSource (image_sharded.toml): 4 shards,
    # row groups (the blocks it reads and shuffles) of 64 digits.
    from datarax.sources import write_hf_parquet

    os.makedirs(os.path.join(folder, "digits-train-shards"), exist_ok=True)
    for shard, rows in enumerate(np.array_split(np.arange(split), 4)):
        write_hf_parquet(os.path.join(folder, "digits-train-shards", f"part-{shard}.parquet"),
                         {"image": [files[i][1] for i in rows], "label": labels[rows]}, images=("image",),
                         row_group_size=64)


def wav_bytes(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def tone_files(count: int, seed: int = 0) -> tuple[list[tuple[str, bytes]], np.ndarray]:
    """`count` WAV clips of the four tones (random phase, loudness and noise) and their labels."""
    rng = np.random.default_rng(seed)
    t = np.arange(SAMPLE_RATE // 2) / SAMPLE_RATE
    labels = np.arange(count, dtype=np.int64) % len(TONES_HZ)
    files = []
    for i, label in enumerate(labels):
        wave_ = rng.uniform(0.2, 0.8) * np.sin(2 * np.pi * TONES_HZ[label] * t + rng.uniform(0, 2 * np.pi))
        files.append((f"tone-{i:03d}.wav", wav_bytes(wave_ + 0.02 * rng.standard_normal(t.size))))
    return files, labels


def tones(folder: str, count: int = 256) -> None:
    files, labels = tone_files(count)
    write_parquet(os.path.join(folder, "tones.parquet"), "audio", files, labels)


def text(folder: str, vocab: int = 512) -> None:
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    documents = [" ".join(topics[name].split()) for name in sorted(topics)]
    with open(os.path.join(folder, "topics.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(documents) + "\n")
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(documents, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<eos>",
                                                                                                    "<unk>"]))
    tokenizer.save(os.path.join(folder, "tokenizer.json"))


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "data"), help="the folder to write (default: data/ here)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    digits(args.out)
    tones(args.out)
    text(args.out)
    return args.out


if __name__ == "__main__":
    print(f"wrote {main()}")
