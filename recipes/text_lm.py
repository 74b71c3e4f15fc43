"""Text LM: pre-train a small transformer on packed text, fine-tune it on held-out topics.

    python -m recipes.text_lm [--workdir DIR] [--quick] [--seed N] [--steps N]

The text is the Python documentation's topics shipped in the stdlib (`pydoc_data.topics`),
one document per paragraph. Three topics in four are the pre-training corpus; the fourth is
held out, split by paragraph into a fine-tuning and a validation set. A byte-level BPE tokenizer
is trained offline on the pre-training corpus (`tokenizers`, under a second), and every split is
read through `PackedTextSource`: documents shuffled per epoch, tokenized in blocks, an EOS after
each, packed greedily into rows of `seq_len` tokens with segment ids and positions.

The model is a small decoder-only transformer (Flax NNX) whose causal attention also stays
within a segment, so packed documents never attend to each other. It is pre-trained on the
pre-training corpus, saved with Orbax (`DIR/pretrained`), then fine-tuned on the held-out topics'
fine-tuning set; a model of the same shape is trained from scratch on that set for the same
steps. Validation perplexity on the held-out topics is reported for the untrained model, after
pre-training, and after fine-tuning from the pre-trained and from the scratch start.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from datarax import Pipeline
from datarax.sources import PackedTextSource, TextSource
from datarax.train.locking import run_script
from recipes import common
from recipes.models import count_params

NAME = "text_lm"
DEFAULT = {"pretrain_steps": 600, "finetune_steps": 200, "batch_size": 16, "seq_len": 128, "vocab_size": 1024,
           "width": 128, "layers": 2, "heads": 4, "learning_rate": 3e-3, "finetune_learning_rate": 1e-3}
QUICK = {"pretrain_steps": 40, "finetune_steps": 20, "batch_size": 8, "seq_len": 64, "vocab_size": 384,
         "width": 64, "layers": 1, "heads": 2, "learning_rate": 3e-3, "finetune_learning_rate": 1e-3}
PAD, EOS = 0, 1


def split_topics(seed: int = 0) -> dict[str, list[str]]:
    """Paragraphs of the pydoc topics: pre-training (3 topics in 4), held-out fine-tuning and validation."""
    import pydoc_data.topics

    names = sorted(pydoc_data.topics.topics)
    parts: dict[str, list[str]] = {"pretrain": [], "finetune": [], "valid": []}
    held_out_rng = np.random.default_rng(seed)
    for i, name in enumerate(names):
        paragraphs = [p.strip() for p in pydoc_data.topics.topics[name].split("\n\n") if p.strip()]
        if i % 4:
            parts["pretrain"] += paragraphs
            continue
        for p in paragraphs:
            parts["valid" if held_out_rng.random() < 0.25 else "finetune"].append(p)
    return parts


def train_tokenizer(texts: list[str], vocab_size: int, path: Path):
    """A byte-level BPE (`[PAD]` = 0, `[EOS]` = 1) trained on `texts`, saved to `path` (reused when present)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if path.exists():
        return Tokenizer.from_file(str(path))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[PAD]", "[EOS]"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))
    return tokenizer


def packed_pipeline(texts: list[str], tokenizer, cfg: dict, *, seed: int, train: bool) -> Pipeline:
    source = PackedTextSource(source=TextSource(documents=texts), tokenizer=tokenizer, seq_len=cfg["seq_len"],
                              eos_id=EOS, pad_id=PAD, shuffle=train, seed=seed)
    return Pipeline(source, [], batch_size=cfg["batch_size"] if train else 32, drop_remainder=train)


class Block(nnx.Module):
    """Pre-norm transformer block: masked self-attention and an MLP."""

    def __init__(self, width: int, heads: int, *, rngs: nnx.Rngs):
        self.heads = heads
        self.norm1, self.norm2 = nnx.LayerNorm(width, rngs=rngs), nnx.LayerNorm(width, rngs=rngs)
        self.qkv = nnx.Linear(width, 3 * width, rngs=rngs)
        self.out = nnx.Linear(width, width, rngs=rngs)
        self.up, self.down = nnx.Linear(width, 4 * width, rngs=rngs), nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        b, t, w = x.shape
        q, k, v = jnp.split(self.qkv(self.norm1(x)).reshape(b, t, 3 * self.heads, w // self.heads), 3, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(w // self.heads)
        weights = jax.nn.softmax(jnp.where(mask[:, None], scores, -1e9), axis=-1)
        x = x + self.out(jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, w))
        return x + self.down(nnx.gelu(self.up(self.norm2(x))))


class TransformerLM(nnx.Module):
    """A decoder-only LM over packed rows: token + position embeddings, blocks, a tied output layer."""

    def __init__(self, vocab: int, seq_len: int, width: int, layers: int, heads: int, *, seed: int):
        rngs = nnx.Rngs(seed)
        self.embed = nnx.Embed(vocab, width, rngs=rngs)
        self.position = nnx.Embed(seq_len, width, rngs=rngs)
        self.blocks = nnx.List([Block(width, heads, rngs=rngs) for _ in range(layers)])
        self.norm = nnx.LayerNorm(width, rngs=rngs)

    def __call__(self, tokens: jax.Array, segment_ids: jax.Array, positions: jax.Array) -> jax.Array:
        t = tokens.shape[1]
        causal = jnp.tril(jnp.ones((t, t), bool))
        # Packed documents must not see each other: a query attends to earlier keys of its own segment.
        mask = causal[None] & (segment_ids[:, :, None] == segment_ids[:, None, :])
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x, mask)
        return self.embed.attend(self.norm(x))


