"""HF fine-tuning: pretrain on one task from a local HuggingFace dataset, save with Orbax, fine-tune on another.

    python -m recipes.hf_finetune [--workdir DIR] [--quick] [--seed N] [--steps N]

The recipe writes scikit-learn's digits as local Parquet files (nothing is downloaded;
`HF_DATASETS_OFFLINE=1`) and reads them with `datasets` through datarax's `HFSource`. For each
task pair a CNN is pretrained on plenty of labels, its state saved with Orbax
(`StandardCheckpointer`, `DIR/pretrained-<pair>`), then fine-tuned on a few labels of another
task: the fine-tuned model starts from the pretrained convolutions and hidden layer with a fresh
head, the scratch model from a fresh initialisation; both train for the same number of steps on
the same batches, over several seeds (each a different labelled subset).

* parity: pretrain on the ten digit classes (one half of the images), fine-tune odd vs even
  (the other half; the test set is every image of that half not used for training);
* new_classes (default configuration only): pretrain on digits 0-4, fine-tune on digits 5-9.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from datarax import Pipeline
from datarax.operators import ElementOperator, ElementOperatorConfig
from recipes import common
from recipes.data import load_digits, per_class_split
from recipes.models import CLASSIFICATION_METRICS, ConvNet, as_float_image, classification_loss, host_init

NAME = "hf_finetune"
DEFAULT = {"pretrain_steps": 600, "finetune_steps": 300, "seeds": 3, "batch_size": 20, "pretrain_batch_size": 64,
           "learning_rate": 2e-3, "backbone_lr_factor": 0.1, "pairs": ("parity", "new_classes")}
QUICK = {"pretrain_steps": 80, "finetune_steps": 40, "seeds": 1, "batch_size": 20, "pretrain_batch_size": 64,
         "learning_rate": 3e-3, "backbone_lr_factor": 0.1, "pairs": ("parity",)}
CHANCE = {"parity": 0.5, "new_classes": 0.2}
# Labelled fine-tuning images per class: parity needs every digit among its examples to be learnable.
PER_CLASS = {"parity": 20, "new_classes": 5}


def write_parquet(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """One Parquet file with an `image` column of 8x8 uint8 lists and an int32 `label` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.exists():
        return path
    rows = pa.FixedSizeListArray.from_arrays(pa.array(images.reshape(-1), pa.uint8()), 8)
    table = pa.table({"image": pa.FixedSizeListArray.from_arrays(rows, 8), "label": pa.array(labels, pa.int32())})
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def task_split(pair: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(images, pretrain labels, mask of pretraining images, fine-tuning labels) of a task pair."""
    images, digits = load_digits()
    if pair == "parity":
        half_a, _ = per_class_split(digits, 90, seed=0)
        pretraining = np.zeros(len(digits), bool)
        pretraining[half_a] = True
        return images[..., 0], digits, pretraining, digits % 2
    return images[..., 0], digits, digits < 5, digits - 5


def write_datasets(folder: Path, pair: str, seed: int, per_class: int) -> dict[str, Path]:
    """Parquet files of a pair: pretrain train/test (30 per class held out), fine-tune train/test for `seed`."""
    folder.mkdir(parents=True, exist_ok=True)
    images, pre_labels, pretraining, ft_labels = task_split(pair)
    pre_images, pre_labels = images[pretraining], pre_labels[pretraining]
    ft_images, ft_labels = images[~pretraining], ft_labels[~pretraining]
    pre_test, pre_train = per_class_split(pre_labels, 20, seed=0)
    ft_train, ft_test = per_class_split(ft_labels, per_class, seed=seed)
    parts = {"pretrain_train": (pre_images[pre_train], pre_labels[pre_train]),
             "pretrain_test": (pre_images[pre_test], pre_labels[pre_test]),
             "finetune_train": (ft_images[ft_train], ft_labels[ft_train]),
             "finetune_test": (ft_images[ft_test], ft_labels[ft_test])}
    suffix = {"finetune_train": f"-seed{seed}", "finetune_test": f"-seed{seed}"}
    return {name: write_parquet(folder / f"{pair}-{name}{suffix.get(name, '')}.parquet", *arrays)
            for name, arrays in parts.items()}


def to_float(element):
    return element.update_data({"image": as_float_image(element.data["image"], 16.0)[..., None]})


def hf_pipeline(path: Path, cache: Path, batch_size: int, *, seed: int, train: bool) -> Pipeline:
    """A pipeline over one Parquet file read by `datasets` and `HFSource`."""
    import datasets

    from datarax.sources.hf import HFSource, HFSourceConfig, load_files

    datasets.disable_progress_bars()  # one bar per small file only clutters the recipe's output
    dataset = load_files([path], cache_dir=str(cache))
    source = HFSource(HFSourceConfig(columns=("image", "label"), shuffle=train, seed=seed), dataset=dataset)
    return Pipeline(source, [ElementOperator(ElementOperatorConfig(), fn=to_float)],
                    batch_size=batch_size, drop_remainder=train)


def optimizer(steps: int, cfg: dict, *, fine_tune: bool = False) -> optax.GradientTransformation:
    """AdamW with warm-up and cosine decay; when fine-tuning, the pretrained layers learn `backbone_lr_factor` slower.

    The smaller step keeps the fresh head's first, large gradients from wrecking the pretrained
    features (discriminative learning rates); the scratch arm trains every layer at the full rate.
    """
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"], max(1, steps // 20), steps)
    if not fine_tune:
        return optax.adamw(schedule, weight_decay=1e-4)
    slow = optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"] * cfg["backbone_lr_factor"],
                                              max(1, steps // 20), steps)

    def labels(params):
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "head" if getattr(path[0], "key", None) == "head" else "backbone", params)

    return optax.multi_transform({"head": optax.adamw(schedule, weight_decay=1e-4),
                                  "backbone": optax.adamw(slow, weight_decay=1e-4)}, labels)


def num_classes(path: Path) -> int:
    import pyarrow.parquet as pq

    return int(pq.read_table(path, columns=["label"]).column("label").to_numpy().max()) + 1


def pretrain(workdir: Path, pair: str, files: dict, cfg: dict, seed: int) -> tuple[Path, int, float]:
    """Trains on the pair's first task (resumable), exports with Orbax; returns (path, classes, test accuracy)."""
    cache = workdir / "hf_cache"
    train = hf_pipeline(files["pretrain_train"], cache, cfg["pretrain_batch_size"], seed=seed, train=True)
    test = hf_pipeline(files["pretrain_test"], cache, 256, seed=seed, train=False)
    classes = num_classes(files["pretrain_train"])
    model = ConvNet(1, classes, seed=seed)
    _, run = common.train_run(workdir / "runs" / f"{pair}-pretrain", model, optimizer(cfg["pretrain_steps"], cfg),
                              train, classification_loss, steps=cfg["pretrain_steps"], eval_pipeline=test,
                              metrics=CLASSIFICATION_METRICS, label=f"[{pair} pretrain] ",
                              log_every=max(1, cfg["pretrain_steps"] // 4))
    export = (workdir / f"pretrained-{pair}").absolute()
    if not export.exists():
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(export, nnx.state(model))
        checkpointer.wait_until_finished()
    print(f"[{pair} pretrain] test accuracy {run.eval_metrics['accuracy']:.4f}; saved with Orbax to {export}",
          flush=True)
    return export, classes, run.eval_metrics["accuracy"]


def load_pretrained(export: Path, pretrain_classes: int, classes: int, seed: int) -> ConvNet:
    """A ConvNet holding the pretrained state (restored with Orbax) and a fresh head for `classes`."""
    model = ConvNet(1, pretrain_classes, seed=seed)
    nnx.update(model, ocp.StandardCheckpointer().restore(export, nnx.state(model)))
    model.head = nnx.Linear(model.head.in_features, classes, rngs=nnx.Rngs(seed), **host_init(seed + 1))
    return model


def finetune(workdir: Path, pair: str, pretrained: tuple[Path, int], files: dict, cfg: dict, seed: int,
             start: str) -> tuple[float, dict]:
    """Trains the pair's second task from the pretrained state or from scratch; returns test accuracy and the run."""
    cache = workdir / "hf_cache"
    train = hf_pipeline(files["finetune_train"], cache, cfg["batch_size"], seed=seed, train=True)
    test = hf_pipeline(files["finetune_test"], cache, 256, seed=seed, train=False)
    classes = num_classes(files["finetune_train"])
    model = (load_pretrained(*pretrained, classes, seed) if start == "pretrained" else ConvNet(1, classes, seed=seed))
    steps = cfg["finetune_steps"]
    label = f"[{pair} {'fine-tune' if start == 'pretrained' else 'scratch'} seed {seed}] "
    tx = optimizer(steps, cfg, fine_tune=start == "pretrained")
    _, run = common.train_run(workdir / "runs" / f"{pair}-{start}-seed{seed}", model, tx, train,
                              classification_loss, steps=steps, eval_pipeline=test, metrics=CLASSIFICATION_METRICS,
                              label=label, log_every=max(1, steps // 2))
    print(f"{label}test accuracy {run.eval_metrics['accuracy']:.4f}", flush=True)
    return run.eval_metrics["accuracy"], run.as_dict()


def run_pair(workdir: Path, pair: str, cfg: dict, seeds: list[int]) -> dict:
    files = write_datasets(workdir / "data", pair, seeds[0], PER_CLASS[pair])
    export, pretrain_classes, pre_accuracy = pretrain(workdir, pair, files, cfg, seeds[0])
    runs, accuracy = [], {"pretrained": [], "scratch": []}
    for seed in seeds:
        files = write_datasets(workdir / "data", pair, seed, PER_CLASS[pair])
        for start in ("pretrained", "scratch"):
            acc, record = finetune(workdir, pair, (export, pretrain_classes), files, cfg, seed, start)
            accuracy[start].append(acc)
            runs.append({"start": start, "seed": seed, "test_accuracy": acc, "run": record})
    return {"pretrain_test_accuracy": pre_accuracy, "export": str(export), "runs": runs,
            "accuracy": {k: common.mean_std(v) for k, v in accuracy.items()}}


def plot(workdir: Path, results: dict, seeds: list[int]) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (pair, result) in zip(axes[0], results.items()):
        for start, color in (("pretrained", "#2b8a3e"), ("scratch", "#868e96")):
            for i, seed in enumerate(seeds):
                steps, acc = common.read_curve(workdir / "runs" / f"{pair}-{start}-seed{seed}", "train/loss")
                ax.plot(steps, acc, color=color, alpha=0.8, label=f"{start} (train loss)" if i == 0 else None)
        stats = result["accuracy"]
        ax.set(xlabel="fine-tuning step", ylabel="train loss", yscale="log",
               title=f"{pair}: test accuracy fine-tuned {stats['pretrained']['mean']:.3f} vs scratch "
                     f"{stats['scratch']['mean']:.3f}")
        ax.legend()
    return common.save_figure(fig, workdir / "hf_finetune.png")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv)
    workdir = common.prepare_workdir(args)
    cfg = dict(QUICK if args.quick else DEFAULT)
    if args.steps:
        cfg["pretrain_steps"] = cfg["finetune_steps"] = args.steps
    seeds = [args.seed + i for i in range(cfg["seeds"])]
    results = {pair: run_pair(workdir, pair, cfg, seeds) for pair in cfg["pairs"]}
    metrics = {}
    for pair, result in results.items():
        stats = result["accuracy"]
        metrics.update({f"{pair}_pretrain_test_accuracy": result["pretrain_test_accuracy"],
                        f"{pair}_finetuned_accuracy_mean": stats["pretrained"]["mean"],
                        f"{pair}_finetuned_accuracy_std": stats["pretrained"]["std"],
                        f"{pair}_scratch_accuracy_mean": stats["scratch"]["mean"],
                        f"{pair}_scratch_accuracy_std": stats["scratch"]["std"],
                        f"{pair}_finetune_minus_scratch": stats["pretrained"]["mean"] - stats["scratch"]["mean"],
                        f"{pair}_chance_accuracy": CHANCE[pair]})
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, "seeds": seeds, "labels_per_class": PER_CLASS}, "pairs": results, "plot": plot(workdir, results, seeds),
        "data_files": sorted(str(p) for p in (workdir / "data").glob("*.parquet"))}, args)
    print()
    for pair, result in results.items():
        stats = result["accuracy"]
        print(f"{pair}: pretraining test accuracy {result['pretrain_test_accuracy']:.4f}; fine-tuning on "
              f"{PER_CLASS[pair]} labels per class for {cfg['finetune_steps']} steps:")
        for start, name in (("pretrained", "fine-tuned"), ("scratch", "from scratch")):
            s = stats[start]
            print(f"    {name:>12}: test accuracy {s['mean']:.4f} +- {s['std']:.4f} over {s['n']} seeds")
        gain = stats["pretrained"]["mean"] - stats["scratch"]["mean"]
        print(f"    fine-tuning {'beats' if gain > 0 else 'does not beat'} training from scratch by {gain:+.4f}")
    print(f"result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
