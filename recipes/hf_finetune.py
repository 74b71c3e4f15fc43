"""HF fine-tuning: pretrain on one task from a local HuggingFace dataset, save with Orbax, fine-tune on another.

    python -m recipes.hf_finetune [--workdir DIR] [--quick] [--seed N] [--steps N]

The recipe writes scikit-learn's digits as local Parquet files (nothing is downloaded;
`HF_DATASETS_OFFLINE=1`) and reads them with `datasets` through datarax's `HFSource`:

* pretrain: a CNN learns digits 0-4 from every training image of those classes; its state is
  saved with Orbax (`StandardCheckpointer`) as `DIR/pretrained`;
* fine-tune: digits 5-9 from only a few labelled images per class. The fine-tuned model starts
  from the pretrained convolutions and hidden layer (restored from the Orbax checkpoint) with a
  fresh head; the scratch model starts from a fresh initialisation. Both train for the same
  number of steps on the same batches, over several seeds (each a different labelled subset).

Reported: pretraining accuracy on held-out 0-4 images, and the fine-tuned and scratch accuracy
on every 5-9 image not used for training (mean and spread over seeds).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
DEFAULT = {"pretrain_steps": 600, "finetune_steps": 300, "per_class": 5, "seeds": 3, "batch_size": 25,
           "pretrain_batch_size": 64, "learning_rate": 2e-3}
QUICK = {"pretrain_steps": 60, "finetune_steps": 40, "per_class": 5, "seeds": 1, "batch_size": 25,
         "pretrain_batch_size": 64, "learning_rate": 3e-3}


def write_parquet(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """One Parquet file with an `image` column of 8x8 uint8 lists and an int32 `label` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pa.FixedSizeListArray.from_arrays(pa.array(images.reshape(-1), pa.uint8()), 8)
    table = pa.table({"image": pa.FixedSizeListArray.from_arrays(rows, 8), "label": pa.array(labels, pa.int32())})
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def write_datasets(folder: Path, seed: int, per_class: int) -> dict[str, Path]:
    """Parquet files: pretrain (0-4) train/test, and the 5-9 labelled subset for `seed` and its test set."""
    folder.mkdir(parents=True, exist_ok=True)
    images, labels = load_digits()
    images = images[..., 0]
    first, second = labels < 5, labels >= 5
    pre_test, pre_train = per_class_split(labels[first], 30, seed=0)  # 30 per class held out
    ft_train, ft_test = per_class_split(labels[second] - 5, per_class, seed=seed)
    files = {}
    for name, imgs, labs in (("pretrain_train", images[first][pre_train], labels[first][pre_train]),
                             ("pretrain_test", images[first][pre_test], labels[first][pre_test]),
                             (f"finetune_train_seed{seed}", images[second][ft_train], labels[second][ft_train] - 5),
                             (f"finetune_test_seed{seed}", images[second][ft_test], labels[second][ft_test] - 5)):
        path = folder / f"{name}.parquet"
        files[name.removesuffix(f"_seed{seed}")] = path if path.exists() else write_parquet(path, imgs, labs)
    return files


def to_float(element):
    return element.update_data({"image": as_float_image(element.data["image"], 16.0)[..., None]})


def hf_pipeline(path: Path, cache: Path, batch_size: int, *, seed: int, train: bool) -> Pipeline:
    """A pipeline over one Parquet file read by `datasets` and `HFSource`."""
    from datarax.sources.hf import HFSource, HFSourceConfig, load_files

    dataset = load_files([path], cache_dir=str(cache))
    source = HFSource(HFSourceConfig(columns=("image", "label"), shuffle=train, seed=seed), dataset=dataset)
    return Pipeline(source, [ElementOperator(ElementOperatorConfig(), fn=to_float)],
                    batch_size=batch_size, drop_remainder=train)


def optimizer(steps: int, cfg: dict) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"], max(1, steps // 20), steps)
    return optax.adamw(schedule, weight_decay=1e-4)


