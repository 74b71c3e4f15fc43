"""Writes the small, offline data sets the example configurations train on (`data/` beside this file).

    python examples/configs/make_data.py            # then: datarax train examples/configs/image.toml

* `digits-train.parquet`, `digits-test.parquet`: scikit-learn's 1,797 handwritten digits as
  32x32 JPEGs in an HF `Image` column (`{bytes, path}`), with an int64 `label`;
* `tones.parquet`: 256 WAV clips (stdlib `wave`, 8 kHz, 16-bit mono, 0.5 s) of four tones with
  random phase, loudness and noise, in an HF `Audio` column, with the tone's `label`;
* `topics.txt`: the help topics of Python's `pydoc_data` (one document per line) and
  `tokenizer.json`, a 512-token BPE trained on them with `tokenizers`.

HF `datasets` needs `torchcodec` to *encode* audio itself; none is needed here: a parquet whose
column is the struct `{bytes: binary, path: string}` and whose schema metadata declares the HF
feature (`datasets.Features(...).arrow_schema` carries it) is what `datasets` writes.
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


def write_hf_parquet(path: str, column: str, kind: str, files: list[tuple[str, bytes]], labels: np.ndarray) -> None:
    """A parquet of `column` (an HF `Image` or `Audio` feature holding each file's bytes) and `label`."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    feature = datasets.Image() if kind == "image" else datasets.Audio()
    schema = datasets.Features({column: feature, "label": datasets.Value("int64")}).arrow_schema
    encoded = pa.array([{"bytes": data, "path": name} for name, data in files], type=schema.field(column).type)
    pq.write_table(pa.table({column: encoded, "label": pa.array(labels, pa.int64())}, schema=schema), path)


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
    write_hf_parquet(os.path.join(folder, "digits-train.parquet"), "image", "image", files[:split], labels[:split])
    write_hf_parquet(os.path.join(folder, "digits-test.parquet"), "image", "image", files[split:], labels[split:])


def wav_bytes(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def tones(folder: str, count: int = 256) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(SAMPLE_RATE // 2) / SAMPLE_RATE
    labels = np.arange(count, dtype=np.int64) % len(TONES_HZ)
    files = []
    for i, label in enumerate(labels):
        wave_ = rng.uniform(0.2, 0.8) * np.sin(2 * np.pi * TONES_HZ[label] * t + rng.uniform(0, 2 * np.pi))
        files.append((f"tone-{i:03d}.wav", wav_bytes(wave_ + 0.02 * rng.standard_normal(t.size))))
    write_hf_parquet(os.path.join(folder, "tones.parquet"), "audio", "audio", files, labels)


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
