"""Text LM: pre-train a small transformer on packed text, fine-tune it on held-out topics.

    python -m recipes.text_lm [--workdir DIR] [--quick] [--seed N] [--steps N]

The text is the Python documentation's topics shipped in the stdlib (`pydoc_data.topics`; the
figures in docs/recipes.md are for Python 3.11's), one document per paragraph. Three topics in
four are the pre-training corpus; the fourth is held out, split by paragraph into fine-tuning,
validation and test sets. Validation and test are deduplicated against all training text
(pre-training and fine-tuning): a paragraph that occurs verbatim there, or shares any 13-word
window with it, is dropped (the docs repeat boilerplate such as "Changed in version 3.x"); the
test set is also deduplicated against validation. A byte-level BPE tokenizer is trained offline
on the pre-training corpus (`tokenizers`, under a second), and every split is read through
`PackedTextSource`: documents shuffled per epoch, tokenized in blocks, an EOS after each, packed
greedily into rows of `seq_len` tokens with segment ids and positions.

The model is a small decoder-only transformer (Flax NNX) whose causal attention also stays
within a segment, so packed documents never attend to each other. Per seed it is pre-trained on
the pre-training corpus and saved with Orbax (`DIR/seed<k>/pretrained`). Two arms then train on
the held-out topics' fine-tuning set for the same steps: **fine-tuned** starts from the
pre-trained weights, **scratch** from a fresh initialisation. Both evaluate validation perplexity
every `eval_every` steps and keep their best validation step (`CheckpointCallback(keep_best=1)`),
and each arm's learning rate is chosen from the same grid on validation (on the first seed; the
grid's runs are charged to the cost). The test split is evaluated once per arm and seed, at the
best validation step. The table gives per-arm means with 95% t-intervals over the seeds and the
paired per-seed differences.
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
from datarax.checkpoint import run_script
from datarax.sources import PackedTextSource, TextSource
from datarax.train.metrics import Metric
from recipes import common
from recipes.models import count_params

NAME = "text_lm"
DEFAULT = {"pretrain_steps": 600, "finetune_steps": 200, "batch_size": 16, "seq_len": 128, "vocab_size": 1024,
           "width": 128, "layers": 2, "heads": 4, "learning_rate": 3e-3, "rates": (1.25e-4, 5e-4, 2e-3, 8e-3, 3.2e-2),
           "eval_every": 25, "seeds": 3}
QUICK = {"pretrain_steps": 40, "finetune_steps": 20, "batch_size": 8, "seq_len": 32, "vocab_size": 384,
         "width": 32, "layers": 1, "heads": 2, "learning_rate": 3e-3, "rates": (1e-3, 4e-3), "eval_every": 10,
         "seeds": 2}
SPLIT_SEED = 0  # the split is fixed; a seed changes the initialisations and the data order
SHARES = {"valid": 0.2, "test": 0.2}  # of the held-out topics' paragraphs; the rest is for fine-tuning
NGRAM = 13
ARMS = ("fine-tuned", "scratch")
PAD, EOS = 0, 1


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    """The `n`-word windows of `text` (split on whitespace)."""
    words = text.split()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def split_topics(seed: int = SPLIT_SEED) -> tuple[dict[str, list[str]], dict[str, dict[str, int]]]:
    """Paragraphs of the pydoc topics: pre-training (3 topics in 4) and the held-out topics'
    fine-tuning, validation and test sets, deduplicated; and what the deduplication removed."""
    import pydoc_data.topics

    names = sorted(pydoc_data.topics.topics)
    parts: dict[str, list[str]] = {"pretrain": [], "finetune": [], "valid": [], "test": []}
    rng = np.random.default_rng(seed)
    for i, name in enumerate(names):
        paragraphs = [p.strip() for p in pydoc_data.topics.topics[name].split("\n\n") if p.strip()]
        if i % 4:
            parts["pretrain"] += paragraphs
            continue
        for p in paragraphs:
            u = rng.random()
            parts["valid" if u < SHARES["valid"] else "test" if u < SHARES["valid"] + SHARES["test"] else
                  "finetune"].append(p)
    seen = set(parts["pretrain"]) | set(parts["finetune"])
    grams = set().union(*(ngrams(p) for p in parts["pretrain"] + parts["finetune"]))
    removed = {}
    for split in ("valid", "test"):
        kept, verbatim, overlap = [], 0, 0
        for p in parts[split]:
            if p in seen:
                verbatim += 1
            elif ngrams(p) & grams:
                overlap += 1
            else:
                kept.append(p)
        removed[split] = {"before": len(parts[split]), "verbatim": verbatim, "ngram": overlap, "kept": len(kept)}
        parts[split] = kept
        # The test set is also kept apart from validation (selection happens there).
        seen |= set(kept)
        grams |= set().union(*(ngrams(p) for p in kept)) if kept else set()
    return parts, removed


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


class SegmentPerplexity(Metric):
    """Token-weighted perplexity over exactly the tokens `lm_loss` scores (within a segment)."""

    def update(self, batch: dict, aux: dict) -> dict:
        return {"nll": aux["nll_sum"], "tokens": aux["count"]}

    def compute(self, totals) -> dict:
        return {"": math.exp(float(totals["nll"]) / max(float(totals["tokens"]), 1.0))}


METRICS = {"perplexity": SegmentPerplexity()}


def perplexity(metrics: dict) -> float:
    return metrics["perplexity"]


def optimizer(steps: int, rate: float) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(0.0, rate, max(1, steps // 10), steps)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def new_model(cfg: dict, seed: int) -> TransformerLM:
    return TransformerLM(cfg["vocab_size"], cfg["seq_len"], cfg["width"], cfg["layers"], cfg["heads"], seed=seed)


def plot(workdir: Path, curves: dict[str, Path], table: dict[str, dict]) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for (name, run_dir), color in zip(curves.items(), ("#1c7ed6", "#2b8a3e", "#868e96")):
        steps, loss = common.read_curve(run_dir, "eval/perplexity")
        left.plot(steps, loss, color=color, label=name, marker="o", markersize=3)
    left.set(xlabel="step", ylabel="validation perplexity", yscale="log", title="first seed, chosen rates")
    left.legend()
    names = list(table)
    means = [table[n]["mean"] for n in names]
    errors = [table[n]["half"] or 0.0 for n in names]
    right.bar(range(len(names)), means, yerr=errors, color="#5f3dc4", capsize=4)
    right.set_xticks(range(len(names)), names, fontsize=8)
    right.set(ylabel="test perplexity (held-out topics)", yscale="log", title="mean and 95% interval over seeds")
    return common.save_figure(fig, workdir / "text_lm.png")


def fine_tune(workdir: Path, cfg: dict, seed: int, arm: str, rate: float, parts: dict, tokenizer, export: Path,
              valid: Pipeline, test: Pipeline) -> dict:
    """One arm's fine-tuning run at `rate`: best validation step kept, the test split evaluated there once."""
    model = new_model(cfg, seed + 1)
    if arm == "fine-tuned":
        nnx.update(model, ocp.StandardCheckpointer().restore(export, nnx.state(model)))
    train = packed_pipeline(parts["finetune"], tokenizer, cfg, seed=seed, train=True)
    trainer, run = common.train_run(workdir / f"seed{seed}" / f"{arm}-lr{rate:g}", model,
                                    optimizer(cfg["finetune_steps"], rate), train, lm_loss,
                                    steps=cfg["finetune_steps"], eval_pipeline=valid, metrics=METRICS,
                                    label=f"[seed {seed} {arm} lr {rate:g}] ", eval_every=cfg["eval_every"],
                                    keep_best="eval/perplexity", log_every=cfg["finetune_steps"])
    print(f"[seed {seed} {arm} lr {rate:g}] the test split, once, at step {run.best_step}:", flush=True)
    return {"rate": rate, "valid": perplexity(run.eval_metrics), "test": perplexity(trainer.evaluate(test)),
            "best_step": run.best_step, "steps": cfg["finetune_steps"], "seconds": run.seconds,
            "run_dir": str(workdir / f"seed{seed}" / f"{arm}-lr{rate:g}")}


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv)
    workdir = common.prepare_workdir(args)
    cfg = dict(QUICK if args.quick else DEFAULT)
    if args.steps:
        cfg["pretrain_steps"] = cfg["finetune_steps"] = args.steps
        cfg["eval_every"] = min(cfg["eval_every"], args.steps)
    parts, removed = split_topics()
    tokenizer = train_tokenizer(parts["pretrain"], cfg["vocab_size"], workdir / "tokenizer.json")
    valid = packed_pipeline(parts["valid"], tokenizer, cfg, seed=0, train=False)
    test = packed_pipeline(parts["test"], tokenizer, cfg, seed=0, train=False)
    sizes = {name: {"documents": len(texts), "tokens": sum(len(e.ids) + 1 for e in tokenizer.encode_batch(texts))}
             for name, texts in parts.items()}
    listing = ", ".join(f"{k} {v['documents']} paragraphs / {v['tokens']:,} tokens" for k, v in sizes.items())
    print(f"pydoc topics (Python {sys.version_info.major}.{sys.version_info.minor}): {listing}", flush=True)
    for split, r in removed.items():
        print(f"    {split}: {r['before']} paragraphs drawn, {r['verbatim']} removed as verbatim copies of training "
              f"text, {r['ngram']} for sharing a {NGRAM}-word window with it, {r['kept']} kept", flush=True)
    print(f"transformer with {count_params(new_model(cfg, 0)):,} parameters; seeds "
          f"{list(range(args.seed, args.seed + cfg['seeds']))}", flush=True)

    seeds = list(range(args.seed, args.seed + cfg["seeds"]))
    runs: dict[str, dict[int, dict]] = {arm: {} for arm in ARMS}
    grid: dict[str, list[dict]] = {}
    chosen: dict[str, float] = {}
    pretrained, untrained = {}, None
    for k, seed in enumerate(seeds):
        model = new_model(cfg, seed)
        trainer, pre = common.train_run(workdir / f"seed{seed}" / "pretrain", model,
                                        optimizer(cfg["pretrain_steps"], cfg["learning_rate"]),
                                        packed_pipeline(parts["pretrain"], tokenizer, cfg, seed=seed, train=True),
                                        lm_loss, steps=cfg["pretrain_steps"], eval_pipeline=valid, metrics=METRICS,
                                        label=f"[seed {seed} pretrain] ", eval_before=k == 0)
        if k == 0 and pre.eval_before:
            untrained = perplexity(pre.eval_before)
        print(f"[seed {seed} pretrain] the test split, once:", flush=True)
        pretrained[seed] = {"valid": perplexity(pre.eval_metrics), "test": perplexity(trainer.evaluate(test)),
                            "steps": pre.step, "seconds": pre.seconds, "goodput": pre.goodput}
        export = (workdir / f"seed{seed}" / "pretrained").absolute()
        if not export.exists():
            checkpointer = ocp.StandardCheckpointer()
            checkpointer.save(export, nnx.state(model))
            checkpointer.wait_until_finished()
        for arm in ARMS:
            if k == 0:  # the learning rate is chosen on validation, on the first seed, from the same grid
                grid[arm] = [fine_tune(workdir, cfg, seed, arm, rate, parts, tokenizer, export, valid, test)
                             for rate in cfg["rates"]]
                best = min(grid[arm], key=lambda r: r["valid"])
                chosen[arm] = best["rate"]
                runs[arm][seed] = best
            else:
                runs[arm][seed] = fine_tune(workdir, cfg, seed, arm, chosen[arm], parts, tokenizer, export, valid,
                                            test)

    tests = {"pre-trained only": [pretrained[s]["test"] for s in seeds],
             **{arm: [runs[arm][s]["test"] for s in seeds] for arm in ARMS}}
    table = {name: common.interval(values) for name, values in tests.items()}
    difference = common.paired(tests["fine-tuned"], tests["scratch"])
    ratio = common.interval([f / c for f, c in zip(tests["fine-tuned"], tests["scratch"])])
    grid_steps = {arm: sum(r["steps"] for r in grid[arm]) + (len(seeds) - 1) * cfg["finetune_steps"] for arm in ARMS}
    cost = {"fine-tuned": grid_steps["fine-tuned"] + len(seeds) * cfg["pretrain_steps"],
            "scratch": grid_steps["scratch"]}
    metrics = {f"test_perplexity_{name.replace(' ', '_').replace('-', '_')}_mean": t["mean"]
               for name, t in table.items()}
    metrics |= {"finetuned_minus_scratch_test_perplexity": difference["mean"],
                "finetuned_over_scratch_test_perplexity": ratio["mean"], "uniform_perplexity": float(cfg["vocab_size"])}
    if untrained is not None:
        metrics["valid_perplexity_untrained"] = untrained
    curves = {"pre-training": workdir / f"seed{seeds[0]}" / "pretrain",
              **{arm: Path(runs[arm][seeds[0]]["run_dir"]) for arm in ARMS}}
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, "seeds": seeds, "params": count_params(new_model(cfg, 0))}, "data": sizes,
        "deduplication": removed, "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "chosen_rates": chosen, "grid": grid,
        "runs": {arm: {str(s): r for s, r in v.items()} for arm, v in runs.items()},
        "pretrained": {str(s): r for s, r in pretrained.items()}, "table": table, "paired": difference,
        "ratio": ratio, "cost_steps": cost, "tokenizer": str(workdir / "tokenizer.json"),
        "plot": plot(workdir, curves, table)}, args)

    print(f"\nlearning rate chosen on validation (seed {seeds[0]}; grid {list(cfg['rates'])}):")
    for arm in ARMS:
        listing = ", ".join(f"{r['rate']:g}: {r['valid']:.2f} (step {r['best_step']})" for r in grid[arm])
        print(f"    {arm:>10}: {chosen[arm]:g}   validation perplexity at the best step: {listing}")
    print(f"\ntest perplexity on the held-out topics, at each run's best validation step ({len(seeds)} seeds):")
    header = " ".join(f"{'seed ' + str(s):>9}" for s in seeds)
    print(f"    {'':>17} {header}   mean +- 95% interval   cost (steps)")
    for name, values in tests.items():
        cost_text = {"pre-trained only": f"{len(seeds) * cfg['pretrain_steps']:,}", **{a: f"{cost[a]:,}" for a in ARMS}}
        print(f"    {name:>17} " + " ".join(f"{v:9.2f}" for v in values)
              + f"   {common.describe_interval(table[name]):>20}   {cost_text[name]:>12}")
    if untrained is not None:
        print(f"    {'untrained':>17} validation {untrained:.2f} (seed {seeds[0]})")
    print(f"\nfine-tuned - scratch: {common.describe_interval(difference)} perplexity "
          f"({difference['negative']} of {len(seeds)} seeds lower); fine-tuned / scratch: "
          f"{common.describe_interval(ratio, 3)}")
    print(common.describe_goodput(pretrained[seeds[0]]["goodput"]))
    print(f"result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
