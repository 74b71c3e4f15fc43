"""HF fine-tuning: pretrain on patches of some photographs, save with Orbax, fine-tune on others from few labels.

    python -m recipes.hf_finetune [--workdir DIR] [--quick] [--seed N] [--steps N]

The data are real photographs that ship with scikit-image and scikit-learn (nothing is
downloaded; `HF_DATASETS_OFFLINE=1`). The recipe crops square patches of a few sizes from each
photograph, stores them as JPEG bytes in local Parquet files with a HuggingFace `datasets.Image()`
feature, and reads them back with `datasets` through datarax's `HFSource` with
`encoded=("image",)`: the pipeline carries the JPEG bytes and `DecodeImage` decodes them on the
host to small RGB images (a random-resized crop when training, the whole patch when testing). A
patch's label is the photograph it comes from. Each photograph is cut into a grid of cells, a
fixed quarter of which give the test patches and the rest the training patches, so no test
pixel is seen in training.

A CNN is pretrained on plenty of labelled patches of six colour photographs, its state saved
with Orbax (`StandardCheckpointer`, `DIR/pretrained`). Each task then trains on a few labelled
patches of other photographs: the fine-tuned model starts from the pretrained convolutions and
hidden layer with a fresh head, the scratch model from a fresh initialisation; both train for
the same number of steps on the same batches, over several seeds (each a different labelled
subset), and the per-seed paired differences (fine-tuned - scratch) decide whether fine-tuning
measurably helps: only when every seed finds a difference of the same sign (`verdict`).

* photos: scikit-learn's china and flower, scikit-image's camera and coins (4 classes);
* textures (default configuration only): scikit-image's brick, grass and gravel (3 classes).
"""

from __future__ import annotations

import functools
import io
import os
import sys
import zlib
from pathlib import Path

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from datarax import Pipeline
from datarax.host import DecodeImage
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.train.locking import run_script
from recipes import common
from recipes.data import SAMPLE_IMAGES, load_photograph, per_class_split
from recipes.models import CLASSIFICATION_METRICS, ConvNet, as_float_image, classification_loss, host_init

NAME = "hf_finetune"
DEFAULT = {"pretrain_steps": 600, "finetune_steps": 300, "seeds": 3, "batch_size": 20, "pretrain_batch_size": 64,
           "learning_rate": 2e-3, "backbone_lr_factor": 0.1, "tasks": ("photos", "textures")}
QUICK = {"pretrain_steps": 80, "finetune_steps": 40, "seeds": 1, "batch_size": 20, "pretrain_batch_size": 64,
         "learning_rate": 3e-3, "backbone_lr_factor": 0.1, "tasks": ("photos",)}
PRETRAIN_PHOTOS = SAMPLE_IMAGES  # astronaut, chelsea, coffee, rocket, immunohistochemistry, hubble_deep_field
TASKS = {"photos": ("sklearn:china", "sklearn:flower", "camera", "coins"), "textures": ("brick", "grass", "gravel")}
PER_CLASS = 8  # labelled fine-tuning patches per class
CELL = 64  # the grid cell a patch lies in; cells are either training or test cells
PATCH_SIZES = (32, 48, 64)
TEST_CELLS = 0.25
PATCHES = {"pretrain": {"train": 200, "test": 50}, "task": {"train": 100, "test": 100}}  # per photograph
JPEG_QUALITY = 90
SIZE = 24  # DecodeImage's output, the network's input
WIDTHS = (32, 32, 64, 64)
RANDOM_CROP_SCALE = (0.25, 1.0)
# Accuracies are float32 means over batches: two equal counts of correct patches can differ by
# ~1e-8 (359/400 came out as 0.8975 and 0.89749999), far below one patch (1/400 = 0.0025).
TIE = 1e-6


def record_name(photo: str) -> str:
    return photo.split(":")[-1]


