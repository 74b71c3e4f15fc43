"""Vision: a small CNN on scikit-learn's handwritten digits, trained through an augmentation pipeline.

    python -m recipes.vision [--workdir DIR] [--quick] [--seed N] [--steps N]

The pipeline (a device-resident `MemorySource`, shuffled) converts the 8x8 digits to floats,
applies a random affine warp (rotation, shift, zoom, shear) and, to half the records, Gaussian
noise, all in one compiled program per batch. `datarax.train.Trainer` runs the jitted train step
with an Orbax checkpoint (model + optimizer + iterator) and a goodput monitor. The recipe
prints and records the test accuracy, the training throughput, the pipeline's own throughput and
the goodput summary; rerunning with the same --workdir resumes from the latest checkpoint.
"""

from __future__ import annotations

import sys
import time

import jax
import numpy as np
import optax
from flax import nnx

from datarax import Pipeline
from datarax.operators import ElementOperator, ElementOperatorConfig
from datarax.operators.image import AffineConfig, AffineOperator, GaussianNoiseConfig, GaussianNoiseOperator
from datarax.operators.strategies import ProbabilisticOperator, ProbabilisticOperatorConfig
from datarax.sources import MemorySource, MemorySourceConfig
from recipes import common
from recipes.data import fraction_split, load_digits
from recipes.models import CLASSIFICATION_METRICS, ConvNet, as_float_image, classification_loss, count_params

NAME = "vision"
NUM_CLASSES = 10
DEFAULT = {"steps": 1200, "batch_size": 64, "learning_rate": 2e-3}
QUICK = {"steps": 150, "batch_size": 64, "learning_rate": 3e-3}


def to_float(element):
    return element.update_data({"image": as_float_image(element.data["image"], 16.0)})


def augmentation_stages(seed: int) -> list:
    """uint8 -> float, then a random affine warp, then noise on half of the records."""
    rngs = nnx.Rngs(augment=seed)
    return [
        ElementOperator(ElementOperatorConfig(), fn=to_float),
        AffineOperator(AffineConfig(degrees=12.0, translate=0.1, scale=0.1, shear=8.0), rngs=rngs),
        ProbabilisticOperator(ProbabilisticOperatorConfig(probability=0.5),
                              operator=GaussianNoiseOperator(GaussianNoiseConfig(sigma=0.05), rngs=rngs), rngs=rngs),
    ]


def build_pipelines(seed: int, batch_size: int) -> tuple[Pipeline, Pipeline, dict]:
    images, labels = load_digits()
    train_idx, test_idx = fraction_split(len(labels), 0.2, seed=1234)
    train = MemorySource(MemorySourceConfig(shuffle=True, seed=seed),
                         data={"image": images[train_idx], "label": labels[train_idx]})
    test = MemorySource(MemorySourceConfig(), data={"image": images[test_idx], "label": labels[test_idx]})
    train_pipeline = Pipeline(train, augmentation_stages(seed), batch_size=batch_size, drop_remainder=True)
    eval_pipeline = Pipeline(test, [ElementOperator(ElementOperatorConfig(), fn=to_float)], batch_size=256)
    return train_pipeline, eval_pipeline, {"train_records": len(train_idx), "test_records": len(test_idx)}


def pipeline_throughput(pipeline: Pipeline, epochs: int) -> float:
    """Elements per second the training pipeline alone delivers (after one warm-up batch)."""
    iterator = pipeline.epochs(epochs)
    jax.block_until_ready(next(iterator))
    count, began = 0, time.perf_counter()
    for batch in iterator:
        count += batch["label"].shape[0]
    jax.block_until_ready(batch)
    return count / (time.perf_counter() - began)


def plot(workdir, examples: dict, curve: tuple, accuracy: float) -> str | None:
    plt = common.pyplot()
    if plt is None:
        return None
    fig = plt.figure(figsize=(10, 4))
    ax = fig.add_subplot(1, 2, 1)
    ax.plot(*curve, color="#1c7ed6")
    ax.set(xlabel="step", ylabel="train loss", yscale="log", title=f"digits CNN: test accuracy {accuracy:.3f}")
    grid = examples["image"][:32, :, :, 0].reshape(4, 8, 8, 8).transpose(0, 2, 1, 3).reshape(32, 64)
    ax = fig.add_subplot(1, 2, 2)
    ax.imshow(grid, cmap="gray_r")
    ax.set(title="augmented training batch (labels: " + "".join(map(str, examples["label"][:8])) + "...)")
    ax.axis("off")
    return common.save_figure(fig, workdir / "vision.png")


def main(argv: list[str] | None = None) -> int:
    args = common.parse_args(NAME, __doc__.split("\n\n")[0], argv)
    workdir = common.prepare_workdir(args)
    cfg = dict(QUICK if args.quick else DEFAULT)
    cfg["steps"] = args.steps or cfg["steps"]
    train_pipeline, eval_pipeline, sizes = build_pipelines(args.seed, cfg["batch_size"])
    model = ConvNet(1, NUM_CLASSES, seed=args.seed)
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg["learning_rate"], max(1, cfg["steps"] // 20), cfg["steps"])
    print(f"digits: {sizes['train_records']} train / {sizes['test_records']} test images; ConvNet with "
          f"{count_params(model):,} parameters; {cfg['steps']} steps of batch {cfg['batch_size']}", flush=True)
    _, run = common.train_run(workdir, model, optax.adamw(schedule, weight_decay=1e-4), train_pipeline,
                              classification_loss, steps=cfg["steps"], eval_pipeline=eval_pipeline,
                              metrics=CLASSIFICATION_METRICS)
    delivered = pipeline_throughput(train_pipeline, 2 if args.quick else 5)
    accuracy = run.eval_metrics["accuracy"]
    examples = jax.device_get(next(iter(train_pipeline)))
    figure = plot(workdir, examples, common.read_curve(workdir, "train/loss"), accuracy)
    metrics = {"test_accuracy": accuracy, "test_loss": run.eval_metrics["loss"],
               "chance_accuracy": 1.0 / NUM_CLASSES, "train_el_per_s": run.goodput.get("steady_el_per_s"),
               "pipeline_el_per_s": delivered}
    if metrics["train_el_per_s"] is None:  # a restored, finished run trained no steps in this invocation
        metrics.pop("train_el_per_s")
    path = common.write_result(workdir, NAME, metrics, {
        "config": {**cfg, **sizes, "params": count_params(model)}, "run": run.as_dict(), "plot": figure,
        "goodput_plot": str(workdir / "goodput.png") if common.plotting_available() else None}, args)
    rate = metrics.get("train_el_per_s")
    print(f"\ntest accuracy {accuracy:.4f} (chance {1 / NUM_CLASSES:.2f}) after {run.step} steps")
    print(f"throughput: training {rate:,.0f} el/s (steady state, step + pipeline); pipeline alone "
          f"{delivered:,.0f} el/s" if rate else f"throughput: pipeline alone {delivered:,.0f} el/s")
    print(common.describe_goodput(run.goodput))
    print(f"result: {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