def pretrain(workdir: Path, files: dict, cfg: dict, seed: int) -> tuple[Path, float]:
    """Trains on digits 0-4 (resumable) and exports the model with Orbax; returns its path and test accuracy."""
    cache = workdir / "hf_cache"
    train = hf_pipeline(files["pretrain_train"], cache, cfg["pretrain_batch_size"], seed=seed, train=True)
    test = hf_pipeline(files["pretrain_test"], cache, 256, seed=seed, train=False)
    model = ConvNet(1, 5, seed=seed)
    _, run = common.train_run(workdir / "runs" / "pretrain", model, optimizer(cfg["pretrain_steps"], cfg), train,
                              classification_loss, steps=cfg["pretrain_steps"], eval_pipeline=test,
                              metrics=CLASSIFICATION_METRICS, label="[pretrain 0-4] ",
                              log_every=max(1, cfg["pretrain_steps"] // 4))
    export = (workdir / "pretrained").absolute()
    if not export.exists():
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(export, nnx.state(model))
        checkpointer.wait_until_finished()
    print(f"[pretrain 0-4] test accuracy {run.eval_metrics['accuracy']:.4f}; saved with Orbax to {export}", flush=True)
    return export, run.eval_metrics["accuracy"]


def load_pretrained(export: Path, seed: int) -> ConvNet:
    """A ConvNet holding the pretrained state (restored with Orbax) and a freshly initialised head."""
    model = ConvNet(1, 5, seed=seed)
    state = nnx.state(model)
    restored = ocp.StandardCheckpointer().restore(export, state)
    nnx.update(model, restored)
    model.head = nnx.Linear(model.head.in_features, 5, rngs=nnx.Rngs(seed), **host_init(seed + 1))
    return model


def finetune(workdir: Path, export: Path, files: dict, cfg: dict, seed: int, start: str) -> tuple[float, dict]:
    """Trains on the 5-9 subset from the pretrained state or from scratch; returns test accuracy and the run."""
    cache = workdir / "hf_cache"
    train = hf_pipeline(files["finetune_train"], cache, cfg["batch_size"], seed=seed, train=True)
    test = hf_pipeline(files["finetune_test"], cache, 256, seed=seed, train=False)
    model = load_pretrained(export, seed) if start == "pretrained" else ConvNet(1, 5, seed=seed)
    steps = cfg["finetune_steps"]
    label = f"[{'fine-tune' if start == 'pretrained' else 'scratch'} 5-9 seed {seed}] "
    _, run = common.train_run(workdir / "runs" / f"{start}-seed{seed}", model, optimizer(steps, cfg), train,
                              classification_loss, steps=steps, eval_pipeline=test, metrics=CLASSIFICATION_METRICS,
                              label=label, log_every=max(1, steps // 2))
    print(f"{label}test accuracy {run.eval_metrics['accuracy']:.4f}", flush=True)
    return run.eval_metrics["accuracy"], run.as_dict()


def plot(workdir: Path, results: dict) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for start, color in (("pretrained", "#2b8a3e"), ("scratch", "#868e96")):
        for i, seed in enumerate(results["seeds"]):
            steps, acc = common.read_curve(workdir / "runs" / f"{start}-seed{seed}", "train/accuracy")
            ax.plot(steps, acc, color=color, alpha=0.8, label=f"{start} (train batch accuracy)" if i == 0 else None)
    ax.set(xlabel="fine-tuning step", ylabel="accuracy", ylim=(0, 1.02),
           title=f"digits 5-9: fine-tuned {results['pretrained']['mean']:.3f} vs scratch "
                 f"{results['scratch']['mean']:.3f} (test)")
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
    files = write_datasets(workdir / "data", seeds[0], cfg["per_class"])
    export, pre_accuracy = pretrain(workdir, files, cfg, args.seed)
    runs, accuracy = [], {"pretrained": [], "scratch": []}
    for seed in seeds:
        files = write_datasets(workdir / "data", seed, cfg["per_class"])
        for start in ("pretrained", "scratch"):
            acc, record = finetune(workdir, export, files, cfg, seed, start)
            accuracy[start].append(acc)
            runs.append({"start": start, "seed": seed, "test_accuracy": acc, "run": record})
    stats = {k: common.mean_std(v) for k, v in accuracy.items()}
    figure = plot(workdir, {**stats, "seeds": seeds})
    gain = stats["pretrained"]["mean"] - stats["scratch"]["mean"]
    metrics = {"pretrain_test_accuracy": pre_accuracy, "finetuned_accuracy_mean": stats["pretrained"]["mean"],
               "finetuned_accuracy_std": stats["pretrained"]["std"], "scratch_accuracy_mean": stats["scratch"]["mean"],
               "scratch_accuracy_std": stats["scratch"]["std"], "finetune_minus_scratch": gain,
               "chance_accuracy": 0.2}
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, "seeds": seeds}, "pretrained_export": str(export),
        "data_files": sorted(str(p) for p in (workdir / "data").glob("*.parquet")), "accuracy": stats, "runs": runs,
        "plot": figure}, args)
    print(f"\npretraining (digits 0-4): test accuracy {pre_accuracy:.4f}")
    for start, name in (("pretrained", "fine-tuned"), ("scratch", "from scratch")):
        s = stats[start]
        print(f"digits 5-9, {cfg['per_class']} labels per class, {cfg['finetune_steps']} steps, {name}: "
              f"{s['mean']:.4f} +- {s['std']:.4f} over {s['n']} seeds")
    print(f"fine-tuning {'beats' if gain > 0 else 'does not beat'} training from scratch by {gain:+.4f}")
    print(f"result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