def cut_patches(photo: str, split: str, count: int, seed: int = 0) -> list[tuple[bytes, str]]:
    """`count` JPEG-encoded square patches of `photo` from its training or test cells, with file names.

    The cells (CELL x CELL, the grid over the photograph) are split once, with a fixed seed; a
    patch lies inside one cell of the split, at a random place, with a size from PATCH_SIZES.
    """
    from PIL import Image

    image = load_photograph(photo)
    rows, cols = image.shape[0] // CELL, image.shape[1] // CELL
    order = np.random.default_rng(1234).permutation(rows * cols)
    cut = max(1, int(round(TEST_CELLS * rows * cols)))
    cells = np.sort(order[:cut] if split == "test" else order[cut:])
    rng = np.random.default_rng([seed, zlib.crc32(photo.encode()), split == "test"])
    patches = []
    for i in range(count):
        cell = int(rng.choice(cells))
        size = int(rng.choice(PATCH_SIZES))
        y = (cell // cols) * CELL + int(rng.integers(0, CELL - size + 1))
        x = (cell % cols) * CELL + int(rng.integers(0, CELL - size + 1))
        buffer = io.BytesIO()
        Image.fromarray(image[y:y + size, x:x + size]).save(buffer, format="JPEG", quality=JPEG_QUALITY)
        patches.append((buffer.getvalue(), f"{record_name(photo)}-{split}{i}-y{y}-x{x}-s{size}.jpg"))
    return patches


@functools.lru_cache(maxsize=None)
def patch_set(photos: tuple[str, ...], split: str, per_photo: int) -> tuple[list[tuple[bytes, str]], np.ndarray]:
    """Patches of every photograph (label = its position in `photos`) and their int32 labels."""
    records, labels = [], []
    for label, photo in enumerate(photos):
        records += cut_patches(photo, split, per_photo)
        labels += [label] * per_photo
    return records, np.asarray(labels, np.int32)


def write_parquet(path: Path, records: list[tuple[bytes, str]], labels: np.ndarray) -> Path:
    """One Parquet file with an HF `Image` column `image` (JPEG bytes and a file name) and an int32 `label`."""
    import datasets

    if path.exists():
        return path
    datasets.disable_progress_bars()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int32")})
    table = datasets.Dataset.from_dict(
        {"image": [{"bytes": data, "path": name} for data, name in records], "label": labels.tolist()},
        features=features)
    tmp = path.with_suffix(".tmp")
    table.to_parquet(str(tmp))
    os.replace(tmp, path)
    return path


def write_pretraining(folder: Path) -> dict[str, Path]:
    """Parquet files of the pretraining photographs: train and test patches."""
    folder.mkdir(parents=True, exist_ok=True)
    return {split: write_parquet(folder / f"pretrain-{split}.parquet",
                                 *patch_set(PRETRAIN_PHOTOS, split, PATCHES["pretrain"][split]))
            for split in ("train", "test")}


def write_task(folder: Path, task: str, seed: int) -> dict[str, Path]:
    """Parquet files of a task: `PER_CLASS` labelled training patches per class chosen by `seed`, all test patches."""
    folder.mkdir(parents=True, exist_ok=True)
    records, labels = patch_set(TASKS[task], "train", PATCHES["task"]["train"])
    chosen, _ = per_class_split(labels, PER_CLASS, seed=seed)
    return {"train": write_parquet(folder / f"{task}-train-seed{seed}.parquet",
                                   [records[i] for i in chosen], labels[chosen]),
            "test": write_parquet(folder / f"{task}-test.parquet", *patch_set(TASKS[task], "test",
                                                                                PATCHES["task"]["test"]))}


def to_float(element):
    return element.update_data({"image": as_float_image(element.data["image"], 255.0)})


def hf_pipeline(path: Path, cache: Path, batch_size: int, *, seed: int, train: bool) -> Pipeline:
    """A pipeline over one Parquet file read by `datasets` and `HFSource`, its JPEGs decoded by `DecodeImage`."""
    import datasets

    from datarax.sources.hf import HFSource, HFSourceConfig, load_files

    datasets.disable_progress_bars()  # one bar per small file only clutters the recipe's output
    dataset = load_files([path], cache_dir=str(cache))
    source = HFSource(HFSourceConfig(fields=("label",), encoded=("image",), shuffle=train, seed=seed),
                      dataset=dataset)
    # Training sees a random-resized crop of each patch (a new one each epoch); testing, the whole patch.
    decode = (DecodeImage(size=SIZE, crop="random_resized", scale=RANDOM_CROP_SCALE, seed=seed) if train
              else DecodeImage(size=SIZE))
    return Pipeline(source, [decode, ElementOperator(ElementOperatorConfig(), fn=to_float)],
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


def new_model(classes: int, seed: int) -> ConvNet:
    return ConvNet(3, classes, widths=WIDTHS, image_size=(SIZE, SIZE), seed=seed)


def run_training(workdir: Path, run: str, model: ConvNet, tx: optax.GradientTransformation, files: dict,
                 batch_size: int, steps: int, seed: int, label: str) -> common.RunOutcome:
    """Trains on `files["train"]`, evaluates on `files["test"]`, then stops the pipelines' decode threads."""
    cache = workdir / "hf_cache"
    train = hf_pipeline(files["train"], cache, batch_size, seed=seed, train=True)
    test = hf_pipeline(files["test"], cache, 256, seed=seed, train=False)
    try:
        _, outcome = common.train_run(workdir / "runs" / run, model, tx, train, classification_loss, steps=steps,
                                      eval_pipeline=test, metrics=CLASSIFICATION_METRICS, label=label,
                                      log_every=max(1, steps // 4))
    finally:
        train.source.close()
        test.source.close()
    return outcome


def pretrain(workdir: Path, cfg: dict, seed: int) -> tuple[Path, float]:
    """Trains on the pretraining photographs (resumable), exports with Orbax; returns (path, test accuracy)."""
    files = write_pretraining(workdir / "data")
    model = new_model(len(PRETRAIN_PHOTOS), seed)
    run = run_training(workdir, "pretrain", model, optimizer(cfg["pretrain_steps"], cfg), files,
                       cfg["pretrain_batch_size"], cfg["pretrain_steps"], seed, "[pretrain] ")
    export = (workdir / "pretrained").absolute()
    if not export.exists():
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(export, nnx.state(model))
        checkpointer.wait_until_finished()
    print(f"[pretrain] test accuracy {run.eval_metrics['accuracy']:.4f}; saved with Orbax to {export}", flush=True)
    return export, run.eval_metrics["accuracy"]


def load_pretrained(export: Path, classes: int, seed: int) -> ConvNet:
    """A ConvNet holding the pretrained state (restored with Orbax) and a fresh head for `classes`."""
    model = new_model(len(PRETRAIN_PHOTOS), seed)
    nnx.update(model, ocp.StandardCheckpointer().restore(export, nnx.state(model)))
    model.head = nnx.Linear(model.head.in_features, classes, rngs=nnx.Rngs(seed), **host_init(seed + 1))
    return model


def finetune(workdir: Path, task: str, export: Path, files: dict, cfg: dict, seed: int,
             start: str) -> tuple[float, dict]:
    """Trains a task from the pretrained state or from scratch; returns test accuracy and the run."""
    classes = len(TASKS[task])
    model = load_pretrained(export, classes, seed) if start == "pretrained" else new_model(classes, seed)
    steps = cfg["finetune_steps"]
    label = f"[{task} {'fine-tune' if start == 'pretrained' else 'scratch'} seed {seed}] "
    run = run_training(workdir, f"{task}-{start}-seed{seed}", model,
                       optimizer(steps, cfg, fine_tune=start == "pretrained"), files, cfg["batch_size"], steps,
                       seed, label)
    print(f"{label}test accuracy {run.eval_metrics['accuracy']:.4f}", flush=True)
    return run.eval_metrics["accuracy"], run.as_dict()


def verdict(differences: list[float]) -> str:
    """Whether fine-tuning measurably beats scratch, judged on the spread of the per-seed paired differences.

    The spread is their range, lowest to highest: a difference counts only when every seed finds
    it with the same sign (a seed with no difference, |d| <= TIE, covers zero). With the few seeds a
    recipe can afford, mean +- one std is a thinner test: it called -0.025, 0.0, -0.045 a win
    for scratch although one seed saw no difference at all.
    """
    stats = common.mean_std(differences)
    if stats["n"] < 2:
        return "one seed: no spread to judge a difference by"
    spread = f"per-seed differences {signed(stats['min'])} to {signed(stats['max'])}"
    if stats["min"] <= TIE and stats["max"] >= -TIE:
        return f"no measurable difference ({spread} cover zero)"
    winner = ("fine-tuning beats training from scratch" if stats["mean"] > 0
              else "training from scratch beats fine-tuning")
    return f"{winner} on every seed ({spread})"


def run_task(workdir: Path, task: str, export: Path, cfg: dict, seeds: list[int]) -> dict:
    runs, per_seed = [], []
    for seed in seeds:
        files = write_task(workdir / "data", task, seed)
        accuracy = {}
        for start in ("pretrained", "scratch"):
            accuracy[start], record = finetune(workdir, task, export, files, cfg, seed, start)
            runs.append({"start": start, "seed": seed, "test_accuracy": accuracy[start], "run": record})
        per_seed.append({"seed": seed, "fine_tuned": accuracy["pretrained"], "scratch": accuracy["scratch"],
                         "difference": accuracy["pretrained"] - accuracy["scratch"]})
    differences = [row["difference"] for row in per_seed]
    return {"classes": [record_name(p) for p in TASKS[task]], "chance_accuracy": 1.0 / len(TASKS[task]),
            "per_seed": per_seed, "runs": runs, "verdict": verdict(differences),
            "accuracy": {"pretrained": common.mean_std([row["fine_tuned"] for row in per_seed]),
                         "scratch": common.mean_std([row["scratch"] for row in per_seed]),
                         "difference": common.mean_std(differences)}}


def plot(workdir: Path, results: dict, seeds: list[int]) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (task, result) in zip(axes[0], results.items()):
        for start, color in (("pretrained", "#2b8a3e"), ("scratch", "#868e96")):
            for i, seed in enumerate(seeds):
                steps, loss = common.read_curve(workdir / "runs" / f"{task}-{start}-seed{seed}", "train/loss")
                ax.plot(steps, loss, color=color, alpha=0.8, label=f"{start} (train loss)" if i == 0 else None)
        stats = result["accuracy"]
        ax.set(xlabel="fine-tuning step", ylabel="train loss", yscale="log",
               title=f"{task}: test accuracy fine-tuned {stats['pretrained']['mean']:.3f} vs scratch "
                     f"{stats['scratch']['mean']:.3f}")
        ax.legend()
    return common.save_figure(fig, workdir / "hf_finetune.png")


def signed(value: float) -> str:
    """`value` with four decimals and a sign, where a rounding residue such as -1e-17 shows as +0.0000."""
    text = f"{value:+.4f}"
    return "+0.0000" if text == "-0.0000" else text


def print_table(results: dict, pretrain_accuracy: float, cfg: dict) -> None:
    print(f"\npretraining ({len(PRETRAIN_PHOTOS)} photographs, {cfg['pretrain_steps']} steps): test accuracy "
          f"{pretrain_accuracy:.4f} (chance {1 / len(PRETRAIN_PHOTOS):.2f})")
    for task, result in results.items():
        print(f"{task}: {len(result['classes'])} classes ({', '.join(result['classes'])}), {PER_CLASS} labelled "
              f"patches per class, {cfg['finetune_steps']} steps (chance {result['chance_accuracy']:.2f})")
        print(f"    {'seed':>6} {'fine-tuned':>11} {'scratch':>9} {'difference':>11}")
        for row in result["per_seed"]:
            print(f"    {row['seed']:>6} {row['fine_tuned']:>11.4f} {row['scratch']:>9.4f} "
                  f"{signed(row['difference']):>11}")
        stats = result["accuracy"]
        print(f"    {'mean':>6} {stats['pretrained']['mean']:>11.4f} {stats['scratch']['mean']:>9.4f} "
              f"{signed(stats['difference']['mean']):>11}")
        print(f"    {'std':>6} {stats['pretrained']['std']:>11.4f} {stats['scratch']['std']:>9.4f} "
              f"{stats['difference']['std']:>11.4f}")
        print(f"    {'range':>6} {'':>11} {'':>9} {signed(stats['difference']['min'])}..{signed(stats['difference']['max'])}")
        print(f"    -> {result['verdict']}")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv)
    workdir = common.prepare_workdir(args)
    cfg = dict(QUICK if args.quick else DEFAULT)
    if args.steps:
        cfg["pretrain_steps"] = cfg["finetune_steps"] = args.steps
    seeds = [args.seed + i for i in range(cfg["seeds"])]
    export, pretrain_accuracy = pretrain(workdir, cfg, seeds[0])
    results = {task: run_task(workdir, task, export, cfg, seeds) for task in cfg["tasks"]}
    metrics = {"pretrain_test_accuracy": pretrain_accuracy, "pretrain_chance_accuracy": 1.0 / len(PRETRAIN_PHOTOS)}
    for task, result in results.items():
        stats = result["accuracy"]
        metrics.update({f"{task}_finetuned_accuracy_mean": stats["pretrained"]["mean"],
                        f"{task}_finetuned_accuracy_std": stats["pretrained"]["std"],
                        f"{task}_scratch_accuracy_mean": stats["scratch"]["mean"],
                        f"{task}_scratch_accuracy_std": stats["scratch"]["std"],
                        f"{task}_finetune_minus_scratch": stats["difference"]["mean"],
                        f"{task}_finetune_minus_scratch_std": stats["difference"]["std"],
                        f"{task}_finetune_minus_scratch_min": stats["difference"]["min"],
                        f"{task}_finetune_minus_scratch_max": stats["difference"]["max"],
                        f"{task}_chance_accuracy": result["chance_accuracy"]})
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, "seeds": seeds, "labels_per_class": PER_CLASS, "image_size": SIZE, "patch_sizes": PATCH_SIZES,
                   "pretrain_photographs": [record_name(p) for p in PRETRAIN_PHOTOS]},
        "pretrain": {"test_accuracy": pretrain_accuracy, "export": str(export)}, "tasks": results,
        "plot": plot(workdir, results, seeds),
        "data_files": sorted(str(p) for p in (workdir / "data").glob("*.parquet"))}, args)
    print_table(results, pretrain_accuracy, cfg)
    print(f"result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