def lm_loss(model: TransformerLM, batch: dict) -> tuple[jax.Array, dict]:
    """Next-token cross-entropy within each segment, on real tokens only."""
    tokens, segments = batch["tokens"], batch["segment_ids"]
    logits = model(tokens, segments, batch["positions"])[:, :-1]
    targets = tokens[:, 1:]
    weight = ((segments[:, 1:] == segments[:, :-1]) & batch["loss_mask"][:, 1:] & (segments[:, 1:] > 0))
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    total = (nll * weight).sum()
    count = weight.sum()
    return total / jnp.maximum(count, 1), {"nll_sum": total, "count": count}


# Evaluation averages metrics over batches weighted by rows, so per-row sums give token-weighted means.
METRICS = {"nll_per_row": lambda batch, aux: aux["nll_sum"] / batch["tokens"].shape[0],
           "tokens_per_row": lambda batch, aux: aux["count"] / batch["tokens"].shape[0]}


def perplexity(metrics: dict) -> float:
    return math.exp(metrics["nll_per_row"] / metrics["tokens_per_row"])


def optimizer(steps: int, rate: float) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(0.0, rate, max(1, steps // 10), steps)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def new_model(cfg: dict, seed: int) -> TransformerLM:
    return TransformerLM(cfg["vocab_size"], cfg["seq_len"], cfg["width"], cfg["layers"], cfg["heads"], seed=seed)


def plot(workdir: Path, perplexities: dict) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for run, color in (("pretrain", "#1c7ed6"), ("finetune-pretrained", "#2b8a3e"), ("finetune-scratch", "#868e96")):
        steps, loss = common.read_curve(workdir / "runs" / run, "train/loss")
        left.plot(steps, loss, color=color, label=run)
    left.set(xlabel="step", ylabel="train loss (nats/token)", title="training loss")
    left.legend()
    names = list(perplexities)
    right.bar(range(len(names)), [perplexities[n] for n in names], color="#5f3dc4")
    right.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=8)
    right.set(ylabel="validation perplexity (held-out topics)", yscale="log", title="held-out perplexity")
    return common.save_figure(fig, workdir / "text_lm.png")


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv)
    workdir = common.prepare_workdir(args)
    cfg = dict(QUICK if args.quick else DEFAULT)
    if args.steps:
        cfg["pretrain_steps"] = cfg["finetune_steps"] = args.steps
    parts = split_topics()
    tokenizer = train_tokenizer(parts["pretrain"], cfg["vocab_size"], workdir / "tokenizer.json")
    valid = packed_pipeline(parts["valid"], tokenizer, cfg, seed=args.seed, train=False)
    sizes = {name: {"documents": len(texts), "tokens": sum(len(e.ids) + 1 for e in tokenizer.encode_batch(texts))}
             for name, texts in parts.items()}
    model = new_model(cfg, args.seed)
    listing = ", ".join(f"{k} {v['documents']} paragraphs / {v['tokens']:,} tokens" for k, v in sizes.items())
    print(f"pydoc topics: {listing}; transformer with {count_params(model):,} parameters", flush=True)

    pretrain = packed_pipeline(parts["pretrain"], tokenizer, cfg, seed=args.seed, train=True)
    trainer, pre = common.train_run(workdir / "runs" / "pretrain", model, optimizer(cfg["pretrain_steps"], cfg["learning_rate"]),
                              pretrain, lm_loss, steps=cfg["pretrain_steps"], eval_pipeline=valid, metrics=METRICS,
                              label="[pretrain] ", eval_before=True)
    # The packed reader tokenizes on a background thread: stop it rather than leave it working at exit.
    trainer.iterator.close()
    export = (workdir / "pretrained").absolute()
    if not export.exists():
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(export, nnx.state(model))
        checkpointer.wait_until_finished()

    runs = {"pretrain": pre.as_dict()}
    after = {}
    for start in ("pretrained", "scratch"):
        tuned = new_model(cfg, args.seed + 1)
        if start == "pretrained":
            nnx.update(tuned, ocp.StandardCheckpointer().restore(export, nnx.state(tuned)))
        train = packed_pipeline(parts["finetune"], tokenizer, cfg, seed=args.seed, train=True)
        rate = cfg["finetune_learning_rate"] if start == "pretrained" else cfg["learning_rate"]
        trainer, run = common.train_run(workdir / "runs" / f"finetune-{start}", tuned, optimizer(cfg["finetune_steps"], rate),
                                  train, lm_loss, steps=cfg["finetune_steps"], eval_pipeline=valid, metrics=METRICS,
                                  label=f"[fine-tune {start}] ")
        trainer.iterator.close()
        runs[f"finetune-{start}"] = run.as_dict()
        after[start] = perplexity(run.eval_metrics)

    before = perplexity(pre.eval_before) if pre.eval_before else None
    perplexities = {"untrained": before, "pretrained": perplexity(pre.eval_metrics),
                    "finetuned_from_pretrained": after["pretrained"], "finetuned_from_scratch": after["scratch"]}
    if before is None:  # a resumed, finished run does not evaluate the untrained model again
        perplexities.pop("untrained")
    metrics = {f"valid_perplexity_{k}": v for k, v in perplexities.items()}
    metrics["pretrained_minus_scratch_perplexity"] = after["pretrained"] - after["scratch"]
    metrics["uniform_perplexity"] = float(cfg["vocab_size"])
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, "seed": args.seed, "params": count_params(model)}, "data": sizes, "runs": runs,
        "export": str(export), "tokenizer": str(workdir / "tokenizer.json"), "plot": plot(workdir, perplexities)},
        args)
    print("\nvalidation perplexity on the held-out topics:")
    for name, value in perplexities.items():
        print(f"    {name.replace('_', ' '):>28}: {value:10.2f}")
    print(common.describe_goodput(runs["pretrain"]["goodput"]))
    print(f"result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
