"""`text`: tokenize about 2.8 MB of text (15,600 documents) and pack it into 512-token rows, batch 32.

The documents are the paragraphs of the stdlib's pydoc topics, repeated six times; the tokenizer is
a byte-level BPE (4,096 tokens) trained on the same topics beforehand (not timed). Each epoch
visits the documents in a fresh shuffled order, appends an EOS token to each and packs them
greedily (a document that does not fit continues on the next row), giving `tokens`,
`segment_ids`, `positions` and `loss_mask` per row; every batch ends as `jax.Array`s on the
default device. Rates are documents per second.

* datarax: `Pipeline(PackedTextSource(source=TextSource(documents=docs), tokenizer=tokenizer, seq_len=512))`, no device
  stages: tokenized in blocks of 512 documents with `encode_batch_fast` on the reader thread.
* datasets (the baseline): `Dataset.from_dict({"text": docs}).shuffle(seed=epoch)
  .map(tokenize, batched=True)` with `encode_batch`, then a numpy greedy packer (concatenate,
  split into rows, segment ids and positions computed with numpy) and the same batches.
* grain (reported beside it when installed): `MapDataset.source(docs).shuffle(seed).map(encode)`
  then grain's own `ConcatThenSplitIterDataset` packer and `.batch(32)`.
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np

from benchmarks.registry import BenchOptions
from benchmarks.timing import block, epoch_rate, first_batch_seconds, row
from datarax import Pipeline
from datarax.sources import PackedTextSource, TextSource

COPIES = 6
SEQ_LEN = 512
BATCH = 32
EOS = 1


def topics() -> list[str]:
    import pydoc_data.topics

    return list(pydoc_data.topics.topics.values())


def make_documents(n: int) -> list[str]:
    """`n` documents: the topics' paragraphs, repeated in order."""
    paragraphs = [p for topic in topics() for p in topic.split("\n\n") if p.strip()]
    return [paragraphs[i % len(paragraphs)] for i in range(n)]


def train_tokenizer(vocab_size: int = 4096):
    """A byte-level BPE trained on the pydoc topics: `[PAD]` is 0, `[EOS]` is 1."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[PAD]", "[EOS]"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(topics(), trainer)
    return tokenizer


def pack_numpy(ids: list[list[int]], seq_len: int, eos: int) -> dict[str, np.ndarray]:
    """Greedy concat-and-split packing of token lists, with numpy: the baseline's packer."""
    lengths = np.fromiter((len(x) + 1 for x in ids), np.int64, count=len(ids))
    flat = np.fromiter((t for x in ids for t in (*x, eos)), np.int32, count=int(lengths.sum()))
    rows = -(-len(flat) // seq_len)
    size = rows * seq_len
    doc = np.repeat(np.arange(len(ids)), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    index = np.arange(len(flat))
    row_start = index - index % seq_len
    tokens = np.zeros(size, np.int32)
    segments = np.zeros(size, np.int32)
    positions = np.zeros(size, np.int32)
    tokens[:len(flat)] = flat
    # Segments count document changes since the row's start; a continued document restarts at 0.
    change = np.concatenate([[0], (doc[1:] != doc[:-1]).astype(np.int32)])
    change[row_start == index] = 0
    segments[:len(flat)] = (np.cumsum(change) - np.cumsum(change)[row_start]) + 1
    positions[:len(flat)] = index - np.maximum(starts, row_start)
    shape = (rows, seq_len)
    return {"tokens": tokens.reshape(shape), "segment_ids": segments.reshape(shape),
            "positions": positions.reshape(shape), "loss_mask": (segments > 0).reshape(shape)}


def batches_of(rows: dict[str, np.ndarray]):
    total = len(rows["tokens"])
    for start in range(0, total, BATCH):
        yield jax.block_until_ready(jax.device_put({k: v[start:start + BATCH] for k, v in rows.items()}))


def datasets_epochs(docs: list[str], tokenizer):
    import datasets

    datasets.disable_progress_bars()
    dataset = datasets.Dataset.from_dict({"text": docs})

    def tokenize(batch):
        return {"input_ids": [e.ids for e in tokenizer.encode_batch(batch["text"], add_special_tokens=False)]}

    counter = iter(range(10**6))

    def run_epoch():
        shuffled = dataset.shuffle(seed=next(counter))
        ids = shuffled.map(tokenize, batched=True, remove_columns=["text"])["input_ids"]
        return batches_of(pack_numpy(ids, SEQ_LEN, EOS))

    return run_epoch


def grain_epochs(docs: list[str], tokenizer):
    import grain

    counter = iter(range(10**6))

    def encode(text):
        return {"tokens": np.array(tokenizer.encode(text, add_special_tokens=False).ids + [EOS], np.int32)}

    def run_epoch():
        dataset = (grain.MapDataset.source(docs).shuffle(seed=next(counter)).map(encode).to_iter_dataset())
        packed = grain.experimental.ConcatThenSplitIterDataset(dataset, length_struct={"tokens": SEQ_LEN})
        return (jax.block_until_ready(jax.device_put(b)) for b in packed.batch(BATCH))

    return run_epoch


def run(options: BenchOptions) -> list[dict]:
    n = options.records(COPIES * 2608)
    docs = make_documents(n)
    tokenizer = train_tokenizer()
    start = time.perf_counter()
    source = PackedTextSource(source=TextSource(documents=docs), tokenizer=tokenizer, seq_len=SEQ_LEN, eos_id=EOS,
                              seed=0, shuffle=True)
    pipeline = Pipeline(source, [], batch_size=BATCH)
    first = time.perf_counter() - start + first_batch_seconds(lambda: pipeline)
    for _ in pipeline:  # the rest of the warm-up epoch
        pass
    hf_epoch = datasets_epochs(docs, tokenizer)
    block(list(hf_epoch()))
    runs: dict[str, list[float]] = {"datarax": [], "datasets": []}
    sides = {"datarax": lambda: pipeline, "datasets": hf_epoch}
    try:
        sides["grain"] = grain_epochs(docs, tokenizer)
        block(list(sides["grain"]()))
        runs["grain"] = []
    except ImportError:
        pass
    for _ in range(options.repeats):  # sides alternate, so a slow spell of a shared machine hits all of them
        for name, run_epoch in sides.items():
            runs[name].append(epoch_rate(run_epoch, n, 1)["el_s"])
    rates = {name: {"el_s": statistics.median(r), "el_s_runs": [round(x, 1) for x in r]} for name, r in runs.items()}
    extra = {}
    if "grain" in rates:
        extra = {"grain_el_s": round(rates["grain"]["el_s"], 1),
                 "grain_ratio": round(rates["datarax"]["el_s"] / rates["grain"]["el_s"], 3)}
    text_mb = sum(len(d.encode()) for d in docs) / 1e6
    return [row("text", rates["datarax"], rates["datasets"], records=n, batch_size=BATCH, seq_len=SEQ_LEN,
                text_mb=round(text_mb, 2), peer="datasets .map(batched) + numpy packer",
                first_batch_s=round(first, 3), **extra)]
