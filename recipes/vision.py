"""Vision: a small CNN on scikit-learn's handwritten digits, trained through an augmentation pipeline.

    python -m recipes.vision [--workdir DIR] [--quick] [--seed N] [--steps N] [--image-folder DIR]

The pipeline (a device-resident `MemorySource`, shuffled) converts the 8x8 digits to floats,
applies a random affine warp (rotation, shift, zoom, shear) and, to half the records, Gaussian
noise, all in one compiled program per batch. `datarax.train.Trainer` runs the jitted train step
with an Orbax checkpoint (model + optimizer + iterator) and a goodput monitor. The recipe
prints and records the test accuracy, the training throughput, the pipeline's own throughput and
the goodput summary; rerunning with the same --workdir resumes from the latest checkpoint.

Whether the augmentation helps is measured, not assumed: every seed (5 by default; a seed
changes the initialisation, the shuffle and the augmentation draws, not the fixed 80/20 split)
trains the same network twice, with the augmentation and without it (uint8 -> float only), for
the same steps at the same fixed learning rate (not tuned on the test split: it is the only split
the digits recipe has). The table gives both arms per seed, their means with 95% t-intervals and
the paired per-seed difference.

On an accelerator the trainer runs 60 steps per jitted call (`--steps-per-execution`, 25 with
--quick): 60 divides the 1,200 steps and the log interval (120), so every log lands on its step;
each call gathers, augments and trains on its 60 batches in one program (the source is
device-resident: `datarax.train.loop.fused.FusedSteps`), and checkpoints come every minute of
training and at the end (`recipes.common.ACCELERATOR_CHECKPOINT_SECS`: at 0.07 ms a step on a
TPU v5e a quarter of the run is shorter than one checkpoint write). Each step is the one a call of one step
runs, on the same batch: the accuracy table means what it meant with one step per call. On the
CPU it stays 1: XLA's CPU backend runs this CNN ~14x slower inside the loop that holds the steps
(`datarax.train.loop.step.scan_steps`).

`--image-folder DIR` trains on image files instead: `DIR/train/<class>/<image>` and
`DIR/test/<class>/<image>` (or `DIR/val/...`), read by `ImageFolderSource` and decoded on the host
by `DecodeImage` to `--image-size` RGB (training: a random-resized crop of each image, then the
same affine warp and noise; testing: the centre crop), with a CNN sized for them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax
from flax import nnx

from datarax import Pipeline
from datarax.checkpoint import run_script
from datarax.host import DecodeImage
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.operators.image import AffineConfig, AffineOperator, GaussianNoiseConfig, GaussianNoiseOperator
from datarax.operators.strategies import ProbabilisticOperator, ProbabilisticOperatorConfig
from datarax.sources import ImageFolderSource, MemorySource, MemorySourceConfig
from recipes import common
from recipes.data import fraction_split, load_digits
from recipes.models import CLASSIFICATION_METRICS, ConvNet, as_float_image, classification_loss, count_params

NAME = "vision"
NUM_CLASSES = 10
DEFAULT = {"steps": 1200, "batch_size": 64, "learning_rate": 2e-3, "seeds": 5, "steps_per_execution": 300}
QUICK = {"steps": 150, "batch_size": 64, "learning_rate": 3e-3, "seeds": 2, "steps_per_execution": 25}
ARMS = ("augmented", "no augmentation")
IMAGE_SIZE = 24  # --image-folder's default decoded size: small enough for a CPU
FOLDER_WIDTHS = (32, 32, 64, 64)  # two strided convolutions: the flattened features stay small
FOLDER_CROP_SCALE = (0.5, 1.0)  # RandomResizedCrop's area range; the affine warp adds more


def to_float(element):
    return element.update_data({"image": as_float_image(element.data["image"], 16.0)})


def bytes_to_float(element):
    return element.update_data({"image": as_float_image(element.data["image"], 255.0)})


def augmentation_stages(seed: int, convert=to_float) -> list:
    """uint8 -> float (`convert`), then a random affine warp, then noise on half of the records."""
    rngs = nnx.Rngs(augment=seed)
    return [
        ElementOperator(ElementOperatorConfig(), fn=convert),
        AffineOperator(AffineConfig(degrees=12.0, translate=0.1, scale=0.1, shear=8.0), rngs=rngs),
        ProbabilisticOperator(ProbabilisticOperatorConfig(probability=0.5),
                              operator=GaussianNoiseOperator(GaussianNoiseConfig(sigma=0.05), rngs=rngs), rngs=rngs),
    ]


def build_pipelines(seed: int, batch_size: int, augment: bool = True) -> tuple[Pipeline, Pipeline, dict]:
    images, labels = load_digits()
    train_idx, test_idx = fraction_split(len(labels), 0.2, seed=1234)
    train = MemorySource(MemorySourceConfig(shuffle=True, seed=seed),
                         data={"image": images[train_idx], "label": labels[train_idx]})
    test = MemorySource(MemorySourceConfig(), data={"image": images[test_idx], "label": labels[test_idx]})
    stages = augmentation_stages(seed) if augment else [ElementOperator(ElementOperatorConfig(), fn=to_float)]
    train_pipeline = Pipeline(train, stages, batch_size=batch_size, drop_remainder=True)
    eval_pipeline = Pipeline(test, [ElementOperator(ElementOperatorConfig(), fn=to_float)], batch_size=256)
    return train_pipeline, eval_pipeline, {"train_records": len(train_idx), "test_records": len(test_idx)}


def folder_splits(root: str) -> tuple[Path, Path]:
    """`(DIR/train, DIR/test or DIR/val)` of an --image-folder."""
    train = Path(root) / "train"
    test = next((Path(root) / name for name in ("test", "val") if (Path(root) / name).is_dir()), None)
    if not train.is_dir() or test is None:
        raise SystemExit(f"--image-folder {root}: expected {train} and {Path(root) / 'test'} (or val), each with one "
                         "sub-folder of images per class; split the images into those two folders")
    return train, test


def build_folder_pipelines(root: str, seed: int, batch_size: int, size: int,
                           augment: bool = True) -> tuple[Pipeline, Pipeline, dict]:
    """Pipelines over an image folder: `ImageFolderSource` records decoded by `DecodeImage` on the host
    (without `augment`: the centre crop and the float conversion only, as for testing)."""
    train_dir, test_dir = folder_splits(root)
    train = ImageFolderSource(root=train_dir, shuffle=True, seed=seed)
    test = ImageFolderSource(root=test_dir)
    if test.class_names != train.class_names:
        raise SystemExit(f"--image-folder {root}: the class folders differ between {train_dir} "
                         f"{list(train.class_names)} and {test_dir} {list(test.class_names)}; give both the same "
                         "classes")
    if augment:
        stages = [DecodeImage(size=size, crop="random_resized", scale=FOLDER_CROP_SCALE, seed=seed),
                  *augmentation_stages(seed, bytes_to_float)]
    else:
        stages = [DecodeImage(size=size), ElementOperator(ElementOperatorConfig(), fn=bytes_to_float)]
    train_pipeline = Pipeline(train, stages, batch_size=batch_size, drop_remainder=True)
    eval_stages = [DecodeImage(size=size), ElementOperator(ElementOperatorConfig(), fn=bytes_to_float)]
    eval_pipeline = Pipeline(test, eval_stages, batch_size=256)
    return train_pipeline, eval_pipeline, {"train_records": len(train), "test_records": len(test),
                                           "classes": list(train.class_names), "image_size": size}


def pipeline_throughput(pipeline: Pipeline, epochs: int) -> float:
    """Elements per second the training pipeline alone delivers (after one warm-up batch)."""
    iterator = pipeline.epochs(epochs)
    jax.block_until_ready(next(iterator))
    count, began = 0, time.perf_counter()
    for batch in iterator:
        count += batch["label"].shape[0]
    jax.block_until_ready(batch)
    return count / (time.perf_counter() - began)


def plot(workdir, examples: dict, curve: tuple, accuracy: float, data: str = "digits") -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    fig = plt.figure(figsize=(10, 4))
    ax = fig.add_subplot(1, 2, 1)
    ax.plot(*curve, color="#1c7ed6")
    ax.set(xlabel="step", ylabel="train loss", yscale="log", title=f"{data} CNN: test accuracy {accuracy:.3f}")
    _, h, w, c = examples["image"].shape
    grid = examples["image"][:32].reshape(4, 8, h, w, c).transpose(0, 2, 1, 3, 4).reshape(4 * h, 8 * w, c)
    ax = fig.add_subplot(1, 2, 2)
    if c == 1:
        ax.imshow(grid[..., 0], cmap="gray_r")
    else:
        ax.imshow(np.clip(grid, 0.0, 1.0))
    ax.set(title="augmented training batch (labels: " + "".join(map(str, examples["label"][:8])) + "...)")
    ax.axis("off")
    return common.save_figure(fig, workdir / "vision.png")


def add_options(parser) -> None:
    parser.add_argument("--image-folder", metavar="DIR", default=None,
                        help="train on DIR/train/<class>/<image> and test on DIR/test (or DIR/val) instead of the "
                             "digits, read by ImageFolderSource and decoded by DecodeImage")
    parser.add_argument("--image-size", type=int, default=IMAGE_SIZE,
                        help=f"with --image-folder: the decoded image size (default {IMAGE_SIZE})")
    parser.add_argument("--steps-per-execution", type=int, default=None, metavar="K",
                        help="optimizer steps per jitted call (default: 60 on an accelerator, 25 with --quick; "
                             "1 on the CPU)")
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"seeds, each trained with and without the augmentation (default {DEFAULT['seeds']}, "
                             f"{QUICK['seeds']} with --quick)")


def train_arm(args, cfg: dict, workdir: Path, seed: int, arm: str):
    """One arm (augmented or not) for one seed: (pipelines, model, sizes, run outcome)."""
    augment = arm == "augmented"
    if args.image_folder is None:
        train_pipeline, eval_pipeline, sizes = build_pipelines(seed, cfg["batch_size"], augment)
        model = ConvNet(1, NUM_CLASSES, seed=seed)
    else:
        train_pipeline, eval_pipeline, sizes = build_folder_pipelines(args.image_folder, seed, cfg["batch_size"],
                                                                      args.image_size, augment)
        model = ConvNet(3, len(sizes["classes"]), widths=FOLDER_WIDTHS, image_size=(args.image_size,) * 2, seed=seed)
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"], max(1, cfg["steps"] // 20), cfg["steps"])
    run_dir = workdir / f"seed{seed}-{arm.replace(' ', '-')}"
    _, run = common.train_run(run_dir, model, optax.adamw(schedule, weight_decay=1e-4), train_pipeline,
                              classification_loss, steps=cfg["steps"], eval_pipeline=eval_pipeline,
                              metrics=CLASSIFICATION_METRICS, label=f"[seed {seed} {arm}] ",
                              steps_per_execution=cfg["steps_per_execution"])
    return train_pipeline, model, sizes, run, run_dir


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv, extra=add_options)
    workdir = common.prepare_workdir(args)
    cfg = dict(QUICK if args.quick else DEFAULT)
    cfg["steps"] = args.steps or cfg["steps"]
    if args.seeds is not None and args.seeds < 1:
        raise SystemExit(f"--seeds must be >= 1, got {args.seeds}")
    cfg["seeds"] = args.seeds or cfg["seeds"]
    if args.steps_per_execution is not None and args.steps_per_execution < 1:
        raise SystemExit(f"--steps-per-execution must be >= 1, got {args.steps_per_execution}")
    # The CPU backend compiles the CNN's convolutions inside the steps' loop with a slow emitter.
    cfg["steps_per_execution"] = args.steps_per_execution or (
        1 if jax.default_backend() == "cpu" else cfg["steps_per_execution"])
    seeds = list(range(args.seed, args.seed + cfg["seeds"]))
    runs: dict[str, dict[int, dict]] = {arm: {} for arm in ARMS}
    first = None
    for seed in seeds:
        for arm in ARMS:
            pipeline, model, sizes, run, run_dir = train_arm(args, cfg, workdir, seed, arm)
            if first is None:
                first = (pipeline, model, sizes, run, run_dir)
                data = "digits" if args.image_folder is None else Path(args.image_folder).name
                print(f"{data}: {sizes['train_records']} train / {sizes['test_records']} test images; ConvNet with "
                      f"{count_params(model):,} parameters; {cfg['steps']} steps of batch {cfg['batch_size']}; "
                      f"seeds {seeds}, each with and without the augmentation", flush=True)
            runs[arm][seed] = {"accuracy": run.eval_metrics["accuracy"], "loss": run.eval_metrics["loss"],
                               "step": run.step, "seconds": run.seconds}
    train_pipeline, model, sizes, run, run_dir = first
    num_classes = NUM_CLASSES if args.image_folder is None else len(sizes["classes"])
    data = "digits" if args.image_folder is None else Path(args.image_folder).name
    delivered = pipeline_throughput(train_pipeline, 2 if args.quick else 5)
    accuracy = run.eval_metrics["accuracy"]
    examples = jax.device_get(next(iter(train_pipeline)))
    figure = plot(workdir, examples, common.read_curve(run_dir, "train/loss"), accuracy, data)
    accuracies = {arm: [runs[arm][s]["accuracy"] for s in seeds] for arm in ARMS}
    table = {arm: common.interval(values) for arm, values in accuracies.items()}
    difference = common.paired(accuracies["augmented"], accuracies["no augmentation"])
    metrics = {"test_accuracy": accuracy, "test_loss": run.eval_metrics["loss"],
               "chance_accuracy": 1.0 / num_classes, "train_el_per_s": run.goodput.get("steady_el_per_s"),
               "pipeline_el_per_s": delivered, "test_accuracy_augmented_mean": table["augmented"]["mean"],
               "test_accuracy_no_augmentation_mean": table["no augmentation"]["mean"],
               "augmented_minus_no_augmentation": difference["mean"]}
    if metrics["train_el_per_s"] is None:  # a restored, finished run trained no steps in this invocation
        metrics.pop("train_el_per_s")
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, **sizes, "params": count_params(model), "image_folder": args.image_folder, "seeds": seeds},
        "run": run.as_dict(), "runs": {arm: {str(s): r for s, r in v.items()} for arm, v in runs.items()},
        "table": table, "paired": difference, "plot": figure,
        "goodput_plot": str(run_dir / "goodput.png") if (run_dir / "goodput.png").is_file() else None}, args)
    rate = metrics.get("train_el_per_s")
    print(f"\ntest accuracy ({sizes['test_records']} test images, chance {1 / num_classes:.2f}) after {run.step} "
          f"steps, {len(seeds)} seeds:")
    print(f"    {'':>16} " + " ".join(f"{'seed ' + str(s):>8}" for s in seeds) + "   mean +- 95% interval")
    for arm in ARMS:
        print(f"    {arm:>16} " + " ".join(f"{v:8.4f}" for v in accuracies[arm])
              + f"   {common.describe_interval(table[arm], 4)}")
    print(f"    augmented - none: {common.describe_interval(difference, 4)} ({difference['positive']} of {len(seeds)} "
          f"seeds higher, {difference['negative']} lower)")
    print(f"throughput (seed {seeds[0]}, augmented): training {rate:,.0f} el/s (steady state, step + pipeline); "
          f"pipeline alone {delivered:,.0f} el/s" if rate else f"throughput: pipeline alone {delivered:,.0f} el/s")
    print(common.describe_goodput(run.goodput))
    print(f"result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
